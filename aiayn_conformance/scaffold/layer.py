"""One encoder or decoder layer's template: which of its parameters is each canonical parameter of the layer, with
``{i}`` for the layer number, and which lines are uncertain. Attention modules are placed first (the components
holding [d, d], [2 d, d] or [3 d, d] weights), then the feed-forward network, then the [d] norms, each assigned to
its sub-layer; what no pass takes is left as built."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from aiayn_conformance.spec.schema import NORMS

from .naming import ATTENTION, CROSS, FFN, GAIN, PROJ, SELF, SHIFT, tokens
from .norms import Seen, Sublayer, norm_slots

Member = tuple[str, list[str], torch.Tensor]  # (full parameter name, its path inside the layer, the tensor)
Template = tuple[str | tuple[str, ...], str, str]  # (canonical name(s) with {i}, name inside the layer, CHECK note)
Noted = tuple[str, str]  # (name inside the layer, CHECK note or why)
Runner = Callable[[dict[int, Sublayer], list[str]], tuple[Seen, str]]  # runs the layer with hooks (norms.run_layer)
LABELS = {"self_attn": "the self-attention", "cross_attn": "the cross-attention", "ffn": "the feed-forward network"}


def layer_template(stack: str, members: list[Member], d: int, d_ff: int, ignored: str = "",
                   run: Runner | None = None) -> tuple[list[Template], list[Noted], list[Noted], list[Noted]]:
    """Template lines for one layer: (canonical with {i}, model name relative to the layer, check), the biases
    the paper lacks (zero), the gains it lacks (one) and the parameters left as built. ``ignored`` (when the model
    ignores the d_ff it was given, ``d_ff`` is the width it has): the FFN's lines get no target and that reason.
    ``run`` runs the layer with hooks, to tell its norms apart by their values."""
    rel = [(".".join(r), r, p) for _, r, p in members]
    shape = {name: tuple(p.shape) for name, _, p in rel}
    canon = f"{stack}.{{i}}"
    lines: list[Template] = []
    zero: list[Noted] = []
    one: list[Noted] = []
    done: set[str] = set()

    groups = _attention_groups(rel, d, d_ff)
    roles = _attention_roles(stack, list(groups))
    wanted = _sublayers(stack)[:-1]
    for g, (role, why) in roles.items():
        lines += _attention_lines(canon, g, role, why, groups[g], shape, d)
        for w in groups[g]:
            done.add(w)
            b = w[: -len("weight")] + "bias"
            if b in shape:
                zero.append((b, ""))
                done.add(b)
    for role in wanted:
        if role not in [r for r, _ in roles.values()]:
            for x in "qkvo":
                lines.append((f"{canon}.{role}.{x}.weight", "", f"no {role.replace('_', '-')} module found"))

    ffn_lines, ffn_group = _ffn_lines(canon, rel, shape, done, d, d_ff, ignored)
    lines += ffn_lines
    owner = {g: r for g, (r, _) in roles.items()}
    if ffn_group:
        owner[ffn_group] = "ffn"
    lines += _norm_lines(canon, stack, rel, shape, done, owner, d, (_sublayer_modules(canon, stack, lines, owner), run))
    left = [(n, f"shape {list(shape[n])}: not in the paper's schema, left as built") for n, _, _ in rel
            if n not in done]
    return lines, zero, one, left


def _sublayers(stack: str) -> list[str]:
    """The sub-layers of a layer of ``stack``, in order (section 3.1)."""
    return ["self_attn", "ffn"] if stack == "encoder" else ["self_attn", "cross_attn", "ffn"]


# -- attention --------------------------------------------------------------------------------------------------
def _attention_groups(rel: list[Member], d: int, d_ff: int) -> dict[str, list[str]]:
    """Attention groups: the first path component holding [d, d], [3d, d] or [2d, d] weights -> those weights."""
    groups: dict[str, list[str]] = {}
    for name, parts, p in rel:
        if parts[-1].endswith("weight") and p.dim() == 2 and p.shape[1] == d and p.shape[0] in (d, 2 * d, 3 * d) \
                and p.shape[0] != d_ff:
            groups.setdefault(parts[0], []).append(name)
    return groups


def _attention_roles(stack: str, names: list[str]) -> dict[str, tuple[str, str]]:
    """Attention group -> (self_attn or cross_attn, CHECK note): by name, by elimination, or by order."""
    roles: dict[str, tuple[str, str]] = {}
    if stack == "encoder":
        if names:
            roles[names[0]] = ("self_attn", "" if len(names) == 1 else "the first of several attention modules")
        return roles
    for g in names:
        toks = tokens(g)
        if toks & SELF or "self" in g.lower():
            roles[g] = ("self_attn", "")
        elif toks & CROSS or "cross" in g.lower():
            roles[g] = ("cross_attn", "")
    claimed = [r for r, _ in roles.values()]
    if len(set(claimed)) != len(claimed):
        roles = {}
    free = [g for g in names if g not in roles]
    left_roles = [r for r in _sublayers(stack)[:-1] if r not in [x for x, _ in roles.values()]]
    by_elimination = len(left_roles) == 1 and len(free) == 1 and len(roles) == 1
    for g, r in zip(free, left_roles):
        roles[g] = (r, "" if by_elimination else "self/cross chosen by registration order")
    return roles


def _named_projections(g: str, square: list[str]) -> dict[str, str]:
    """q, k, v, o -> the [d, d] weight of group ``g`` whose module path names it (and no other)."""
    proj: dict[str, str] = {}
    for w in square:
        mod = w.rpartition(".")[0][len(g):]
        hits = [x for x, keys in PROJ.items() if tokens(mod) & keys]
        if len(hits) == 1 and hits[0] not in proj:
            proj[hits[0]] = w
    return proj


def _attention_lines(canon: str, g: str, role: str, why: str, weights: list[str], shape: dict[str, tuple[int, ...]],
                     d: int) -> list[Template]:
    """The projection lines of the attention group ``g`` in ``role``: a stacked q|k|v or k|v weight where there is
    one, the rest by name, else by registration order when the count fits; a missing projection gets a line with
    no target."""
    lines: list[Template] = []
    packed = [w for w in weights if shape[w][0] == 3 * d]
    kv = [w for w in weights if shape[w][0] == 2 * d]
    square = [w for w in weights if shape[w][0] == d]
    if packed:
        w = packed[0]
        ok = "in_proj" in w or "qkv" in w.lower()
        lines.append((tuple(f"{canon}.{role}.{x}.weight" for x in "qkv"), w,
                      why or ("" if ok else "a [3 d_model, d_model] weight read as q|k|v stacked")))
        proj = {"o": square[0]} if square else {}
    else:
        proj = _named_projections(g, square)
        if kv and "q" in proj:
            lines.append((tuple(f"{canon}.{role}.{x}.weight" for x in "kv"), kv[0],
                          why or "a [2 d_model, d_model] weight read as k|v stacked"))
            proj = {"q": proj["q"], **({"o": proj["o"]} if "o" in proj else {})}
            order_needed = [x for x in "qo" if x not in proj]
        else:
            order_needed = [x for x in "qkvo" if x not in proj]
        rest = [w for w in square if w not in proj.values()]
        if order_needed and len(rest) == len(order_needed):
            proj.update(zip(order_needed, rest))
            why = why or "q, k, v, o chosen by registration order"
    for x in ("q", "k", "v", "o"):
        if x in proj:
            lines.append((f"{canon}.{role}.{x}.weight", proj[x], why))
    missing = [x for x in ("q", "k", "v", "o") if x not in proj and not packed and not (kv and x in "kv")]
    shared = _shared_head_projections(g, [x for x in missing if x != "o"], shape, d)
    for x in missing:
        if x in shared:
            w = shared[x]
            lines.append((f"{canon}.{role}.{x}.weight", "", f"the {x} projection {w} {list(shape[w])} is shared by "
                          f"every head (one weight applied to each head's slice), so it cannot hold the paper's "
                          f"per-head W^{x.upper()}_i (d_model x d_k each, §3.2.2): no [d_model, d_model] weight to "
                          "map"))
        else:
            lines.append((f"{canon}.{role}.{x}.weight", "", f"no {x} projection found in {g}"))
    return lines


def _shared_head_projections(g: str, missing: list[str], shape: dict[str, tuple[int, ...]], d: int) -> dict[str, str]:
    """q, k, v (of ``missing``) -> a head-sized weight of group ``g`` ([d_k, d_k] or [d_k, d_model], d_k dividing
    d_model) applied to every head instead of the paper's per-head projections: by name, else by registration
    order when their count fits."""
    small = [n for n, s in shape.items() if n.startswith(f"{g}.") and n.endswith("weight") and len(s) == 2
             and s[0] < d and d % s[0] == 0 and s[1] in (s[0], d)]
    found = _named_projections(g, small)
    found = {x: w for x, w in found.items() if x in missing}
    rest = [w for w in small if w not in found.values()]
    left = [x for x in missing if x not in found]
    if left and len(rest) == len(left):
        found.update(zip(left, rest))
    return found


# -- feed-forward network and norms --------------------------------------------------------------------------------
def _ffn_lines(canon: str, rel: list[Member], shape: dict[str, tuple[int, ...]], done: set[str], d: int,
               d_ff: int, ignored: str = "") -> tuple[list[Template], str]:
    """Feed-forward network: [d_ff, d] then [d, d_ff] weights and their biases (added to ``done``), and the first
    path component of its weights ("" when none)."""
    lines: list[Template] = []
    ffn_group = ""
    for k, rows in (("w1", (d_ff, d)), ("w2", (d, d_ff))):
        w = next((n for n, _, _ in rel if shape[n] == rows and n.endswith("weight") and n not in done), "")
        b = w[: -len("weight")] + "bias" if w else ""
        if ignored:  # the model's FFN, loadable only at the width it has whatever d_ff says
            lines.append((f"{canon}.ffn.{k}.weight", w, ignored if w else f"no {list(rows)} weight found"))
            lines.append((f"{canon}.ffn.{k}.bias", b if b in shape else "", ignored if b in shape else "no bias"))
        else:
            lines.append((f"{canon}.ffn.{k}.weight", w, "" if w else f"no {list(rows)} weight found"))
            lines.append((f"{canon}.ffn.{k}.bias", b if b in shape else "",
                          "" if b in shape else "no bias found: Eq. (2) has one (map it to a callable, or declare "
                          "ffn.formula)"))
        done.update({w, b})
        ffn_group = ffn_group or (w.split(".")[0] if w else "")
    return lines, ffn_group


def _norm_slot(mod: str, owner: dict[str, str], sublayers: list[str], stack: str) -> int | None:
    """Which sub-layer's norm the norm module ``mod`` (a path inside the layer) is, from its names alone."""
    where = mod.split(".")
    if where[0] in owner and len(where) > 1:  # the norm lives inside its sub-layer's module
        return sublayers.index(owner[where[0]])
    suffix = re.search(r"(\d+)$", where[-1])  # norm1, ln_2: 1-based
    numbered = [int(x) + 1 for x in where if x.isdigit()]  # sublayers.0.norm: 0-based
    number = int(suffix.group(1)) if suffix else (numbered[-1] if numbered else None)
    if number is not None and 1 <= number <= len(sublayers):
        return number - 1
    toks = tokens(mod)
    if toks & FFN:
        return sublayers.index("ffn")
    if stack == "decoder" and (toks & CROSS or "cross" in mod.lower()):
        return sublayers.index("cross_attn")
    if toks & ATTENTION:
        return 0
    return None


def _sublayer_modules(canon: str, stack: str, lines: list[Template], owner: dict[str, str]) -> dict[int, Sublayer]:
    """Each sub-layer's modules (its entry, exit and group) from the lines placed so far, by sub-layer number."""
    def module(canonical: str) -> str:
        name = next((t for c, t, _ in lines if t and (c == canonical or (isinstance(c, tuple) and canonical in c))), "")
        return name.rpartition(".")[0] if name else ""

    groups = {r: g for g, r in owner.items()}
    out = {}
    for k, role in enumerate(_sublayers(stack)):
        first, last = ("w1", "w2") if role == "ffn" else ("q", "o")
        entry, exit_ = module(f"{canon}.{role}.{first}.weight"), module(f"{canon}.{role}.{last}.weight")
        if entry and role in groups:
            out[k] = Sublayer(entry, exit_ or groups[role], groups[role])
    return out


def _norm_lines(canon: str, stack: str, rel: list[Member], shape: dict[str, tuple[int, ...]], done: set[str],
                owner: dict[str, str], d: int, probe: tuple[dict[int, Sublayer], Runner | None]) -> list[Template]:
    """Layer norms: [d] parameters grouped by their module, each module assigned to its sub-layer by the value
    probe, else by name, else by registration order (marked); a sub-layer with no norm gets lines with no target.
    Placed names go into ``done``."""
    norms: dict[str, dict[str, str]] = {}
    for name, parts, _ in rel:
        if name in done or shape[name] != (d,):
            continue
        leaf = parts[-1].lower()
        part = "gain" if leaf in GAIN else "bias" if leaf in SHIFT else None
        if part is not None:
            norms.setdefault(".".join(parts[:-1]), {})[part] = name
    slot, notes = _norm_slots(stack, list(norms), owner, probe)
    lines: list[Template] = []
    for mod, n in slot.items():
        for part, canon_part in (("gain", "weight"), ("bias", "bias")):
            name = norms[mod].get(part, "")
            lines.append((f"{canon}.{NORMS[stack][n]}.{canon_part}", name,
                          notes.get(mod, "") if name else f"{mod} has no {part} of shape [{d}]"))
            done.add(name)
    for n, norm in enumerate(NORMS[stack]):
        if n not in slot.values():
            others = ", ".join(f"{x} {list(shape[x])}" for x, _, _ in rel if x not in done) or "none"
            for part in ("weight", "bias"):
                lines.append((f"{canon}.{norm}.{part}", "", f"no [{d}] layer-norm parameter found (left in this "
                              f"layer: {others})"))
    return lines


def _norm_slots(stack: str, norms: list[str], owner: dict[str, str],
                probe: tuple[dict[int, Sublayer], Runner | None]) -> tuple[dict[str, int], dict[str, str]]:
    """Norm module -> its sub-layer number, and the CHECK note of each one the value probe did not decide."""
    sublayers = _sublayers(stack)
    modules, run = probe
    found: dict[str, int | str] = {}
    why = "the layer was not run"
    if run is not None and modules and norms:
        seen, why = run(modules, norms)
        if not why:
            found = norm_slots(seen, modules, norms, {k: LABELS[sublayers[k]] for k in modules})
    slot = {m: k for m, k in found.items() if isinstance(k, int)}
    undecided = [m for m in norms if m not in slot]
    if not undecided:
        return slot, {}
    said = "; ".join(dict.fromkeys(str(found[m]) for m in undecided if m in found)) or why
    free = [k for k in range(len(sublayers)) if k not in slot.values()]
    named = {m: _norm_slot(m, owner, sublayers, stack) for m in undecided}
    by_name = [k for k in named.values() if k is not None]
    if len(by_name) == len(set(by_name)) and set(by_name) <= set(free):
        if len(by_name) == len(undecided) and not found:  # the names decide every norm; no value was read
            return slot | {m: k for m, k in named.items() if k is not None}, {}
        for m, k in named.items():
            if k is not None:
                slot[m], free = k, [j for j in free if j != k]
    notes = {m: f"{m} chosen by its name; the value probe could not tell ({said})" for m in undecided if m in slot}
    rest = [m for m in undecided if m not in slot]
    order = dict(zip(rest, free))
    if len(order) == 1:
        notes |= {m: f"{m} given the one sub-layer left; the value probe could not tell ({said})" for m in order}
    elif order:
        note = (f"the norm of each sub-layer chosen by registration order among {', '.join(rest)}: the value "
                f"probe could not tell them apart ({said})")
        notes |= {m: note for m in order}
    return slot | order, notes

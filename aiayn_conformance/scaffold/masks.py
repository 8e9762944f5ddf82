"""The mask convention of a forward that takes masks, found by calling it with each candidate in turn (4-D, 3-D
or 2-D; boolean True = may attend, boolean True = masked out, float 1 = may attend, additive 0 / -inf). The first
under which padded source and future target content do not move the scores, and a real source token does, is
kept; when none passes the 4-D boolean one is written, marked ``# CHECK:`` with what the tries did."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig

DIMS = (4, 3, 2)
KINDS = ("bool", "blocked", "float", "additive")
_SRC_SHAPE = {2: ("", "(B, S)"), 3: ("[:, None, :]", "(B, 1, S)"), 4: ("[:, None, None, :]", "(B, 1, 1, S)")}
_TGT_SHAPE = {2: ("(T, T)",), 3: ("(B, T, T)",), 4: ("(B, 1, T, T)",)}
_KIND_LINE = {
    "bool": "",
    "blocked": "{m} = ~{m}  # True = masked out",
    "float": "{m} = {m}.float()  # 1 = may attend, 0 = masked out",
    "additive": "{m} = torch.zeros({m}.shape, device={m}.device).masked_fill(~{m}, float(\"-inf\"))  # added to the "
                "scores",
}
_KIND_WORDS = {"bool": "boolean, True = may attend", "blocked": "boolean, True = masked out",
               "float": "float, 1 = may attend", "additive": "additive, 0 / -inf"}


@dataclass(frozen=True)
class Convention:
    dims: int
    kind: str

    def describe(self) -> str:
        return f"{self.dims}-D, {_KIND_WORDS[self.kind]}"


def mask_roles(model: nn.Module) -> list[str] | None:
    """``src`` or ``tgt`` for each required mask argument of ``model.forward`` after (src, tgt); None when the
    forward requires nothing but (src, tgt), or something that is not a mask."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params if p.default is p.empty]
    if len(names) <= 2 or any("mask" not in n.lower() for n in names[2:]):
        return None
    return [_role(n.lower()) for n in names[2:]]


def _role(name: str) -> str:
    """``tgt`` for a mask named for the target or the causal mask, ``src`` for one named for the source."""
    if any(w in name for w in ("tgt", "trg", "target", "dec", "causal", "subsequent", "look_ahead", "future")):
        return "tgt"
    return "src" if any(w in name for w in ("src", "enc", "memory", "source", "pad", "input")) else "tgt"


def mask_lines(roles: list[str], src: Convention, tgt: Convention) -> tuple[list[str], str]:
    """The adapter's lines building the masks under the conventions, and the call passing them."""
    lines = ["pad = self.config.pad_id"]
    if "src" in roles:
        index, shape = _SRC_SHAPE[src.dims]
        lines.append(f"src_mask = (src != pad){index}  # {shape}, {src.describe()}")
    if "tgt" in roles:
        lines += ["T = tgt.size(1)", "tgt_mask = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()"]
        if tgt.dims == 3:
            lines.append("tgt_mask = tgt_mask & (tgt != pad)[:, None, :]")
        elif tgt.dims == 4:
            lines.append("tgt_mask = tgt_mask & (tgt != pad)[:, None, None, :]")
        lines[-1] += f"  # {_TGT_SHAPE[tgt.dims][0]}, {tgt.describe()}"
    for role, conv in (("src", src), ("tgt", tgt)):
        if role in roles and _KIND_LINE[conv.kind]:
            lines.append(_KIND_LINE[conv.kind].format(m=f"{role}_mask"))
    return lines, f"self.model(src, tgt, {', '.join(f'{r}_mask' for r in roles)})"


@dataclass
class Found:
    """The convention found (None when no candidate passed), its lines and call, and what the tries did."""

    lines: list[str]
    call: str
    convention: tuple[Convention, Convention] | None
    tried: str


def find_convention(model: nn.Module, config: ModelConfig) -> Found | None:
    """The mask convention ``model.forward`` follows (None when it takes no masks)."""
    roles = mask_roles(model)
    if roles is None:
        return None
    conventions = [Convention(d, k) for d, k in product(DIMS, KINDS)]
    pairs = [(c, c) for c in conventions] + [(s, t) for s, t in product(conventions, conventions) if s != t]
    outcomes: dict[str, int] = {}
    for src_conv, tgt_conv in pairs:
        lines, call = mask_lines(roles, src_conv, tgt_conv)
        why = _try(model.eval(), config, lines, call)
        if not why:
            return Found(lines, call, (src_conv, tgt_conv), "")
        outcomes[why] = outcomes.get(why, 0) + 1
    lines, call = mask_lines(roles, Convention(4, "bool"), Convention(4, "bool"))
    tried = "; ".join(f"{n} x {why}" for why, n in sorted(outcomes.items(), key=lambda x: -x[1])[:3])
    return Found(lines, call, None, f"no mask convention passed ({len(pairs)} tried: {tried})")


# -- one candidate ----------------------------------------------------------------------------------------------
PROBE_SRC = [[5, 6, 7, 8, 9, 10, 11], [4, 5, 6, 0, 0, 0, 0]]  # pad 0 replaced by config.pad_id
PROBE_TGT = [[1, 2, 3, 4, 5], [3, 4, 0, 0, 0]]


def probe_batch(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded source [2, 7] and target [2, 5] batch: row 0 unpadded, row 1 padded."""
    pad = config.pad_id

    def ids(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor([[pad if x == 0 else (x if x != pad else x + 11) for x in r] for r in rows])
    return ids(PROBE_SRC), ids(PROBE_TGT)


def run_call(model: nn.Module, config: ModelConfig, lines: list[str], call: str, src: torch.Tensor,
             tgt: torch.Tensor, fed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The adapter's forward body on (src, tgt); ``fed`` replaces the tokens the call sees (masks kept)."""
    ns: dict[str, Any] = {"torch": torch, "src": src, "tgt": tgt,
                          "self": argparse.Namespace(model=model, config=config)}
    with torch.no_grad():
        exec("\n".join(lines), ns)  # noqa: S102 - the code the scaffold is about to write
        if fed is not None:
            ns["src"], ns["tgt"] = fed
        out = eval(call, ns)  # noqa: S307
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"returned {type(out).__name__}")
    if flattened(out, src, tgt):  # (B * T, V), as a loss takes it: the adapter views it as (B, T, V) (probe.py)
        out = out.view(src.size(0), tgt.size(1), -1)
    return out.double()


def flattened(out: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor) -> bool:
    """Whether a forward's output is its (B, T, V) scores flattened to (B * T, V)."""
    return out.dim() == 2 and out.size(0) == src.size(0) * tgt.size(1)


def _try(model: nn.Module, config: ModelConfig, lines: list[str], call: str) -> str:
    """"" when the candidate passes, else why not (a short phrase)."""
    src, tgt = probe_batch(config)
    try:
        out = run_call(model, config, lines, call, src, tgt)
    except Exception as exc:
        return f"raised {type(exc).__name__}"
    if list(out.shape) != [2, 5, config.tgt_vocab]:
        return f"returned {list(out.shape)}"
    real = tgt != config.pad_id
    if not torch.isfinite(out[real]).all():
        return "non-finite scores"
    other = (config.pad_id + 3) % config.src_vocab
    padded = src.masked_fill(src == config.pad_id, other)
    future = tgt.clone()
    future[0, -1] = (int(tgt[0, -1]) + 1) % config.tgt_vocab or 1
    changed_src = src.clone()
    changed_src[1, 0] = (int(src[1, 0]) + 1) % config.src_vocab or 1
    try:
        leak_pad = run_call(model, config, lines, call, src, tgt, (padded, tgt))
        leak_future = run_call(model, config, lines, call, src, tgt, (src, future))
        moved = run_call(model, config, lines, call, src, tgt, (changed_src, tgt))
    except Exception as exc:
        return f"raised {type(exc).__name__} on changed tokens"
    if (leak_pad - out)[real].abs().max() > 1e-5:
        return "output moved with padded source content"
    if (leak_future - out)[0, :-1].abs().max() > 1e-5:
        return "output moved with future target content"
    if (moved - out)[1, :2].abs().max() < 1e-6:
        return "output did not move with a real source token"
    return ""


__all__ = ["Convention", "Found", "find_convention", "flattened", "mask_lines", "mask_roles", "probe_batch",
           "run_call"]

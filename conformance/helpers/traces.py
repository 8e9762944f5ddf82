"""What one forward pass computes, read from the operations it runs: probes that need no transplant.

Many checks load the suite's canonical weights (``transplant``); a model that cannot hold them (one projection
shared by all heads, an adapter without ``load_reference_state``) would leave their clauses not judged. The
probes here judge attention.scale, attention.heads, the masks, embedding.scale and position.* on the model's OWN
weights, without knowing its structure: one eval forward on a padded witness runs under a ``TorchDispatchMode``
that records the ATen operations revealing the paper's quantities (below the Python modules, so a library's
composite functions, ``nn.MultiheadAttention``'s slow path or ``F.scaled_dot_product_attention``'s math path
are seen op by op):

* the attention weights as they reach the values: the first operand of a batched product ``weights @ V`` whose
  last two dimensions are (queries, keys), non-negative with rows summing to at most 1, or the weights a fused
  ``_scaled_dot_product_*attention*`` kernel computes from its q, k, mask and scale (recomputed in float64).
  The masks are judged on them directly: a masked key must get no weight (below 1e-6 per query), at any
  sharpness;
* the softmax whose output they are, the product whose output its input is (scores = c_s * A B), and the
  projection outputs (products with a parameter operand) that A and B are scaled permutations of: the scale
  of Eq. (1) is c_s * c_A * c_B, wherever it was applied (on the scores, on q, on q and k);
* the embedding lookups E and the elementwise results after them that decompose as R = c * E + P(position):
  c is the embedding scale;
* the heads (``Split``): the queries and keys of each score product, the values of each ``weights @ V`` (or a
  fused kernel's q, k, v) against the projection output they are copied from, and the heads' outputs against the
  input of the projection that reads them (W^O): how many matrices per sequence, of how many features, whether
  row i of each is token i's (in a batch-first or a sequence-first layout) and whether the heads of a token use
  each of its projected features at most once. Projections are recognised by their parameter operand; their input
  width (d_model in the paper) is kept;
* at extreme scores (``sharpen=True``): the same readings after the query projections found are multiplied by
  one factor, so that the admissible scores reach the order of 1e5 and a finite mask fill is outscored.

A probe skips, saying why, when the forward shows nothing it can read (a fused encoder layer, a fused
multi-head attention kernel). The witness has the same padding in every row, so a weight's query and key
positions are known whatever the layout of heads and batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn_conformance.spec.config import ModelConfig

from . import settings
from .harness import build_model, run_forward
from .inputs import fitted, random_tokens

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["Trace", "Attention", "Scale", "Split", "Lookup", "EXTREME", "observed", "trace_of", "LEAK", "kind_name",
           "real_queries", "padded_keys", "named_scale", "OWN_WEIGHTS"]

# The witness: every row has the same real lengths, so a weight's query and key positions do not depend on the
# batch layout; four distinct lengths tell the attentions apart, also in a model that cuts the padding off the
# batch (its attentions are then over the real length): (S, S) encoder self, (T, S) cross, (T, T) decoder self.
BATCH, SRC_LEN, SRC_REAL, TGT_LEN, TGT_REAL = 2, 8, 6, 5, 4
SIDE = {SRC_LEN: "source", SRC_REAL: "source", TGT_LEN: "target", TGT_REAL: "target"}
REAL = {"source": SRC_REAL, "target": TGT_REAL}
KINDS = {("source", "source"): "encoder self-attention", ("target", "source"): "cross-attention",
         ("target", "target"): "decoder self-attention"}
LEAK = 1e-6  # the most weight all masked keys of one query may get together ("exactly 0, or below resolution")
FIT = 1e-4  # relative residual under which a tensor is a scaled copy (or permutation) of another

_PRODUCTS = {"aten.bmm.default", "aten.mm.default", "aten.addmm.default", "aten.baddbmm.default"}
_SOFTMAX = {"aten._softmax.default", "aten._safe_softmax.default"}
_ELEMENTWISE = {"aten.add.Tensor", "aten.add_.Tensor", "aten.mul.Tensor", "aten.mul_.Tensor", "aten.mul.Scalar",
                "aten.div.Tensor", "aten.div_.Tensor", "aten.sub.Tensor", "aten.add.Scalar"}
_FUSED_SDPA = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention")
_OPAQUE = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_flash_attention_forward",
           "_efficient_attention_forward")


def kind_name(lq: int, lk: int) -> str:
    return KINDS.get((SIDE.get(lq, ""), SIDE.get(lk, "")), f"attention [{lq}, {lk}]")


def is_attention(lq: int, lk: int) -> bool:
    """Whether [.., lq, lk] is the shape of one of the witness's attentions (queries and keys of known sides)."""
    return (SIDE.get(lq), SIDE.get(lk)) in KINDS


@dataclasses.dataclass
class Event:
    index: int
    op: str
    out: torch.Tensor | None = None  # float64 copy of the output (products, softmax, elementwise, embedding)
    operands: tuple[torch.Tensor, ...] = ()  # float64 copies of the product's factors (A, B)
    param: bool = False  # a factor shares storage with a parameter of the model (a projection)
    indices: torch.Tensor | None = None  # an embedding lookup's ids
    act: torch.Tensor | None = None  # a projection's input (the factor that is no parameter), float64
    weight: tuple[int, ...] = ()  # a projection's parameter factor's shape
    param_name: str = ""  # the model's name for that parameter


@dataclasses.dataclass
class Attention:
    """One attention call as the trace shows it."""

    lq: int
    lk: int
    weights: torch.Tensor  # float64 [N, Lq, Lk], as they multiply the values (NaN as 0)
    where: str  # "softmax" or the fused kernel's name

    @property
    def kind(self) -> str:
        return kind_name(self.lq, self.lk)


@dataclasses.dataclass
class Scale:
    """The scale of one attention's scores: scores = value * (Q_i K_i^T) with Q, K the projections' outputs."""

    lq: int
    lk: int
    where: str  # "softmax" or the fused kernel's name
    value: float | None  # c_s * c_A * c_B, when the chain to the projections was found
    how: str  # how it was measured, or why it was not
    peak: float | None = None  # the largest |score| a real query gives a key it may attend to

    @property
    def kind(self) -> str:
        return kind_name(self.lq, self.lk)


@dataclasses.dataclass
class Split:
    """How one attention call's queries, keys or values were split into heads, or its heads' outputs concatenated
    (the input of W^O), as measured against the per-token tensor they come from or go to: the projection's
    output (queries, keys, values) or W^O's input (the concatenation)."""

    lq: int
    lk: int
    part: str  # "queries", "keys", "values" or "concatenation"
    where: str  # "softmax" or the fused kernel's name
    matrices: int = 0  # per-head matrices in the call, all sequences together (B * h in the paper)
    width: int = 0  # features per row of one matrix (d_k for queries and keys, d_v for values and head outputs)
    proj_in: int | None = None  # the projection's input features per row (d_model in the paper)
    proj_weight: tuple[int, ...] = ()  # the projection's weight shape
    proj_param: str = ""  # the model's name for the projection's weight
    tokens: int = 0  # rows of the per-token tensor (B * L when there is one row per token)
    token_width: int = 0  # its features per row
    layout: str | None = None  # "batch-first" or "sequence-first": every matrix's row i is one sequence's token i
    heads: list[int] = dataclasses.field(default_factory=list)  # matrices per sequence, when the rows are placed
    mixed: str = ""  # when no layout fits: a row that is not its own position's, measured
    uncovered: str = ""  # a position whose h rows together use one of its token's features more than once
    unread: str = ""  # why nothing was measured

    @property
    def kind(self) -> str:
        return kind_name(self.lq, self.lk)


@dataclasses.dataclass
class Lookup:
    """An embedding lookup E and the scale c of the first-layer input c * E + P(position) it feeds."""

    stack: str  # "encoder" or "decoder"
    scale: float | None
    how: str
    table: torch.Tensor | None = None  # P, float64 [L, d_model]: what is added per position
    # (c', P') of the last such sum before the stack's first projection or attention: what its first layer reads
    last: tuple[float, torch.Tensor] | None = None


@dataclasses.dataclass
class Trace:
    src: torch.Tensor
    tgt: torch.Tensor
    attentions: list[Attention]
    scales: list[Scale]
    lookups: list[Lookup]
    opaque: list[str]  # fused attention kernels the trace cannot see into
    splits: list[Split] = dataclasses.field(default_factory=list)
    sharpened: str = ""  # for a trace at sharpened weights: which parameters were multiplied, by what

    def of_kind(self, kind: str) -> list[Attention]:
        """The attention calls of ``kind`` ("encoder self-attention", "cross-attention", "decoder self-attention")."""
        return [a for a in self.attentions if a.kind == kind]

    def unseen(self, what: str) -> str:
        """A skip reason: no ``what`` was observed in the traced forward, and why that may be."""
        fused = f"; fused kernels it cannot see into ran: {', '.join(sorted(set(self.opaque)))}" if self.opaque \
            else "; the attention may be computed in a fused kernel or a custom op"
        return (f"own-weights trace: no {what} observed in one eval forward (ATen operations recorded){fused}; the "
                "transplant-based checks judge the clause where the adapter can load the canonical weights")


class _Recorder(TorchDispatchMode):
    def __init__(self, storages: dict[int, str]) -> None:
        super().__init__()
        self.storages = storages
        self.events: list[Event] = []
        self.sdpa: list[tuple[int, str, dict[str, Any], torch.Tensor]] = []
        self.opaque: list[str] = []
        self.failure: str | None = None  # the first exception recording raised: the readings are then incomplete

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.record(func, args, kwargs, out)
        except Exception as exc:  # recording never changes what the model computes; its failure is kept
            if self.failure is None:
                self.failure = f"{func}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return out

    def is_param(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.numel() > 0 and t.untyped_storage().data_ptr() in self.storages

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = str(func)
        index = len(self.events) + len(self.sdpa)
        if name in _PRODUCTS:
            a, b = (args[0], args[1]) if name in ("aten.bmm.default", "aten.mm.default") else (args[1], args[2])
            if self.is_param(a) or self.is_param(b):  # a projection: its output and input are read, not its
                # weight (a base model's output matrix is 37000 x 512), of which only the shape is kept
                act, weight = (b, a) if self.is_param(a) else (a, b)
                self.events.append(Event(index, name, _f64(out), (), True, act=_f64(act),
                                         weight=tuple(weight.shape),
                                         param_name=self.storages[weight.untyped_storage().data_ptr()]))
            else:
                self.events.append(Event(index, name, _f64(out), (_f64(a), _f64(b))))
        elif name in _SOFTMAX:
            self.events.append(Event(index, name, _f64(out), (_f64(args[0]),)))
        elif name in _ELEMENTWISE and isinstance(out, torch.Tensor) and out.is_floating_point():
            self.events.append(Event(index, name, _f64(out)))
        elif name == "aten.embedding.default":
            self.events.append(Event(index, name, _f64(out), indices=args[1].detach().cpu()))
        elif any(f in name for f in _FUSED_SDPA):
            names = [a.name for a in func._schema.arguments]
            bound = dict(zip(names, args, strict=False)) | kwargs
            self.sdpa.append((index, name, bound, out[0] if isinstance(out, (tuple, list)) else out))
        elif any(f in name for f in _OPAQUE):
            self.opaque.append(name.split(".")[1])


def _f64(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy on the CPU."""
    return t.detach().to("cpu", torch.float64)


def _fit(y: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """(c, relative residual) of the least-squares fit y = c x."""
    denom = float((x * x).sum())
    if denom == 0.0 or float((y * y).sum()) == 0.0:
        return 0.0, float("inf")
    c = float((x * y).sum()) / denom
    return c, float((y - c * x).norm() / y.norm())


def _sorted_scale(a: torch.Tensor, events: list[Event], before: int) -> tuple[float, int] | None:
    """(c, event index): the latest projection output before event ``before`` of which ``a`` is c times a
    permutation (a reshaped, transposed or head-split copy), c > 0; a projection packing q, k and v (or k and v)
    counts chunk by chunk along its last axis."""
    sa = a.reshape(-1).sort().values
    for ev in reversed(events[:before]):
        if not ev.param or ev.out is None or ev.out.numel() % a.numel():
            continue
        m = ev.out.numel() // a.numel()
        if m > 4 or ev.out.size(-1) % m:
            continue
        for chunk in ev.out.reshape(-1, ev.out.size(-1)).chunk(m, dim=-1):
            c, res = _fit(sa, chunk.reshape(-1).sort().values)
            if c > 0 and res < FIT:
                return c, ev.index
    return None


def _allowed(lq: int, lk: int) -> torch.Tensor:
    """[Lq, Lk] True where the paper lets a real query attend: real keys, and keys up to the query in the decoder."""
    ok = torch.zeros(lq, lk, dtype=torch.bool)
    ok[:real_queries(lq), :real_queries(lk)] = True
    if kind_name(lq, lk) == "decoder self-attention":
        ok &= torch.ones(lq, lk, dtype=torch.bool).tril()
    return ok


def _peak(scores: torch.Tensor, lq: int, lk: int) -> float | None:
    """The largest finite |score| of ``scores`` [.., Lq, Lk] where a real query may attend (the fill of masked
    keys left out)."""
    allowed = _allowed(lq, lk).expand(scores.reshape(-1, lq, lk).shape)
    values = scores.reshape(-1, lq, lk)[allowed]
    values = values[torch.isfinite(values)]
    return float(values.abs().max()) if values.numel() else None


def _score_product(events: list[Event], spos: int, lq: int, lk: int) -> Event | None:
    """The product of queries and keys whose output the softmax at event position ``spos`` normalizes."""
    s = events[spos].operands[0]
    return next((e for e in reversed(events[:spos]) if e.op in _PRODUCTS and not e.param and e.out is not None
                 and e.out.numel() == s.numel() and tuple(e.out.shape[-2:]) == (lq, lk)), None)


Source = tuple[float, int] | None  # (c, event index) of the projection output a tensor is c times (part of)


def _source(h: torch.Tensor, events: list[Event], before: int) -> Source:
    """The projection output before event position ``before`` that h [.., L, d] is a scaled permutation of, else
    one holding every value of h at a common scale (heads that repeat or leave out part of their projection)."""
    return _sorted_scale(h, events, before) or _subset_of(h, events, before)


def _scale_chain(events: list[Event], spos: int, lq: int, lk: int, prod: Event | None,
                 sources: tuple[Source, Source]) -> tuple[float | None, str]:
    """The effective scale of the scores a softmax (event position ``spos``) normalizes: c_s * c_A * c_B, from
    the score product ``prod`` and the ``sources`` of its queries and keys."""
    s = events[spos].operands[0]
    if prod is None:
        return None, "no product of queries and keys produced the softmax's input"
    a, b = prod.operands
    raw = a @ b  # the product without any bias or mask a fused addmm/baddbmm added
    allowed = _allowed(lq, lk).expand(s.reshape(-1, lq, lk).shape)
    sv, pv = s.reshape(-1, lq, lk)[allowed], raw.reshape(-1, lq, lk)[allowed]
    finite = torch.isfinite(sv) & (sv.abs() < 1e4)
    c_s, res = _fit(sv[finite], pv[finite])
    if res > 1e-3:
        return None, f"the softmax's input is no multiple of the product of queries and keys (residual {res:.2g})"
    found_a, found_b = sources
    if found_a is None or found_b is None:
        return None, ("the queries or keys of the score product are no scaled copy of a projection output (a "
                      "rotary embedding, a norm on q or k, or a projection the trace does not see)")
    c_a, c_b = found_a[0], found_b[0]
    return c_s * c_a * c_b, (f"scores = {c_s:.6g} x (q' k'^T), q' = {c_a:.6g} x the query projection, "
                             f"k' = {c_b:.6g} x the key projection; contracted size {a.size(-1)}")


def _fused_weights(bound: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(q, k, weights [.., Lq, Lk] float64, the kernel's scale) of a fused scaled-dot-product-attention call."""
    q, k = (_f64(bound[n]) for n in ("query", "key"))
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    scores = q @ k.transpose(-2, -1) * scale
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu()
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask.double())
    if bound.get("is_causal"):
        lq, lk = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(), float("-inf"))
    return q, k, torch.softmax(scores, dim=-1).nan_to_num(0.0), scale


def _event(events: list[Event], index: int) -> Event:
    return next(e for e in events if e.index == index)


def _nearest(h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[N, L]: for each row of h [N, L, d], the largest distance of one of its values to the nearest value of the
    row of ``rows`` [L, D] (sorted) at the same position."""
    n = h.size(0)
    table = rows.unsqueeze(0).expand(n, *rows.shape).contiguous()
    idx = torch.searchsorted(table, h.contiguous())
    top = table.size(-1) - 1
    below, above = table.gather(-1, (idx - 1).clamp(0, top)), table.gather(-1, idx.clamp(max=top))
    return torch.minimum((h - below).abs(), (h - above).abs()).amax(-1)


def _split(split: Split, h: torch.Tensor, tokens: torch.Tensor, scale: float, batch: int) -> Split:
    """Fill ``split`` from the per-head rows h [N, L, d] (``scale`` times a copy of features of ``tokens``, the
    per-token tensor) and the witness's batch size."""
    n, length, d = h.shape
    width = tokens.size(-1)
    rows = tokens.numel() // width
    split.matrices, split.width, split.tokens, split.token_width = n, d, rows, width
    if rows != batch * length:
        split.unread = (f"the {split.part} come from a tensor of {rows} rows of {width} features, not one row per "
                        f"token ({batch} x {length})")
        return split
    flat = tokens.reshape(rows, width)
    hs = h / scale
    tol = 1e-5 * max(float(flat.abs().max()), 1e-30)
    grids = {"batch-first": flat.view(batch, length, width),
             "sequence-first": flat.view(length, batch, width).transpose(0, 1)}
    fewest: tuple[int, str, torch.Tensor] | None = None  # (rows at no own position, layout, distances)
    for layout, grid in grids.items():
        ordered = grid.sort(-1).values  # [B, L, D]
        dist = torch.stack([_nearest(hs, ordered[b]) for b in range(batch)])  # [B, N, L]
        best = dist.amax(-1).min(0)  # per matrix: the sequence whose tokens hold its rows position by position
        if bool((best.values <= tol).all()):
            split.layout = layout
            owner = best.indices
            split.heads = [int((owner == b).sum()) for b in range(batch)]
            split.uncovered = _uncovered(hs, grid, owner, tol)
            return split
        misplaced = int((dist.min(0).values > tol).sum())
        if fewest is None or misplaced < fewest[0]:
            fewest = (misplaced, layout, dist)
    # A counterexample in the layout that fits best: a row at another position's token, or at no token.
    assert fewest is not None
    _, layout, dist = fewest
    bad = (dist.min(0).values > tol).nonzero()
    if not len(bad):
        m = int(dist.amax(-1).min(0).values.argmax())
        split.mixed = f"{split.part} matrix {m} takes its rows from more than one sequence of the batch"
        return split
    m, i = (int(x) for x in bad[0])
    every = grids[layout].sort(-1).values.reshape(batch * length, width)
    row = hs[m, i].expand(1, batch * length, d)
    homes = [int(t) % length for t in (_nearest(row, every)[0] <= tol).nonzero().flatten()]
    split.mixed = (f"row {i} of {split.part} matrix {m} holds "
                   + (f"features of position {homes[0]}'s token, not position {i}'s" if homes and i not in homes
                      else "features of no single token (they come from several positions)"))
    return split


def _uncovered(hs: torch.Tensor, grid: torch.Tensor, owner: torch.Tensor, tol: float) -> str:
    """"" when, at every position of every sequence, the rows of its matrices together are distinct features of
    the token (each of its features used at most once; a packed projection's row also holds the other parts);
    else the first position where a feature is used twice. ``grid`` [B, L, D] holds the token rows, ``owner`` [N]
    the sequence of each matrix."""
    batch, length, width = grid.shape
    for b in range(batch):
        mine = hs[owner == b]  # [h, L, d]
        if not len(mine):
            continue
        together = mine.transpose(0, 1).reshape(length, -1)  # [L, h * d]
        size = together.size(-1)
        if size > width:
            return (f"sequence {b}: its {len(mine)} matrices hold {size} features per position, more than the "
                    f"token's {width}")
        for i in range(length):
            token = grid[b, i].sort().values  # [D]
            cluster = torch.cat([token.new_zeros(1, dtype=torch.long), ((token[1:] - token[:-1]) > tol).long()
                                 ]).cumsum(0)  # equal values (within tol) share a cluster
            values = together[i].contiguous()
            above = torch.searchsorted(token, values).clamp(max=width - 1)
            below = (above - 1).clamp(min=0)
            idx = torch.where((values - token[below]).abs() <= (values - token[above]).abs(), below, above)
            used = torch.bincount(cluster[idx], minlength=int(cluster[-1]) + 1)
            have = torch.bincount(cluster)
            over = used > have
            if bool(over.any()):
                return (f"sequence {b}, position {i}: its {len(mine)} matrices' rows use {int(over.sum())} of the "
                        f"token's projected features more than once ({int((used > 0).sum())} distinct of the "
                        f"{size} read)")
    return ""


def _subset_of(h: torch.Tensor, events: list[Event], before: int) -> tuple[float, int] | None:
    """(c, event index): the latest projection output before event position ``before`` holding every value of h
    divided by c, for c among the scales queries are commonly given (1, d^-1/2, d^-1/4 with d = h's last size):
    heads that repeat or leave out part of their projection (no permutation of it) are still traced to it."""
    values = h.reshape(-1).unique()
    d = h.size(-1)
    for ev in reversed(events[:before]):
        if not ev.param or ev.out is None or ev.out.numel() < values.numel():
            continue
        table = ev.out.reshape(-1).sort().values
        tol = 1e-5 * max(float(table.abs().max()), 1e-30)
        for c in (1.0, d ** -0.5, d ** -0.25):
            scaled = values / c
            idx = torch.searchsorted(table, scaled).clamp(1, table.numel() - 1)
            near = torch.minimum((scaled - table[idx - 1]).abs(), (scaled - table[idx]).abs())
            if float(near.max()) <= tol:
                return c, ev.index
    return None


def _projected(split: Split, h: torch.Tensor, events: list[Event], found: Source) -> Split:
    """``split`` measured for the per-head rows h [.., L, d], ``found`` (``_source``) times a projection's
    output."""
    if found is None:
        split.unread = f"the {split.part} are no scaled copy of (part of) a projection's output"
        return split
    proj = _event(events, found[1])
    split.proj_in = None if proj.act is None else proj.act.size(-1)
    split.proj_weight, split.proj_param = proj.weight, proj.param_name
    assert proj.out is not None
    return _split(split, h.reshape(-1, *h.shape[-2:]), proj.out, found[0], BATCH)


def _concatenated(split: Split, heads: torch.Tensor, events: list[Event], after: int) -> Split:
    """``split`` measured for the heads' outputs [.., Lq, d_v] against the input of the first projection after
    event position ``after`` that holds the same values (W^O's), up to the next attention."""
    ordered = heads.reshape(-1).sort().values
    for ev in events[after:]:
        if ev.op in _SOFTMAX:
            break
        if not ev.param or ev.act is None or ev.act.numel() != heads.numel():
            continue
        c, res = _fit(ev.act.reshape(-1).sort().values, ordered)
        if c > 0 and res < FIT:
            split.proj_in, split.proj_weight = ev.act.size(-1), ev.weight
            return _split(split, heads.reshape(-1, *heads.shape[-2:]), ev.act, 1 / c, BATCH)
    split.unread = "no projection after the attention reads its heads' outputs as they are"
    return split


def _attentions(rec: _Recorder) -> tuple[list[Attention], list[Scale], list[Split]]:
    """(the attention weights that reach the values, the scales of the scores every attention softmax normalizes,
    how each attention's operands were split into heads and its heads' outputs concatenated)."""
    events = rec.events
    found: list[Attention] = []
    scales: list[Scale] = []
    splits: list[Split] = []
    for pos, ev in enumerate(events):
        if ev.op in _SOFTMAX and ev.out is not None and ev.out.dim() >= 2:
            lq, lk = ev.out.shape[-2:]
            if is_attention(lq, lk):
                prod = _score_product(events, pos, lq, lk)
                if prod is None:
                    scales.append(Scale(lq, lk, "softmax", *_scale_chain(events, pos, lq, lk, None, (None, None)),
                                        peak=_peak(ev.operands[0], lq, lk)))
                    continue
                ppos = events.index(prod)
                q, k = prod.operands[0], prod.operands[1].transpose(-2, -1)  # [.., Lq, d_k], [.., Lk, d_k]
                found_q, found_k = _source(q, events, ppos), _source(k, events, ppos)
                scales.append(Scale(lq, lk, "softmax", *_scale_chain(events, pos, lq, lk, prod, (found_q, found_k)),
                                    peak=_peak(ev.operands[0], lq, lk)))
                splits.append(_projected(Split(lq, lk, "queries", "softmax"), q, events, found_q))
                splits.append(_projected(Split(lq, lk, "keys", "softmax"), k, events, found_k))
            continue
        if ev.op != "aten.bmm.default" or ev.param:
            continue
        w, v = ev.operands
        lq, lk = w.shape[-2:]
        if not is_attention(lq, lk) or v.size(-2) != lk:
            continue
        w = w.nan_to_num(0.0)
        sums = w.sum(-1)
        if bool((w < 0).any()) or bool((sums > 1 + 1e-3).any()) or not bool(((sums - 1).abs() < 1e-3).any()):
            continue  # not attention weights (a product of queries and keys, or values)
        found.append(Attention(lq, lk, w.reshape(-1, lq, lk), "softmax"))
        splits.append(_projected(Split(lq, lk, "values", "softmax"), v, events, _source(v, events, pos)))
        assert ev.out is not None
        splits.append(_concatenated(Split(lq, lk, "concatenation", "softmax"), ev.out, events, pos + 1))
    for at, name, bound, out in rec.sdpa:
        kernel = name.split(".")[1]
        q, k, w, c_s = _fused_weights(bound)
        lq, lk = w.shape[-2:]
        if not is_attention(lq, lk):
            continue
        found.append(Attention(lq, lk, w.reshape(-1, lq, lk), kernel))
        before = next((i for i, e in enumerate(events) if e.index > at), len(events))
        found_q, found_k = _source(q, events, before), _source(k, events, before)
        peak = _peak(q @ k.transpose(-2, -1) * c_s, lq, lk)
        if found_q is None or found_k is None:
            scales.append(Scale(lq, lk, kernel, None, "the fused kernel's q or k is no scaled copy of a projection "
                                                      "output", peak))
        else:
            scales.append(Scale(lq, lk, kernel, c_s * found_q[0] * found_k[0],
                                f"{kernel} with scale {c_s:.6g}, q = {found_q[0]:.6g} x the query projection, "
                                f"k = {found_k[0]:.6g} x the key projection; contracted size {q.size(-1)}", peak))
        v = _f64(bound["value"])
        found_v = _source(v, events, before)
        for part, h, origin in (("queries", q, found_q), ("keys", k, found_k), ("values", v, found_v)):
            splits.append(_projected(Split(lq, lk, part, kernel), h, events, origin))
        splits.append(_concatenated(Split(lq, lk, "concatenation", kernel), _f64(out), events, before))
    return found, scales, splits


def _lookups(rec: _Recorder, src: torch.Tensor, tgt: torch.Tensor) -> list[Lookup]:
    events = rec.events
    found: list[Lookup] = []
    for pos, ev in enumerate(events):
        if ev.op != "aten.embedding.default" or ev.indices is None or ev.out is None:
            continue
        ids = ev.indices.reshape(ev.indices.shape[:2]) if ev.indices.dim() > 2 and ev.indices[0, 0].numel() == 1 \
            else ev.indices  # OpenNMT-py's [L, B, 1] (one feature)
        stack, layout = "", ""
        for name, full, real in (("encoder", src, SRC_REAL), ("decoder", tgt, TGT_REAL)):
            for tokens in (full, full[:, :real]):  # the batch as given, or cut to its real length
                if tuple(ids.shape) == tuple(tokens.shape) and torch.equal(ids, tokens):
                    stack, layout = name, "BL"
                elif tuple(ids.shape) == tuple(tokens.t().shape) and torch.equal(ids, tokens.t()):
                    stack, layout = name, "LB"
        if not stack or ev.out.dim() != 3:
            continue
        e = ev.out if layout == "BL" else ev.out.transpose(0, 1)  # [B, L, d]
        sums: list[tuple[float, torch.Tensor]] = []  # (c, P [L, d]) of each result c x E + P(position), in order
        for later in events[pos + 1:]:
            if later.op in _SOFTMAX or later.op in _PRODUCTS and (later.param or later.op == "aten.bmm.default"):
                break  # the stack's input is read by a projection or an attention
            if later.op not in _ELEMENTWISE or later.out is None or later.out.shape != ev.out.shape:
                continue
            r = later.out if layout == "BL" else later.out.transpose(0, 1)
            de, dr = e - e.mean(0, keepdim=True), r - r.mean(0, keepdim=True)
            c, res = _fit(dr, de)
            if res > FIT:
                continue
            table = (r - c * e).mean(0, keepdim=True)
            if float((r - c * e - table).norm()) > FIT * max(float(r.norm()), 1e-30):
                continue
            sums.append((c, table[0]))
        # The first sum that adds something per position (later ones, such as x + x, are other clauses'), else the
        # last scaled copy of E (a stack without positions).
        added = [(c, t) for c, t in sums if float(t.abs().max()) > FIT * abs(c) * float(e.abs().max())]
        chosen = added[0] if added else sums[-1] if sums else None
        if chosen is None:
            found.append(Lookup(stack, None, f"no result after the {stack} embedding lookup is c x E + a per-position "
                                             "table"))
        else:
            c, table = chosen
            found.append(Lookup(stack, c, f"the sum after the {stack} embedding lookup is c x E + P(position) with c = "
                                          f"{c:.6g}", table, sums[-1]))
    return found


def witness(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, 7] source rows with 5 real tokens each, [2, 5] target rows with 4 (the same padding in every row)."""
    src = random_tokens(config, [SRC_REAL] * BATCH, SRC_LEN, vocab=config.src_vocab, seed=21)
    tgt = random_tokens(config, [TGT_REAL] * BATCH, TGT_LEN, vocab=config.tgt_vocab, seed=22)
    return src, tgt


EXTREME = 1e5  # the order of the scores a sharpened trace reaches (a finite mask fill of -1e4 then shows)


def trace_of(impl: Implementation, config: ModelConfig, *, sharpen: bool = False) -> Trace | str:
    """The trace of one eval forward of the implementation at its own weights on the witness (once per
    implementation, configuration and session), or the reason there is none. With ``sharpen``, the forward runs
    with every query projection the plain trace found multiplied by one factor, so that the attentions' scores
    reach the order of EXTREME (of 1e5): a masked score filled with a finite constant then shows."""
    memo = settings.current().cache("own-weight-traces")
    key = (impl.name, id(impl), config, sharpen)
    if key in memo:
        return memo[key]
    src, tgt = fitted(*witness(config), config)
    if tuple(src.shape) != (BATCH, SRC_LEN) or tuple(tgt.shape) != (BATCH, TGT_LEN):
        return (f"blocked by model.shape: the own-weights trace needs src [{BATCH}, {SRC_LEN}] and tgt "
                f"[{BATCH}, {TGT_LEN}]")
    model = build_model(impl, config)
    sharpened = ""
    if sharpen:
        plain = trace_of(impl, config)
        if isinstance(plain, str):
            return plain
        names = sorted({s.proj_param for s in plain.splits if s.part == "queries" and s.proj_param})
        peaks = [s.peak for s in plain.scales if s.peak]
        if not names or not peaks:
            memo[key] = ("own-weights trace at extreme scores: no query projection "
                         + ("was found" if not names else "whose scores were measured") + " to sharpen")
            return memo[key]
        factor = min(EXTREME / min(peaks), 10 * EXTREME / max(peaks))
        keys = {s.proj_param for s in plain.splits if s.part == "keys"}
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in names:  # a packed projection that also gives the keys scales the scores twice
                    p.mul_(math.sqrt(factor) if name in keys else factor)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        sharpened = (f"the {len(names)} query projection weights ({shown}) multiplied by {factor:.3g} (scores of "
                     f"order {EXTREME:g})")
    storages: dict[int, str] = {}
    for name, p in model.named_parameters():
        storages.setdefault(p.untyped_storage().data_ptr(), name)
    rec = _Recorder(storages)
    with rec:
        run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, check_finite=False)
    if rec.failure is not None:  # a reading could be missing or half made: none is used
        memo[key] = (f"own-weights trace: recording the forward's operations failed at {rec.failure} (the suite's "
                     "own failure, not a finding); no reading of this trace is used")
        return memo[key]
    attentions, scales, splits = _attentions(rec)
    trace = Trace(src, tgt, attentions, scales, _lookups(rec, src, tgt), rec.opaque, splits, sharpened)
    memo[key] = trace
    return trace


def observed(impl: Implementation, config: ModelConfig, *, sharpen: bool = False) -> Trace:
    """``trace_of``, skipping the check with its reason when there is no trace."""
    trace = trace_of(impl, config, sharpen=sharpen)
    if isinstance(trace, str):
        pytest.skip(trace)
    return trace


def real_queries(length: int) -> int:
    """How many leading positions of a witness sequence of ``length`` (as an attention sees it: padded, or cut to
    its real length) are real tokens."""
    return min(REAL[SIDE[length]], length)


def padded_keys(a: Attention) -> torch.Tensor:
    """[Lq, Lk] True at the padded keys of attention ``a``."""
    pads = torch.zeros(a.lq, a.lk, dtype=torch.bool)
    pads[:, real_queries(a.lk):] = True
    return pads


def named_scale(c: float, names: dict[float, str]) -> str:
    """``names[x]`` for the x within 0.1% of c, else ""."""
    return next((n for x, n in names.items() if abs(c / x - 1) < 1e-3), "")


OWN_WEIGHTS = (f"one eval forward at the model's own weights on src [{BATCH}, {SRC_LEN}] with {SRC_REAL} real tokens "
               f"per row and tgt [{BATCH}, {TGT_LEN}] with {TGT_REAL}, its ATen operations recorded")

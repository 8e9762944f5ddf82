"""Attention (§3.2): the scale (attention.scale), the softmax axis (attention.softmax-over-keys), the head
split and merge (attention.heads) and what cross-attention reads (attention.cross-source).

Three techniques, one room:

* variant attribution: the implementation holding the visible canonical weights is matched against the
  reference variants (``conformance.helpers.variants``); the clause fails when the variant that reproduces the
  implementation departs from it in this clause's part, and the message names what it does instead;
* metamorphic probes: the implementation against itself under weight changes whose effect the paper fixes,
  so bugs in other clauses cannot make them fail;
* attention kernels alone (``--component``, kind ``attention``): Eq. (1) against the float64 closed form.
  Kernel contract (implementations/builtins/components.py): ``fn(q, k, v, mask)`` with q, k, v [B, h, L, d_k], a
  boolean mask where True means "may attend", result [B, h, Lq, d_v]; a query with no allowed key gives zeros.
"""

from __future__ import annotations

import math

import pytest
import torch

from aiayn_conformance.implementations import Component, Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import Comparison, compare

from .helpers import oracles
from .helpers.census import blocked_by_layers
from .helpers.components import DK, DV, B, H, Kernel, call_kernel, from_factory, qkv
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import ImplementationError, describe_call, not_applicable, run_forward, seeded, violation
from .helpers.inputs import witness_batch
from .helpers.outputs import compare_real, log_probs
from .helpers.settings import AuditSettings
from .helpers.traces import BATCH, OWN_WEIGHTS, Split, named_scale, observed
from .helpers.transplant import STATE_SEED, transplanted, visible_state


@pytest.mark.clause("attention.scale")
def test_scale_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.1, Eq. (1): the variant that reproduces the implementation divides scores by sqrt(d_k)."""
    fail_on_variant_departure(
        impl, config, hint="scores divided by sqrt(d_model) instead of sqrt(d_k) is an extra factor 1/sqrt(h); "
                   "`scale = d ** -0.5` used as a divisor inverts it; forgetting the sqrt or the scale changes it")


@pytest.mark.clause("attention.softmax-over-keys")
def test_softmax_axis_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.1, Eq. (1): the softmax runs over the keys (the last axis of Q K^T)."""
    fail_on_variant_departure(
        impl, config, hint="softmax(dim=-2) or dim=2 on (B, h, Lq, Lk) scores normalizes over the queries; in "
                   "einsum('bhqk,bkhd->bqhd', weights, v) the key letter must be the same in both operands")


@pytest.mark.clause("attention.heads")
def test_heads_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.2: heads split and concatenated per position."""
    one_head(config)
    fail_on_variant_departure(
        impl, config, hint="(B, L, h, d_k) must be transposed to (B, h, L, d_k) before attention and back before the "
                   "reshape to (B, L, d_model); view/reshape alone mixes positions")


@pytest.mark.clause("attention.cross-source")
def test_cross_source_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3: cross-attention queries from the previous decoder sub-layer, keys/values from the final encoder."""
    fail_on_variant_departure(
        impl, config, hint="pass the output of the self-attention sub-layer (after its add & norm) as the query, and "
                           "the "
                   "output of the LAST encoder layer as memory")


@pytest.mark.clause("attention.scale")
def test_scale_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.1, Eq. (1) without a transplant: in one traced forward at the model's own weights, the scores every
    attention softmax (or fused kernel) normalizes are c * (q k^T) with q and k the projections' outputs (a head's
    slice, reshaped); c, measured wherever it was applied (on the scores, on q, on q and k), is 1/sqrt(d_k)."""
    trace = observed(impl, config)
    measured = [s for s in trace.scales if s.value is not None]
    if not measured:
        why = "; ".join(sorted({s.how for s in trace.scales}))
        pytest.skip(f"own-weights trace: the scale of no attention could be measured ({why})" if why
                    else trace.unseen("attention softmax or fused attention kernel"))
    d_k = config.d_k
    expected = d_k ** -0.5
    bad = [s for s in measured if s.value is not None and abs(s.value / expected - 1) > 1e-3]
    if bad:
        c = bad[0].value or 0.0
        names = {config.d_model ** -0.5: "1/sqrt(d_model)", 1.0: "1 (no scaling)", 1 / d_k: "1/d_k (no square root)",
                 d_k ** 0.5: "sqrt(d_k) (the scale inverted)", config.d_model ** 0.5: "sqrt(d_model)"}
        if config.d_v != d_k:  # Table 3, row B: the size of the values taken for the keys'
            names.setdefault(config.d_v ** -0.5, "1/sqrt(d_v) (the value size, not the key size)")
        named = named_scale(c, names)
        kinds = sorted({s.kind for s in bad})
        violation(measured=f"scores = {c:.6g} x (q k^T){f' = {named}' if named else ''} in {len(bad)} of "
                           f"{len(measured)} attention calls ({', '.join(kinds)}); {bad[0].how}",
                  expected=f"1/sqrt(d_k) = {expected:.6g} with {head_sizes(config)}",
                  call=OWN_WEIGHTS,
                  hint="divide by math.sqrt(d_k) with d_k the per-head key size (d_model // h in the paper), not "
                       "sqrt(d_model); "
                       "multiply by d_k ** -0.5, do not divide by it")


def heads_departure(s: Split, config: ModelConfig) -> str:
    """What one measured split or concatenation does that §3.2.2 does not, or ""."""
    h, d_k, d_v, d_model = config.n_heads, config.d_k, config.d_v, config.d_model
    where = f"the {s.kind}'s {s.part}"
    length = s.lq if s.part in ("queries", "concatenation") else s.lk
    tokens = BATCH * length
    if s.part != "concatenation" and s.proj_in is not None and s.proj_in != d_model:
        shared = (s.tokens == tokens * h and s.proj_in * h == d_model)
        return (f"{where} come from a projection with a {list(s.proj_weight)} weight reading {s.proj_in} features "
                f"per row, {s.tokens} rows for {tokens} tokens"
                + (f": each token is cut into h = {h} slices of {s.proj_in} features and one weight projects every "
                   "slice, so all heads share one projection" if shared else ""))
    if s.unread:
        return ""
    size, wanted = ("d_k", d_k) if s.part in ("queries", "keys") else ("d_v", d_v)
    if s.width != wanted:
        return (f"{where} form {s.matrices / BATCH:g} matrices per sequence of {s.width} features per row, not h = "
                f"{h} of {size} = {wanted}")
    if s.part == "concatenation" and s.token_width != h * d_v:
        return f"W^O reads {s.token_width} features per position, not the h x d_v = {h * d_v} of the heads"
    if s.mixed:
        return f"{where}: {s.mixed}"
    if s.heads and set(s.heads) != {h}:
        return f"{where} form {', '.join(map(str, s.heads))} matrices for the {BATCH} sequences, not h = {h} each"
    if s.uncovered:
        return f"{where}: {s.uncovered}"
    return ""


@pytest.mark.clause("attention.heads")
def test_heads_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.2 without a transplant: in one traced forward at the model's own weights, every attention's queries,
    keys and values are h matrices per sequence of d_k (d_v) features, each a head's slice of its projection
    (d_model features in), row i of each holding features of token i alone, the h slices of a token using each of
    its projected features at most once; the heads' outputs reach W^O concatenated per position. Which features
    form which head is not judged (a permutation of a projection's outputs is the same function); bias-free
    projections are not judged here (the transplant sets the biases to zero)."""
    one_head(config)
    trace = observed(impl, config)
    if not trace.splits:
        pytest.skip(trace.unseen("attention whose queries, keys and values could be followed"))
    for s in trace.splits:
        departure = heads_departure(s, config)
        if departure:
            violation(measured=f"{departure} ({s.where})",
                      expected=f"h = {config.n_heads} heads per sequence, head i = Attention(Q W_i^Q, K W_i^K, "
                               f"V W_i^V) with W_i of d_model x d_k = {config.d_model} x {config.d_k}; Concat(head_1.."
                               f"head_h) per position before W^O",
                      call=OWN_WEIGHTS,
                      hint="split with view(B, L, h, d_k).transpose(1, 2) and merge with transpose(1, 2) before "
                           "reshape(B, L, d_model); project all d_model features per head (one d_model x d_model "
                           "matrix, split after), not one d_k x d_k matrix shared by the heads")
    read = {s.part for s in trace.splits if not s.unread}
    missing = [p for p in ("queries", "keys", "values", "concatenation") if p not in read]
    if missing:
        why = "; ".join(sorted({s.unread for s in trace.splits if s.part in missing and s.unread})) or (
            "no product of attention weights (non-negative, each query's summing to 1) with values was seen")
        pytest.skip(f"own-weights trace: the {', '.join(missing)} of no attention could be followed ({why}); the "
                    "transplant-based checks judge attention.heads where the adapter can load the canonical weights")


# --------------------------------------------------------------------------------------------------
# Metamorphic probes: the implementation against itself
# --------------------------------------------------------------------------------------------------
def attention_prefixes(config: ModelConfig) -> tuple[str, ...]:
    """The canonical prefix of every attention of the model."""
    return tuple(f"encoder.{i}.self_attn" for i in range(config.n_layers)) + tuple(
        f"decoder.{i}.{kind}" for i in range(config.n_layers) for kind in ("self_attn", "cross_attn"))


def outputs(impl: Implementation, state: dict[str, torch.Tensor], config: ModelConfig) -> torch.Tensor:
    """Log-probabilities [B, T, V] on the witness batch of the implementation built for config holding state."""
    model = transplanted(impl, config, state, cache=False, scratch=True)
    src, tgt = witness_batch(config)
    return log_probs(model, impl, src, tgt, config)


def head_sizes(config: ModelConfig) -> str:
    """The per-head sizes for a message: "d_k = d_v = d_model / h = 512 / 8 = 64", or the given ones."""
    if config.paper_heads:
        return f"d_k = d_v = d_model / h = {config.d_model} / {config.n_heads} = {config.d_k}"
    return f"d_k = {config.d_k}, d_v = {config.d_v} as configured (Table 3, row B), h = {config.n_heads}"


def one_head(config: ModelConfig) -> None:
    """Not applicable with h = 1 (Table 3, row A): there is nothing to split, permute or concatenate."""
    if config.n_heads == 1:
        not_applicable("h = 1: a single head, which nothing is split from or concatenated with (Table 3, row A)")


def only_head_zero(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every attention keeps head 0 alone: rows d_k.. of W^Q and W^K, rows d_v.. of W^V and columns d_v.. of W^O
    are zero."""
    out = dict(state)
    for prefix in attention_prefixes(config):
        for p, size in (("q", config.d_k), ("k", config.d_k), ("v", config.d_v)):
            w = out[f"{prefix}.{p}.weight"].clone()
            w[size:] = 0.0
            out[f"{prefix}.{p}.weight"] = w
        w = out[f"{prefix}.o.weight"].clone()
        w[:, config.d_v:] = 0.0
        out[f"{prefix}.o.weight"] = w
    return out


# How the scale depends on the head size, inferred from the factor c that makes the h-head model (head 0 only)
# equal the 1-head model whose W^Q is multiplied by c (d_k = d_model / h there, d_model in the 1-head model).
def scale_laws(h: int) -> dict[str, tuple[float, str]]:
    return {
        "1/sqrt(d_k)": (h ** 0.5, "the paper's 1/sqrt(d_k)"),
        "independent of d_k": (1.0, "a scale that does not depend on the head size: 1/sqrt(d_model), or none"),
        "sqrt(d_k)": (h ** -0.5, "sqrt(d_k): the scale inverted"),
        "1/d_k": (float(h), "1/d_k: the square root forgotten"),
    }


@pytest.mark.clause("attention.scale")
def test_scale_follows_head_size(impl: Implementation, settings: AuditSettings, config: ModelConfig) -> None:
    """§3.2.1: with only head 0 active, the h-head model equals the 1-head model (same d_model) whose W^Q is
    multiplied by sqrt(h): d_k shrinks by h, so 1/sqrt(d_k) grows by sqrt(h). Bugs elsewhere act alike in
    both models; merged-heads bugs make the probe inconclusive (attention.heads judges them)."""
    if config.n_heads == 1:
        pytest.skip("attention.scale head-size probe: with h = 1, d_k = d_model and every law gives the same scores; "
                    "the variant test judges the scale")
    state = only_head_zero(visible_state(config, seed=STATE_SEED), config)
    many = outputs(impl, state, config)
    laws = scale_laws(config.n_heads)
    one_cfg = settings.others["one-head"]
    _, tgt = witness_batch(config)
    found: list[str] = []
    gaps: dict[str, float] = {}
    for law, (factor, _) in laws.items():
        one_state = dict(state)
        for prefix in attention_prefixes(config):
            one_state[f"{prefix}.q.weight"] = state[f"{prefix}.q.weight"] * factor
        cmp = compare_real(outputs(impl, one_state, one_cfg), many, tgt, config.pad_id, kind=impl.output)
        gaps[law] = cmp.max_abs
        if cmp.ok:
            found.append(law)
    if not found:
        pytest.skip("attention.scale head-size probe inconclusive: no scale law makes the h-head model (head 0 only) "
                    f"equal the 1-head model (max |diff| per law: {gaps}); the variant test judges the scale")
    if len(found) > 1:
        pytest.skip(f"attention.scale head-size probe inconclusive: the outputs do not depend on the scale (laws "
                    f"{', '.join(found)} all fit): attention scores do not reach the output")
    if "1/sqrt(d_k)" not in found:
        violation(measured=f"the scale behaves as {laws[found[0]][1]}: the {config.n_heads}-head model with only "
                           f"head 0 active equals the 1-head model with W^Q multiplied by "
                           f"{laws[found[0]][0]:.4g}",
                  expected=f"W^Q multiplied by sqrt(h) = {config.n_heads ** 0.5:.4g} (scores scaled by 1/sqrt(d_k), "
                           f"d_k = {config.d_k} with h = {config.n_heads}, d_k = {one_cfg.d_k} with h = 1)",
                  call=f"witness batch, d_model {config.d_model}, n_heads {config.n_heads} vs 1, load_reference_state "
                       f"of visible weights with heads 1.. zeroed in every attention",
                  hint="divide by math.sqrt(d_k) with d_k the per-head key size (d_model // h in the paper), not "
                       "sqrt(d_model); "
                       "multiply by d_k ** -0.5, do not divide by it")


@pytest.mark.clause("attention.heads")
def test_head_order_is_irrelevant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.2: heads are independent and concatenated per position, so permuting the heads (row blocks of
    W^Q, W^K, W^V together with the column blocks of W^O) leaves every output unchanged."""
    one_head(config)
    state = visible_state(config, seed=STATE_SEED)
    perm = torch.arange(config.n_heads).roll(1)  # head j takes head j-1's weights

    def rows(size: int) -> torch.Tensor:
        return (perm[:, None] * size + torch.arange(size)).reshape(-1)  # (h * size,)

    permuted = dict(state)
    for prefix in attention_prefixes(config):
        for p, size in (("q", config.d_k), ("k", config.d_k), ("v", config.d_v)):
            permuted[f"{prefix}.{p}.weight"] = state[f"{prefix}.{p}.weight"][rows(size)]
        permuted[f"{prefix}.o.weight"] = state[f"{prefix}.o.weight"][:, rows(config.d_v)]
    _, tgt = witness_batch(config)
    cmp = compare_real(outputs(impl, permuted, config), outputs(impl, state, config), tgt, config.pad_id,
                       kind=impl.output)
    if not cmp.ok:
        src, tgt = witness_batch(config)
        violation(measured=f"rotating the heads' weights changed the outputs: {cmp.describe()}",
                  expected="identical outputs: heads attend separately and are concatenated per position before W^O",
                  call=f"{describe_call(src, tgt, config.pad_id)}, visible weights vs the same with heads rotated "
                       f"(rows j*d_k..(j+1)*d_k of W^Q and W^K, rows j*d_v..(j+1)*d_v of W^V and the same "
                       f"columns of W^O; {head_sizes(config)})",
                  hint="heads split or merged with view/reshape but without transpose(1, 2) mix positions into "
                       "heads; or head j does not use rows j*d_k..(j+1)*d_k")


@pytest.mark.clause("attention.cross-source")
def test_cross_attention_reads_the_last_encoder_layer(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3: keys and values come from the final encoder output, so changing only the last encoder layer's
    second FFN matrix W2 must change the decoder's outputs (a matrix every implementation has: a model without FFN
    biases discards a change of b2, as the adapter contract allows)."""
    blocked = blocked_by_layers(impl, config)
    if blocked:
        pytest.skip(blocked)
    state = visible_state(config, seed=STATE_SEED)
    changed = dict(state)
    name = f"encoder.{config.n_layers - 1}.ffn.w2.weight"
    with seeded(3):
        changed[name] = state[name] + torch.randn(state[name].shape) / config.d_ff ** 0.5
    src, tgt = witness_batch(config)

    def raw(weights: dict[str, torch.Tensor]) -> torch.Tensor:  # any change counts, whatever the output kind
        model = transplanted(impl, config, weights, cache=False, scratch=True)
        log_probs(model, impl, src, tgt, config)  # skips a non-deterministic model
        return run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id).double()

    cmp = compare_real(raw(changed), raw(state), tgt, config.pad_id)
    if cmp.ok:
        violation(measured=f"changing {name} by N(0, 1 / d_ff) left every output unchanged ({cmp.describe()})",
                  expected="different outputs: cross-attention reads the output of the last encoder layer",
                  call=f"{describe_call(src, tgt, config.pad_id)} with visible weights vs the same with {name} changed",
                  hint="memory taken from the first or an intermediate encoder layer, or the encoder stack's output "
                       "discarded")


def positions_equal(impl: Implementation, state: dict[str, torch.Tensor],
                    config: ModelConfig) -> tuple[bool, Comparison]:
    """(every real target position of each row has position 0's log-probabilities, the worst comparison)."""
    src, tgt = witness_batch(config)
    model = transplanted(impl, config, state, cache=False, scratch=True)
    lp = log_probs(model, impl, src, tgt, config)
    first = lp[:, :1].expand_as(lp)  # (B, T, V)
    cmp = compare_real(lp, first, tgt, config.pad_id, kind=impl.output)
    return cmp.ok, cmp


def constant_norm(state: dict[str, torch.Tensor], name: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The state with norm ``name`` at gain 0 (its output is its bias, the same at every position)."""
    out = dict(state)
    out[f"{name}.weight"] = torch.zeros(config.d_model)
    return out


@pytest.mark.clause("attention.cross-source")
def test_cross_attention_queries_come_from_the_previous_sublayer(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3: the queries are the self-attention sub-layer's output. With decoder layer 0's first norm at gain 0
    that output is the same vector at every position, and so (keys and values being the encoder's) is everything
    after it: all target positions get the same distribution. Queries taken from the layer input (embedding +
    PE) keep the positions apart. Gate: with the second norm at gain 0 instead the positions must already
    agree (post-norm around the cross-attention, per-position heads); otherwise the probe is inconclusive."""
    state = visible_state(config, seed=STATE_SEED)
    gate_ok, gate = positions_equal(impl, constant_norm(state, "decoder.0.norm2", config), config)
    if not gate_ok:
        pytest.skip("cross-attention query probe inconclusive: with decoder.0.norm2 at gain 0 the target positions "
                    f"still differ ({gate.describe()}), so the layer is not post-norm around its cross-attention "
                    "(norm.post-norm, attention.heads and layers.independent judge that)")
    ok, cmp = positions_equal(impl, constant_norm(state, "decoder.0.norm1", config), config)
    if not ok:
        src, tgt = witness_batch(config)
        violation(measured=f"with decoder.0.norm1 at gain 0 the target positions still get different distributions "
                           f"({cmp.describe()}, position vs position 0 of its row)",
                  expected="the same distribution at every real target position: the cross-attention queries are the "
                           "self-attention sub-layer's (constant) output",
                  call=f"{describe_call(src, tgt, config.pad_id)} after load_reference_state(visible weights, "
                       "decoder.0.norm1.weight = 0); with decoder.0.norm2.weight = 0 instead, all positions agree",
                  hint="the cross-attention query is taken from the decoder layer's input (x) instead of the "
                       "output of the masked self-attention sub-layer after its add & norm")


# --------------------------------------------------------------------------------------------------
# Attention kernels alone (--component, kind attention)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(component: Component) -> Kernel:
    """The attention kernel the component's factory makes, once per module."""
    made: Kernel = from_factory(component)
    return made


def fitted_scale(kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float | None:
    """The s for which the kernel equals softmax(s q k^T) v, if one exists (log-space search)."""
    out = call_kernel(kernel, q, k, v, None)
    best, best_err = 1.0, float("inf")
    for log_s in torch.linspace(math.log(1e-3), math.log(1e2), 400).tolist():
        err = (out.double() - oracles.attention(q, k, v, scale=math.exp(log_s))).abs().max().item()
        if err < best_err:
            best, best_err = math.exp(log_s), err
    lo, hi = best / 1.03, best * 1.03
    for _ in range(60):  # golden-section refinement
        m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        e1 = (out.double() - oracles.attention(q, k, v, scale=m1)).abs().max().item()
        e2 = (out.double() - oracles.attention(q, k, v, scale=m2)).abs().max().item()
        lo, hi = (lo, m2) if e1 < e2 else (m1, hi)
    s = (lo + hi) / 2
    err = (out.double() - oracles.attention(q, k, v, scale=s)).abs().max().item()
    return s if err < 1e-4 else None


@pytest.mark.clause("attention.scale")
@pytest.mark.component_kind("attention")
@pytest.mark.parametrize("dv", [DK, DV], ids=["d_v=d_k", "d_v!=d_k"])
def test_kernel_scale_is_one_over_sqrt_dk(kernel: Kernel, dv: int) -> None:
    """With d_v = d_k (the paper's sizes) and d_v apart from it (Table 3, row B: a kernel that reads its scale
    from the values is seen there only; one that cannot take such values, as flash attention, is not judged at
    them)."""
    q, k, v = qkv(dv=dv)
    try:
        out = call_kernel(kernel, q, k, v, None)
    except ImplementationError as exc:
        if dv == DK or "raised" not in str(exc):  # a wrong shape back is a malfunction at any size
            raise
        pytest.skip(f"the kernel does not take values of d_v = {dv} beside keys of d_k = {DK} ({exc}): Table 3's "
                    "row B cannot run on it")
    cmp = compare(out, oracles.attention(q, k, v))
    if cmp.ok:
        return
    s = fitted_scale(kernel, q, k, v)
    if s is None:
        pytest.skip("the kernel does not compute softmax(s QK^T)V for any scale s; attention.softmax-over-keys "
                    "judges its form")
    names = {1 / math.sqrt(DK): "1/sqrt(d_k)", 1 / DK: "1/d_k", 1.0: "1 (no scaling)", math.sqrt(DK): "sqrt(d_k)",
             1 / math.sqrt(DK * H): "1/sqrt(h*d_k) = 1/sqrt(d_model)", 1 / math.sqrt(DV): "1/sqrt(d_v)"}
    label = min(names, key=lambda c: abs(math.log(c / s)))
    named = names[label] if abs(math.log(label / s)) < 0.01 else f"{s:.4g}"
    violation(measured=f"scores multiplied by {s:.6g} ({named}); {cmp.describe()}",
              expected=f"1/sqrt(d_k) = {1 / math.sqrt(DK):.6g} with d_k = {DK}",
              call=f"kernel(q, k [{B}, {H}, L, {DK}], v [{B}, {H}, L, {dv}] float64, mask=None)",
              hint="divide QK^T by sqrt(d_k), the per-head key size (q.size(-1)), not sqrt(d_model), not d_k and not "
                   "sqrt(d_v)")


@pytest.mark.clause("attention.softmax-over-keys")
@pytest.mark.component_kind("attention")
def test_kernel_weights_sum_to_one_over_keys(kernel: Kernel) -> None:
    """With V = I (Lk = d_v), the output rows are the attention weights."""
    q, k, _ = qkv(1, lk=DK)
    v = torch.eye(DK, dtype=torch.float64).expand(B, H, DK, DK)  # (B, h, Lk, d_v) = identity
    weights = call_kernel(kernel, q, k, v, None).double()  # (B, h, Lq, Lk)
    sums = weights.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6) or bool((weights < -1e-9).any()):
        over_queries = oracles.attention(q, k, v, axis="queries")
        hint = ("the softmax runs over the query axis (dim=-2)" if compare(weights, over_queries).ok
                else "the weights are not a softmax over the keys")
        worst = (sums - 1).abs().argmax().item()
        violation(measured=f"row sums of the weights range {sums.min().item():.4g}..{sums.max().item():.4g} "
                           f"(worst flat index {worst})",
                  expected="every query's weights are >= 0 and sum to 1 over the keys",
                  call=f"kernel(q [{B}, {H}, {q.size(2)}, {DK}], k [{B}, {H}, {DK}, {DK}], v = identity, "
                       "mask=None)",
                  hint=hint)

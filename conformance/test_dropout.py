"""dropout.residual (§5.4): dropout at P_drop on sub-layer outputs and embedding sums, before the residual
addition and the norm, in training only."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability

from .helpers import readout_probes as ro
from .helpers.harness import build_model, describe_call, run_forward, violation
from .helpers.inputs import witness_batch
from .helpers.outputs import log_probs
from .helpers.transplant import load_into, visible_state


@pytest.mark.clause("dropout.residual")
def test_no_randomness_when_p_drop_is_zero(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config.replace(dropout=0.0), train=True)
    src, tgt = witness_batch(config)
    a = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    b = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    if not torch.equal(a, b):
        diff = (a - b).abs().max().item()
        violation(measured=f"two train-mode calls with dropout=0 differ by up to {diff:.3g}",
                  expected="no randomness at all when P_drop = 0", call=describe_call(src, tgt) + " twice, train mode",
                  hint="a dropout rate hard-coded instead of taken from the configuration")


def dropped_fraction(h: torch.Tensor, tol: float = 1e-3) -> float:
    """Share of features per position that sit on the position's most common value (within ``tol``, well above
    the readout's rounding and well below the spacing of d_model kept values).

    LayerNorm maps every zeroed input feature to the same value, so with
    sub-layers off the dropped embedding features of a position coincide.
    """
    shares = []
    for vec in h.reshape(-1, h.size(-1)):
        ordered = vec.sort().values
        within = torch.searchsorted(ordered, ordered + tol, right=True) - torch.arange(ordered.numel())
        top = int(within.max())
        shares.append(top / vec.numel() if top > 1 else 0.0)
    return sum(shares) / len(shares)


@pytest.mark.clause("dropout.residual")
def test_embedding_sum_dropout_rate(impl: Implementation, config: ModelConfig) -> None:
    """Sub-layers off, unit norms, train mode at P_drop = 0.5: about half of each position's embedding+PE
    features are dropped before the (first) norm."""
    p = 0.5
    cfg = ro.readout_config(config).replace(dropout=p)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    state = ro.sublayers_off(visible_state(cfg, seed=71, unit_norms=True), "decoder")
    load_into(model, state, impl.name)
    torch.manual_seed(72)
    logp = log_probs(model, impl, *ro.witness(config), cfg)
    h, residual = ro.readout(logp, state["generator.weight"])
    if residual > 1e-3:
        pytest.skip("the hidden state cannot be read back")
    rate = dropped_fraction(h)
    if abs(rate - p) > 0.15:
        violation(measured=f"about {rate:.0%} of the decoder's embedding+PE features are dropped in train mode",
                  expected=f"P_drop = {p:.0%} of them (dropout on the sums of embeddings and positional encodings)",
                  call=f"forward in train mode, dropout={p}, every decoder sub-layer output zeroed, unit norms",
                  hint="dropout missing on the embedding sum, or a rate that ignores config.dropout")


# --------------------------------------------------------------------------------------------------
# The feed-forward sub-layer as a known constant: whatever the norm placement
# --------------------------------------------------------------------------------------------------
# With W2 = 0 and b2 = BIG * s (s alternating +1, -1), the last FFN sub-layer of a stack outputs BIG * s at every
# position, whatever its input: post-norm computes LN(x + Dropout(BIG s)), pre-norm x + Dropout(BIG s) (and a final
# norm, if any). BIG dwarfs the residual x, so in the stack's output each feature is either "kept" (BIG s_j / (1 - p),
# far from the rest) or "dropped" (what is left of x_j; the stack's other sub-layers are off, so that x stays of the
# order of the embedding sum). Which norm sits where does not matter: a norm is one affine
# map per position, and the kept and dropped features stay apart under it.
BIG = 100.0
P = 0.5


def signs(d: int) -> torch.Tensor:
    s = torch.ones(d)
    s[1::2] = -1.0
    return s


def head_block(config: ModelConfig) -> int:
    """Output features per head in the probes' W_O: d_model / h (d_k = d_v at the paper's sizes); head j writes
    features j*b..(j+1)*b. Skips the check where h does not divide d_model (given d_k, d_v: Table 3's row B)."""
    if config.d_model % config.n_heads:
        pytest.skip(f"the probe writes each head to its own block of d_model / h output features; d_model "
                    f"{config.d_model} is not divisible by h = {config.n_heads}")
    return config.d_model // config.n_heads


def head_columns(config: ModelConfig, *, scrambled: bool = False) -> torch.Tensor:
    """For each output feature i, the value feature (column of W_O) the probes' W_O reads: feature i % b of head
    i // b (b = :func:`head_block`), or, ``scrambled``, of head i % h, spreading every head over every block.
    At d_v = b, the identity (column i)."""
    b, h, d_v = head_block(config), config.n_heads, config.d_v
    i = torch.arange(config.d_model)
    head, within = (i % h, i // h) if scrambled else (i // b, i % b)
    return head * d_v + within % d_v


def last_prefix(stack: str, config: ModelConfig) -> str:
    return f"{stack}.{config.n_layers - 1}"


def constant_ffn_state(config: ModelConfig, stack: str, seed: int) -> dict[str, torch.Tensor]:
    """Unit norms, every other sub-layer of the stack off (output projection 0: the residual stays of the order
    of the embedding sum), the stack's last FFN outputting BIG * s (W2 = 0, b2 = BIG s)."""
    state = ro.sublayers_off(visible_state(config, seed=seed, unit_norms=True), stack)
    last = last_prefix(stack, config)
    state[f"{last}.ffn.w2.weight"] = torch.zeros_like(state[f"{last}.ffn.w2.weight"])
    state[f"{last}.ffn.w2.bias"] = BIG * signs(config.d_model)
    return state


def stack_output(impl: Implementation, stack: str, state: dict[str, torch.Tensor], config: ModelConfig,
                 train: bool, *, seeds: tuple[int, ...] = (81,), first: bool = False) -> torch.Tensor:
    """The stack's output at real positions [n, d_model] (float64) with ``state`` loaded, in train mode at P_drop
    = P or in eval mode, one call per seed in ``seeds`` (rows concatenated); ``first``: the first position of each
    row only [B * len(seeds), d_model].
    Skips when it cannot be observed (no load_reference_state, no readout, no encode)."""
    model = build_model(impl, config, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    if stack == "encoder" and not has_capability(model, "encode"):
        pytest.skip(f"{impl.name} has no encode(src): the encoder's output cannot be read")
    load_into(model, state, impl.name)
    model.train(train)
    return torch.cat([_read(model, impl, stack, state, config, seed, first) for seed in seeds])


UNREADABLE = ("the hidden state cannot be read back (the output projection is not the tied embedding, or the output "
              "saturates)")


def _read(model: Any, impl: Implementation, stack: str, state: dict[str, torch.Tensor], config: ModelConfig,
          seed: int, first: bool) -> torch.Tensor:
    h = _read_or_none(model, impl, stack, state, config, seed, first)
    if h is None:
        pytest.skip(UNREADABLE)
    return h


def _read_or_none(model: Any, impl: Implementation, stack: str, state: dict[str, torch.Tensor], config: ModelConfig,
                  seed: int, first: bool) -> torch.Tensor | None:
    torch.manual_seed(seed)
    src, tgt = ro.witness(config)
    if stack == "decoder":
        h, residual = ro.readout(log_probs(model, impl, src, tgt, config), state["generator.weight"])
        if residual > 1e-3:
            return None
        return h[:, 0] if first else h[tgt != config.pad_id]
    with torch.no_grad():
        out = model.encode(src)
    out = (out[0] if isinstance(out, (tuple, list)) else out).double()
    return out[src != config.pad_id]


def kept_features(h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per row, which features carry the constant (bool [n, d]): sign-aligned values above half the row's largest."""
    t = h * s.double()
    return t > 0.5 * t.max(-1, keepdim=True).values


# --------------------------------------------------------------------------------------------------
# Every sub-layer's output as a known constant, one sub-layer at a time
# --------------------------------------------------------------------------------------------------
# The device above at each sub-layer of each layer, in turn: every other sub-layer of both stacks off, the probed
# one outputting G * f * s at every position (f > 0, one value per row or per head). The FFN gets W2 = 0 and
# b2 = BIG s (G = BIG, f = 1). An attention sub-layer has no bias, so its output is made constant through its
# values: every witness token's embedding (padding included) carries LIFT * u / sqrt(d_model),
# u = (+1, +1, -1, -1, ...) orthogonal to s, so that each sub-layer's input (the embedding sum, or a norm of it, or
# the encoder's output for the cross-attention) is about LIFT * u (or a multiple of u) plus terms of order one at
# every position; W_V writes u . y / (d_model LIFT) into every value feature (a positive number, about the same at
# every key: about 1 on the embedding sum, 1 / LIFT on a norm of it) and W_O = diag(G s), G = 10 BIG, writes it
# back along s. A softmax-weighted mean of equal positive values is that value, whatever the weights (and whatever
# the masks). Dropout on the attention weights (dropout.extra-sites) scales each head's block of d_k features by a
# factor of its own, or zeroes it: kept features are told from dropped ones block by block, and a block that carries
# nothing (every weight of its head dropped) is left out. A dropped feature keeps the residual alone (of the order
# of LIFT at most), a kept one adds the constant (G / LIFT = 125 times f or more, before the 1 / (1 - P_drop)):
# "kept" means above KEPT times its block's largest, so that an output added to its own dropped copy
# (F + Dropout(F): F or 3 F, never 0) is not mistaken for a dropped one.
LIFT = 8.0
KEPT = 0.25
SUBLAYERS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "cross_attn", "ffn")}
SUBLAYER_NAMES = {"self_attn": "self-attention", "cross_attn": "cross-attention", "ffn": "feed-forward"}


def lifted_state(config: ModelConfig, src: torch.Tensor, tgt: torch.Tensor) -> dict[str, torch.Tensor]:
    """Unit norms, every sub-layer of both stacks off, each token of ``src`` and ``tgt`` (padding included) embedded
    with an extra LIFT * u / sqrt(d_model) (ties kept: one tensor lifted once)."""
    state = ro.sublayers_off(ro.sublayers_off(visible_state(config, seed=73, unit_norms=True), "encoder"), "decoder")
    rows: dict[int, set[int]] = {}
    for name, tokens in (("src_embed.weight", src), ("tgt_embed.weight", tgt)):
        rows.setdefault(id(state[name]), set()).update(tokens.flatten().tolist())  # padding too: a model that
        # attends to padded keys (mask.source-padding) still averages equal values
    lifted: dict[int, torch.Tensor] = {}
    for name in ("src_embed.weight", "tgt_embed.weight"):
        table = state[name]
        if id(table) not in lifted:
            new = table.clone()
            new[sorted(rows[id(table)])] += LIFT / config.d_model ** 0.5 * lift_direction(config.d_model)
            lifted[id(table)] = new
    return {k: lifted.get(id(v), v) for k, v in state.items()}


def lift_direction(d: int) -> torch.Tensor:
    """u = (+1, +1, -1, -1, ...): mean 0 (a norm keeps it) and orthogonal to :func:`signs`."""
    u = torch.ones(d)
    u[2::4] = -1.0
    u[3::4] = -1.0
    return u


def constant_sublayer_state(base: dict[str, torch.Tensor], config: ModelConfig,
                            prefix: str) -> dict[str, torch.Tensor]:
    """``base`` (a :func:`lifted_state`) with the sub-layer ``prefix`` ("decoder.0.cross_attn") outputting
    G * f * s."""
    d, s = config.d_model, signs(config.d_model)
    state = dict(base)
    if prefix.endswith(".ffn"):
        state[f"{prefix}.w2.weight"] = torch.zeros(d, config.d_ff)
        state[f"{prefix}.w2.bias"] = BIG * s
    else:
        hd_v = config.n_heads * config.d_v
        state[f"{prefix}.v.weight"] = torch.outer(torch.ones(hd_v), lift_direction(d)) / (d * LIFT)  # (h d_v, d)
        w_o = torch.zeros(d, hd_v)  # (d_model, h d_v): diag(G s) at d_v = d_model / h
        w_o[torch.arange(d), head_columns(config)] = 10 * BIG * s
        state[f"{prefix}.o.weight"] = w_o
    return state


def kept_in_blocks(h: torch.Tensor, s: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, counted), bool [n, d]. Centred on the row's median (which lies between the features along +s and
    those along -s, whatever the norm's shift), a kept feature stands out along s above KEPT times its block's largest;
    a block counts when it carries the constant at all (above a quarter of the row's largest block)."""
    centred = (h - h.quantile(0.5, dim=-1, keepdim=True)) * s.double()
    blocks = centred.reshape(h.size(0), -1, block)  # (n, h, d_model / h): one block per head
    top = blocks.max(-1, keepdim=True).values
    kept = blocks > KEPT * top
    counted = (top > 0) & (top > 0.25 * top.max(1, keepdim=True).values)
    return kept.reshape(h.shape), counted.expand_as(blocks).reshape(h.shape)


def observed(model: Any, impl: Implementation, stack: str, state: dict[str, torch.Tensor], config: ModelConfig,
             train: bool) -> torch.Tensor | None:
    load_into(model, state, impl.name)
    model.train(train)
    return _read_or_none(model, impl, stack, state, config, 81, False)


def probe_model(impl: Implementation, stack: str, config: ModelConfig) -> Any:
    model = build_model(impl, config, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    if stack == "encoder" and not has_capability(model, "encode"):
        pytest.skip(f"{impl.name} has no encode(src): the encoder's output cannot be read")
    return model


class SublayerFindings:
    """Per probed sub-layer ("layer 0 cross-attention"): the train-mode drop rate, whether the dropped features
    coincide; the sub-layers that could not be made to output the constant."""

    def __init__(self) -> None:
        self.rates: dict[str, float] = {}
        self.merged: list[str] = []
        self.unseen: list[str] = []

    def off(self) -> dict[str, float]:
        return {name: rate for name, rate in self.rates.items() if abs(rate - P) > 0.15}

    def listing(self, names: list[str] | dict[str, float]) -> str:
        return ", ".join(f"{name} {self.rates[name]:.0%}" for name in names)


def probe_sublayers(impl: Implementation, stack: str, config: ModelConfig) -> SublayerFindings:
    model = probe_model(impl, stack, config)
    s, block = signs(config.d_model), head_block(config)
    base = lifted_state(config, *ro.witness(config))
    found = SublayerFindings()
    for layer in range(config.n_layers):
        for sublayer in SUBLAYERS[stack]:
            name = f"layer {layer} {SUBLAYER_NAMES[sublayer]}"
            state = constant_sublayer_state(base, config, f"{stack}.{layer}.{sublayer}")
            evaluated = observed(model, impl, stack, state, config, False)
            if evaluated is None or not bool(kept_in_blocks(evaluated, s, block)[0].all()):
                found.unseen.append(name)
                continue
            trained = observed(model, impl, stack, state, config, True)
            if trained is None:
                found.unseen.append(name)
                continue
            kept, counted = kept_in_blocks(trained, s, block)
            found.rates[name] = 1 - kept[counted].double().mean().item()
            dropped = trained[counted & ~kept]
            spread = (dropped.std() / (trained.max() - trained.min())).item() if dropped.numel() > 1 else 1.0
            if spread < 1e-5:
                found.merged.append(name)
    return found


@pytest.mark.clause("dropout.residual")
@pytest.mark.parametrize("stack", ["decoder", "encoder"])
def test_sublayer_output_dropped_before_the_residual_addition(impl: Implementation, stack: str,
                                                              config: ModelConfig) -> None:
    """Every sub-layer's output (self-attention and FFN in the encoder; self-attention, cross-attention and FFN in
    the decoder; in every layer) is dropped at P_drop before the residual addition: about P_drop of its features
    are lost in train mode (none in eval mode), and a lost feature leaves the residual x_j behind
    (LayerNorm(x + Dropout(F(x))), or x + Dropout(F(LN(x))) in a pre-norm model): dropped features that all
    coincide mean the dropout came after the addition, taking the residual with it. A sub-layer whose constant
    does not reach the output (another structure, or a saturated readout) is left out; the check passes only when
    each kind of sub-layer of the stack was observed in at least one layer."""
    config = ro.readout_config(config).replace(dropout=P)
    found = probe_sublayers(impl, stack, config)
    if not found.rates:
        pytest.skip(f"no {stack} sub-layer could be made to output a large constant (the eval-mode output does not "
                    "carry it at every feature): another structure (model.reference-equivalence reports it)")
    call = (f"{stack} in train mode and in eval mode, dropout={P}, unit norms, one sub-layer at a time outputting "
            f"G * f * (+1, -1, ...) (FFN: W2 = 0, G = {BIG:g}; attention: W_V, W_O = diag(G s) with "
            f"G = {10 * BIG:g}, the embeddings lifted along (+1, +1, -1, -1, ...)), every other sub-layer off, the "
            f"{stack}'s output read back")
    off = found.off()
    if off:
        fine = [name for name in found.rates if name not in off]
        violation(measured=f"in train mode the share of each {stack} sub-layer's output features dropped is "
                           f"{found.listing(off)}" + (f" (as expected: {found.listing(fine)})" if fine else ""),
                  expected=f"P_drop = {P:.0%} at every sub-layer output (§5.4), whatever the norm placement",
                  call=call,
                  hint=f"apply dropout to the output of each sub-layer named ({', '.join(off)}) before the residual "
                       "addition (x + dropout(sublayer(...))), at config.dropout")
    if found.merged:
        violation(measured=f"at the output of {', '.join(found.merged)} the dropped features all take one value: "
                           "the residual x was dropped with the sub-layer output",
                  expected="a dropped feature keeps the residual x_j: x + Dropout(F) (and its norm)", call=call,
                  hint="dropout applied after the residual addition (dropout(x + sublayer(x))) or after the add & "
                       "norm: drop the sub-layer output alone, before adding x")
    kinds = {SUBLAYER_NAMES[sublayer] for sublayer in SUBLAYERS[stack]}
    missing = sorted(kinds - {name.split(" ", 2)[2] for name in found.rates})
    if missing:
        pytest.skip(f"{', '.join(found.rates)} drop P_drop of their outputs; no {' or '.join(missing)} sub-layer "
                    f"could be observed ({', '.join(found.unseen)}: the eval-mode output does not carry the constant "
                    "at every feature, or cannot be read back)")


@pytest.mark.clause("dropout.residual")
def test_post_norm_outputs_stay_normalized_in_train_mode(impl: Implementation, config: ModelConfig) -> None:
    """§5.4 drops each sub-layer's output "before it is added to the sub-layer input and normalized": with unit
    norms the decoder's output is a layer norm's output, mean 0 and variance 1 per position, in train mode as in
    eval mode. Dropout after the add & norm (Dropout(LayerNorm(x + F(x)))) zeroes some of those features and
    scales the rest by 1/(1 - P_drop)."""
    p = 0.5
    cfg = ro.readout_config(config).replace(dropout=p)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    state = visible_state(cfg, seed=75, unit_norms=True)
    load_into(model, state, impl.name)

    src, tgt = ro.witness(config)

    def hidden(train: bool) -> torch.Tensor | None:
        model.train(train)
        torch.manual_seed(76)
        h, residual = ro.readout(log_probs(model, impl, src, tgt, cfg), state["generator.weight"])
        return h[tgt != cfg.pad_id] if residual <= 1e-3 else None

    evaluated, trained = hidden(False), hidden(True)
    if evaluated is None or trained is None:
        pytest.skip("the hidden state cannot be read back")
    if not normalized(evaluated):
        pytest.skip("not a post-norm output (with unit norms the eval-mode output is not a layer norm's): where the "
                    "dropout sits is judged by test_sublayer_output_dropped_before_the_residual_addition, whatever "
                    "the norm placement")
    if not normalized(trained):
        var = trained.var(-1, unbiased=False)
        zeros = (trained.abs() < 1e-6).float().mean().item()
        violation(measured=f"in train mode (dropout {p}) the decoder's output has per-position variance "
                           f"{var.min().item():.3g}..{var.max().item():.3g} and {zeros:.0%} exact zeros; in eval mode "
                           "it is normalized (mean 0, variance 1)",
                  expected="LayerNorm(x + Dropout(Sublayer(x))): the layer's output is normalized in train mode too",
                  call=f"forward in train mode and in eval mode, dropout={p}, unit norms, hidden state read back",
                  hint="dropout applied after the add & norm (Dropout(LayerNorm(x + F(x)))) or on the stack's "
                       "output: drop the sub-layer output before the residual addition")


def normalized(h: torch.Tensor, tol: float = 1e-3) -> bool:
    """Every row has mean 0 and biased variance 1 (within ``tol``)."""
    mean, var = h.mean(-1), h.var(-1, unbiased=False)
    return bool((mean.abs() < tol).all() and ((var - 1).abs() < tol).all())


# --------------------------------------------------------------------------------------------------
# dropout.extra-sites: dropout on the attention weights or inside the FFN
# --------------------------------------------------------------------------------------------------
# The same constant-output device, one level further in. With the last decoder layer's FFN inner units all at 1
# (W1 = 0, b1 = 1) and W2 summing two of them into each output feature (times BIG s_j / 2),
# the FFN outputs BIG s in eval mode; dropout between W1 and W2 makes a feature's value depend on how many of its
# units survived, so the kept features of a row take several levels instead of one. With the last decoder layer's
# self-attention fed a constant vector (the norm before it at gain 0, bias 1) and W_V = I, W_O = diag(BIG s), every
# query's output is BIG s whatever its weights, since the weights sum to 1; dropout on the weights rescales each
# head's block of features by (kept weight) / (1 - p), again several levels. Dropout on the sub-layer output alone
# zeroes features and scales the rest by one factor: one level.
PAPER_SITES = ("§5.4 names two dropout sites, the sub-layer outputs and the embedding sums; §6.3 mentions attention "
               "dropout only as a hyperparameter tuned for parsing. tensor2tensor's transformer_base of the paper's "
               "time (v1) set attention_dropout and relu_dropout to 0, later versions to 0.1: common practice, not "
               "the paper's base model")


def levels(values: torch.Tensor, span: float) -> int:
    """How many distinct levels the values take: clusters separated by more than a tenth of ``span``."""
    v = values.sort().values
    if v.numel() < 2:
        return v.numel()
    return 1 + int(((v[1:] - v[:-1]) > 0.1 * span).sum().item())


def row_levels(h: torch.Tensor, s: torch.Tensor) -> list[int]:
    """Per row and sign group of features, how many levels the features take, gaps measured against the row's
    range: one in eval mode, at most two (dropped, kept) with dropout on the sub-layer output alone."""
    out = []
    for row in h:
        span = (row.max() - row.min()).item()
        for sign in (1.0, -1.0):
            out.append(levels(row[s == sign], span))
    return out


def share_with_several_levels(h: torch.Tensor, s: torch.Tensor) -> float:
    """The share of (row, sign group) pairs whose features take three or more levels."""
    found = row_levels(h, s)
    return sum(n >= 3 for n in found) / len(found)


def output_dropout_alone_adds_levels(impl: Implementation, config: ModelConfig) -> bool:
    """The control: the last decoder FFN a constant (W2 = 0), every other decoder sub-layer off, so neither the
    attention weights nor the FFN's hidden units reach the output; three or more levels there come from dropout
    after the residual addition or the norm."""
    trained = stack_output(impl, "decoder", constant_ffn_state(config, "decoder", seed=93), config, train=True)
    return share_with_several_levels(trained, signs(config.d_model)) >= 0.15


UNITS = 2  # inner units summed into each output feature


def inner_ffn_state(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Each output feature j sums UNITS inner units (2j, 2j + 1, modulo d_ff): a feature with k of them kept takes
    BIG * k / (UNITS (1 - p)), levels a tenth of the row's range apart whatever d_ff is. (Summing all d_ff / d_model
    units into each feature made the levels too close to count at a large d_ff: FFN dropout passed at d_ff 2048.)"""
    state = ro.sublayers_off(visible_state(config, seed=91, unit_norms=True), "decoder")
    last, d, d_ff = last_prefix("decoder", config), config.d_model, config.d_ff
    w2 = torch.zeros(d, d_ff)
    for j in range(d):
        for u in range(UNITS):
            w2[j, (UNITS * j + u) % d_ff] += BIG / UNITS
    state[f"{last}.ffn.w1.weight"] = torch.zeros(d_ff, d)
    state[f"{last}.ffn.w1.bias"] = torch.ones(d_ff)
    state[f"{last}.ffn.w2.weight"] = w2 * signs(d)[:, None]
    state[f"{last}.ffn.w2.bias"] = torch.zeros(d)
    return state


def attention_states(config: ModelConfig, *, scrambled: bool = False) -> list[dict[str, torch.Tensor]]:
    """The last decoder self-attention fed a constant: by the previous layer's last norm (post-norm) or by its own
    norm (pre-norm); the check keeps the one under which the eval-mode output carries BIG s. W_O writes head j's
    features to the j-th block of d_model / h output features, or, ``scrambled``, spreads each head over every
    block. Value feature c copies input feature c % d_model: a constant input gives equal values."""
    last, d, hd_v = last_prefix("decoder", config), config.d_model, config.n_heads * config.d_v
    base = ro.sublayers_off(visible_state(config, seed=92, unit_norms=True), "decoder")
    w_v = torch.zeros(hd_v, d)  # (h d_v, d_model): the identity at d_v = d_model / h
    w_v[torch.arange(hd_v), torch.arange(hd_v) % d] = 1.0
    base[f"{last}.self_attn.v.weight"] = w_v
    w_o = torch.zeros(d, hd_v)  # (d_model, h d_v)
    w_o[torch.arange(d), head_columns(config, scrambled=scrambled)] = BIG * signs(d)
    base[f"{last}.self_attn.o.weight"] = w_o
    feeders = [f"decoder.{config.n_layers - 2}.norm3"] if config.n_layers > 1 else []
    states = []
    for norm in (*feeders, f"{last}.norm1"):
        state = dict(base)
        state[f"{norm}.weight"] = torch.zeros(d)
        state[f"{norm}.bias"] = torch.ones(d)
        states.append(state)
    return states


def chosen_state(impl: Implementation, states: list[dict[str, torch.Tensor]], config: ModelConfig,
                 site: str) -> dict[str, torch.Tensor]:
    """The first state under which the eval-mode decoder output carries BIG s at every feature, at one level."""
    s = signs(config.d_model)
    for state in states:
        evaluated = stack_output(impl, "decoder", state, config, train=False)
        if bool(kept_features(evaluated, s).all()) and max(row_levels(evaluated, s)) == 1:
            return state
    pytest.skip(f"the last decoder layer's {site} cannot be made to output a known constant (another structure: "
                "model.reference-equivalence reports it)")


def extra_site(site: str, measured: str, hint: str) -> None:
    violation(measured=measured, expected=f"dropout on the sub-layer output only. {PAPER_SITES}",
              call=f"decoder in train mode and eval mode, dropout={P}, unit norms, other decoder sub-layers off, "
                   f"the last {site} built to output {BIG:g} * (+1, -1, ...) whatever its input", hint=hint)


@pytest.mark.clause("dropout.extra-sites")
def test_no_dropout_inside_the_feed_forward_network(impl: Implementation, config: ModelConfig) -> None:
    """Output dropout alone leaves two levels per sign of the constant (dropped, kept); dropout between W1 and W2
    adds levels (a feature whose units were partly dropped)."""
    config = ro.readout_config(config).replace(dropout=P)
    state = chosen_state(impl, [inner_ffn_state(config)], config, "feed-forward network")
    several = share_with_several_levels(stack_output(impl, "decoder", state, config, train=True), signs(config.d_model))
    if several < 0.15:
        return
    if output_dropout_alone_adds_levels(impl, config):
        pytest.skip("blocked by dropout.residual: with the FFN's inside out of play (W2 = 0) the output already takes "
                    "three or more levels, so dropout acts after the residual addition or the norm, and extra levels "
                    "cannot be attributed to the FFN")
    extra_site("feed-forward network",
               f"in train mode (dropout {P}) the output features of the last decoder FFN sub-layer take three or more "
               f"levels in {several:.0%} of the rows, one in eval mode and two with output dropout alone: the FFN's "
               "hidden units are dropped",
               "dropout between the FFN's two layers (w2(dropout(relu(w1(x)))), as nn.TransformerEncoderLayer has): "
               "the paper's base model has none; remove it (or set it to 0) to follow §5.4")


BLOCKS = 256  # head blocks the statistic is taken over: 32 draws of TINY's 2 rows x 4 heads


def runs(config: ModelConfig) -> int:
    """Train-mode calls (dropout draws) for the head-block statistic: enough for BLOCKS blocks of the witness's
    first positions (2 rows, one block per head), so that a model with more heads needs fewer draws (32 at most,
    TINY's count)."""
    return min(32, max(4, -(-BLOCKS // (ro.witness(config)[1].size(0) * config.n_heads))))


@pytest.mark.clause("dropout.extra-sites")
def test_no_dropout_on_the_attention_weights(impl: Implementation, config: ModelConfig) -> None:
    """At the first target position the decoder self-attention has one admissible key, weight 1: dropping the
    attention weights zeroes a whole head's block of features (d_k of them) with probability P_drop, while dropout
    on features (the sub-layer output, or anything upstream or after the norm) drops a block only when each of its
    d_k features is dropped on its own, as often whichever head wrote them. The control spreads each head over
    every block: whole-block drops that the head layout alone explains are the attention weights'."""
    config = ro.readout_config(config).replace(dropout=P)
    aligned = attention_states(config)
    state = chosen_state(impl, aligned, config, "self-attention")
    scrambled = attention_states(config, scrambled=True)[next(i for i, st in enumerate(aligned) if st is state)]
    whole, control = (whole_blocks_dropped(impl, st, config) for st in (state, scrambled))
    if whole - control > 0.15 or (whole > 0.05 and whole > 4 * control):
        extra_site("self-attention",
                   f"in train mode (dropout {P}), at the first target position (one admissible key), {whole:.0%} of "
                   f"the blocks of {head_block(config)} features that one head writes are dropped whole over "
                   f"{runs(config)} draws, "
                   f"against {control:.0%} when each head's features are spread over every block: a whole head is "
                   "dropped at once, so the attention weights are dropped",
                   "dropout on the softmax weights (nn.MultiheadAttention(dropout=p), dropout(p_attn)): the paper's "
                   "base model has none; pass 0 to it to follow §5.4")


def whole_blocks_dropped(impl: Implementation, state: dict[str, torch.Tensor], config: ModelConfig) -> float:
    """Over ``runs(config)`` train-mode draws, the share of blocks of d_model / h consecutive output features at the
    first target position whose every feature is dropped."""
    s, block = signs(config.d_model), head_block(config)
    first = stack_output(impl, "decoder", state, config, train=True, seeds=tuple(range(100, 100 + runs(config))),
                         first=True)
    dropped = ~kept_features(first, s)  # (runs * B, d)
    return dropped.reshape(first.size(0), config.n_heads, block).all(-1).double().mean().item()

"""Readout probes: the decoder's final hidden state read back from the output, and closed-form probes
built on it.

With the canonical (tied) pre-softmax matrix E [V, d_model] loaded, the model's
log-probabilities are ``h E^T - c`` with ``c`` the per-position log-partition.
When V > d_model and the all-ones vector is not in the span of E's columns,
``[E, 1] [h; -c] = log_probs`` has exactly one solution: the hidden state h
of every position is observable without hooks. The probes run at
:func:`readout_config`, whose vocabulary is at least four times d_model, so
that the solution is well conditioned at every width (float32's rounding of
the log-probabilities stays far below the probes' tolerance in h). The probes below choose
canonical weights for which the paper's model has a closed-form h (a norm
gain of zero makes the next sub-layer's input a known constant; every
sub-layer output zeroed leaves the input path), so a mismatch can be
attributed to one sub-layer.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, Literal

import pytest
import torch

from aiayn_conformance.reference.model import sinusoid_table
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability

from . import oracles
from .harness import build_model, violation
from .inputs import fitted, random_tokens
from .outputs import determinism_judged, log_probs, require_deterministic
from .settings import READOUT_VOCAB_PER_FEATURE, readout_config
from .transplant import load_into, scratch_model, visible_state

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["readout", "hidden_states", "post_norm_probe", "last_sublayer_diagnosis", "last_norm_divisor",
           "sublayers_off", "negative_side_probe", "output_scale", "blocked_by_output_scale",
           "zero_gain_state", "check_input_path", "last_layer", "witness", "readout_config"]

def witness(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The probes' input, fitted to the shapes the implementation under test accepts."""
    src = random_tokens(config, [6, 4], 6, vocab=config.src_vocab, seed=31)
    tgt = random_tokens(config, [5, 5], 5, vocab=config.tgt_vocab, seed=32)
    return fitted(src, tgt, config)


def last_layer(config: ModelConfig) -> str:
    """The canonical prefix of the last decoder layer."""
    return f"decoder.{config.n_layers - 1}"


def readout(logp: torch.Tensor, generator: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Solve [E, 1][h; -c] = log_probs per position: h [B, T, d] and the worst residual. A large vocabulary is read
    on 4 (d + 1) of its rows, enough for one solution, which the other rows cannot change."""
    rows = min(generator.size(0), READOUT_VOCAB_PER_FEATURE * (generator.size(1) + 1))
    logp = logp[..., :rows]
    A, Q, R = _factored(generator, rows)
    rhs = logp.double().reshape(-1, logp.size(-1)).T  # (V, B*T)
    if R is None:
        sol = torch.linalg.lstsq(A, rhs).solution  # (d + 1, B*T)
    else:  # the least-squares solution from A = QR, A's factors computed once per generator
        sol = torch.linalg.solve_triangular(R, Q.T @ rhs, upper=True)
    residual = (A @ sol - rhs).abs().max().item()
    h = sol[:-1].T.reshape(*logp.shape[:-1], generator.size(1))  # (B, T, d)
    return h, residual


# id(generator) -> (a weak reference to it, its _version, rows, A, Q, R), the most recent FACTORED generators: the
# probes of a check read many outputs through one generator, and at the base model's width a least-squares solve
# costs a fifth of a second, nearly all of it A's factorisation.
_FACTORS: dict[int, tuple[weakref.ref[torch.Tensor], int, int, torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
FACTORED = 4


def _factored(generator: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(A = [E, 1] on ``rows`` rows, Q, R) with A = QR; R is None when A is not of full column rank by a wide margin
    (then ``readout`` solves by lstsq, whose answer for such an A QR cannot give)."""
    kept = _FACTORS.get(id(generator))
    if kept is not None and kept[0]() is generator and kept[1] == generator._version and kept[2] == rows:
        return kept[3], kept[4], kept[5]
    E = generator[:rows].detach().to("cpu", torch.float64)  # (V, d)
    A = torch.cat([E, torch.ones(E.size(0), 1, dtype=torch.float64)], dim=1)  # (V, d + 1)
    Q, R = torch.linalg.qr(A)
    diag = R.diagonal().abs()
    found = (A, Q, R if bool(diag.min() > 1e-8 * diag.max()) else None)
    _FACTORS.pop(id(generator), None)
    _FACTORS[id(generator)] = (weakref.ref(generator), generator._version, rows, *found)
    while len(_FACTORS) > FACTORED:
        del _FACTORS[next(iter(_FACTORS))]
    return found


def hidden_states(impl: Implementation, state: dict[str, torch.Tensor], config: ModelConfig,
                  src: torch.Tensor | None = None, tgt: torch.Tensor | None = None) -> torch.Tensor | None:
    """The decoder's final hidden states [B, T, d] for these canonical weights (on :func:`witness` unless
    ``src`` and ``tgt`` are given), or None if not observable (``config`` should be a :func:`readout_config`)."""
    if config.tgt_vocab < config.d_model + 2:
        return None
    if src is None or tgt is None:
        src, tgt = witness(config)
    model = scratch_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        return None
    model.eval()
    if not determinism_judged(model):
        # eval-determinism is judged once per model, on the first input it sees: judge it on ordinary visible
        # weights, not on a probe's (a norm at gain 0 erases whatever dropout left active did below it)
        load_into(model, visible_state(config), impl.name)
        require_deterministic(model, src, tgt, config)
    load_into(model, state, impl.name)
    logp = log_probs(model, impl, src, tgt, config)
    h, residual = readout(logp, state["generator.weight"])
    return h if residual < 1e-3 else None


def zero_gain_state(config: ModelConfig, layer_norm: str, *, seed: int = 41, bias: float = 0.3,
                    **kw: Any) -> dict[str, torch.Tensor]:
    """Visible weights with one norm's gain 0 and its bias a constant vector (representable by any norm)."""
    state = visible_state(config, seed=seed, **kw)
    state[f"{layer_norm}.weight"] = torch.zeros(config.d_model)
    state[f"{layer_norm}.bias"] = torch.full((config.d_model,), bias)
    return state


def is_constant_per_sample(h: torch.Tensor, tol: float = 1e-4) -> bool:
    """True when every position of a sample holds the same vector."""
    return bool(((h - h[:, :1]).abs() <= tol * (1 + h[:, :1].abs())).all())


def post_norm_probe(impl: Implementation, config: ModelConfig) -> tuple[bool | None, str]:
    """Is the last decoder layer's output its last norm (post-norm)? (True/False, or None with the reason).

    With that norm's gain 0 and a constant bias, the paper's decoder outputs
    the bias at every position: the final hidden states are identical across
    positions. Pre-norm adds the residual stream after the norm and varies.
    Probing the last layer keeps every attention out of the way, so a bug in
    masks or heads cannot pass for a pre-norm residual.
    """
    config = readout_config(config)
    h = hidden_states(impl, zero_gain_state(config, f"{last_layer(config)}.norm3"), config)
    if h is None:
        return None, f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)"
    return is_constant_per_sample(h), ""


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               form: str = "paper") -> torch.Tensor:
    return oracles.layer_norm(x, weight, bias, eps, form=form)


def embedding_input(tokens: torch.Tensor, E: torch.Tensor, *, scale: float, pe: torch.Tensor,
                    pe_mult: float) -> torch.Tensor:
    """scale * E[tokens] + pe_mult * PE, float64 [B, L, d]."""
    return E.double()[tokens] * scale + pe_mult * pe.double()[: tokens.size(1)]


def _zero(state: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    out = dict(state)
    for n in names:
        out[n] = torch.zeros_like(state[n])
    return out


def sublayers_off(state: dict[str, torch.Tensor], stack: str) -> dict[str, torch.Tensor]:
    """Zero every sub-layer's output projection in one stack: each layer becomes its norms alone."""
    names = [n for n in state if n.startswith(stack + ".")
             and (n.endswith("attn.o.weight") or n.endswith("ffn.w2.weight") or n.endswith("ffn.w2.bias"))]
    return _zero(state, names)


def _last_sublayer_state(config: ModelConfig, scale: float) -> dict[str, torch.Tensor]:
    """Visible weights with the last decoder layer's norm2 at gain 0 and a per-feature bias b2 (scaled by ``scale``,
    as are W2 and its bias): the paper's FFN input is b2 at every position."""
    last = last_layer(config)
    state = visible_state(config, seed=43)
    g = torch.Generator().manual_seed(44)
    state[f"{last}.norm2.weight"] = torch.zeros(config.d_model)
    state[f"{last}.norm2.bias"] = torch.randn(config.d_model, generator=g) * scale
    for n in ("ffn.w2.weight", "ffn.w2.bias"):
        state[f"{last}.{n}"] = state[f"{last}.{n}"] * scale
    return state


ACTIVATION_FORMS: dict[str, dict[str, Any]] = {"relu": {}, "gelu": {"activation": "gelu"},
                                               "identity": {"activation": "identity"},
                                               "relu-after-w2": {"after_w2": True}}


def last_norm_input(config: ModelConfig, state: dict[str, torch.Tensor], activation: str,
                    residual: str) -> torch.Tensor:
    """The last decoder norm's input in closed form on a ``_last_sublayer_state``: float64 [d_model]."""
    last = last_layer(config)
    p = {k.split(f"{last}.", 1)[1]: v for k, v in state.items() if k.startswith(last + ".")}
    b2 = p["norm2.bias"]
    f = oracles.feed_forward(b2, p["ffn.w1.weight"], p["ffn.w1.bias"], p["ffn.w2.weight"], p["ffn.w2.bias"],
                             **ACTIVATION_FORMS[activation])
    x = b2.double()
    return {"x + F(x)": x + f, "x + x + F(x)": 2 * x + f, "F(x) + F(x)": 2 * f, "F(x)": f}[residual]


def last_sublayer_diagnosis(impl: Implementation, config: ModelConfig,
                            scale: float = 1.0) -> tuple[list[tuple[str, str, str]], str]:
    """Which (activation, layer-norm form, residual) reproduce the last decoder sub-layer in closed form.

    With the last layer's norm2 gain 0 and a per-feature bias b2, the paper's
    FFN input is b2 at every position, so h = LN3(b2 + FFN(b2)) is known. The
    candidates name real bugs: GELU or no activation, a ReLU after W2, the
    unbiased std with eps outside, the residual lost (``F + F``, ``F``) or
    added twice (``x + x + F``).

    ``scale`` < 1 shrinks b2 and the FFN's output (W2, its bias) so that the
    variance LN3 sees is close to eps: then eps inside or outside the square
    root, and its value, are told apart (at scale 1 they are not).
    """
    config = readout_config(config)
    state = _last_sublayer_state(config, scale)
    h = hidden_states(impl, state, config)
    if h is None:
        return [], f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)"
    last = last_layer(config)
    matches = []
    for act in ACTIVATION_FORMS:
        for residual in ("x + F(x)", "x + x + F(x)", "F(x) + F(x)", "F(x)"):
            u = last_norm_input(config, state, act, residual)
            for form in ("paper", "unbiased-std", "eps-outside", "unbiased-var"):
                expected = layer_norm(u, state[f"{last}.norm3.weight"], state[f"{last}.norm3.bias"],
                                      config.norm_eps, form)
                if bool(((h - expected).abs() <= 1e-4 * (1 + expected.abs())).all()):
                    matches.append((act, form, residual))
    return matches, ""


def last_norm_divisor(impl: Implementation, config: ModelConfig, scale: float, activation: str,
                      residual: str) -> tuple[float, torch.Tensor] | None:
    """(D, the norm's input u) for the last decoder norm at ``scale``, where h = (u - mean(u)) / D * g + b is what
    the implementation computes: D fitted by least squares over the features of every real position (one value;
    the norm's input is the same at every position). None when h cannot be read back."""
    config = readout_config(config)
    state = _last_sublayer_state(config, scale)
    h = hidden_states(impl, state, config)
    if h is None:
        return None
    u = last_norm_input(config, state, activation, residual)
    last = last_layer(config)
    g, b = state[f"{last}.norm3.weight"].double(), state[f"{last}.norm3.bias"].double()
    real = (witness(config)[1] != config.pad_id)
    shifted = h[real] - b  # (positions, d): g (u - mean) / D at every position
    gc = (g * (u - u.mean())).expand_as(shifted)
    return float((gc * gc).sum() / (gc * shifted).sum()), u


NEGATIVE_SIDES = (1.0, 3.0)  # the last decoder FFN's pre-activations set to -r, then to -3 r (r in [0.5, 1.5))


def negative_side_probe(impl: Implementation, config: ModelConfig) -> tuple[float, float, float] | None:
    """What negative pre-activations contribute to the last decoder FFN: (the largest change of the output hidden
    state when every pre-activation goes from -r to -3 r, the largest change between two identical calls, the
    largest |h|), or None when h cannot be read back.

    With the last layer's W1 zero its pre-activations are b1, set to -r and then to -3 r per hidden unit: max(0, x)
    is 0 in both, so the paper's FFN outputs b2 either way and h does not move by a single bit, whatever the
    residuals, the norms or the layers below compute. An activation that lets negative inputs through (leaky ReLU,
    GELU, ELU, no activation) moves h by about its negative-side slope times the FFN's output scale."""
    config = readout_config(config)
    last = last_layer(config)
    state = visible_state(config, seed=48)
    g = torch.Generator().manual_seed(49)
    r = torch.rand(config.d_ff, generator=g) + 0.5
    state[f"{last}.ffn.w1.weight"] = torch.zeros(config.d_ff, config.d_model)
    hs = []
    for k in (*NEGATIVE_SIDES, NEGATIVE_SIDES[0]):
        h = hidden_states(impl, dict(state, **{f"{last}.ffn.w1.bias": -k * r}), config)
        if h is None:
            return None
        hs.append(h)
    h1, h3, again = hs
    return (h3 - h1).abs().max().item(), (again - h1).abs().max().item(), h1.abs().max().item()


def output_scale(impl: Implementation, config: ModelConfig) -> tuple[float, float] | None:
    """(c, the fit's relative residual) for the pre-softmax transformation, or None when h cannot be read back.

    With the last decoder norm at gain 0 and bias beta (beta of mean about 1, so that no later layer norm maps it
    to a multiple of itself) the paper's decoder output is beta at every position and its logits are E beta: the
    hidden state read back through the loaded output matrix E is beta. Logits scaled by c before the softmax (a
    temperature, T5's d_model^-0.5 rescaling of tied outputs) read back as c beta; c is fitted by least squares
    over every real position."""
    config = readout_config(config)
    last = last_layer(config)
    g = torch.Generator().manual_seed(50)
    beta = torch.randn(config.d_model, generator=g) + 1.0
    state = dict(visible_state(config, seed=41), **{f"{last}.norm3.weight": torch.zeros(config.d_model),
                                                      f"{last}.norm3.bias": beta})
    h = hidden_states(impl, state, config)
    if h is None:
        return None
    real = h[witness(config)[1] != config.pad_id]  # (positions, d)
    b = beta.double().expand_as(real)
    c = float((real * b).sum() / (b * b).sum())
    return c, (real - c * b).abs().max().item() / b.abs().max().item()


def blocked_by_output_scale(impl: Implementation, config: ModelConfig) -> str:
    """A skip reason for the readout probes when the logits are scaled before the softmax (else "")."""
    fit = output_scale(impl, config)
    if fit is None or fit[1] > 1e-3 or abs(fit[0] - 1) <= 1e-3 or abs(fit[0]) <= 1e-3:
        return ""
    return (f"blocked by embedding.shared-weights: the logits are {fit[0]:.4g} times the loaded output matrix's, so "
            "the hidden state read back through it is scaled by as much")


# --------------------------------------------------------------------------------------------------
# The input path (§3.4, §3.5): sqrt(d_model) * E[tokens] + PE, at the bottom of both stacks
# --------------------------------------------------------------------------------------------------
# With every sub-layer's output projection zeroed and unit norms, each layer of the paper's model reduces to
# its norms, so the decoder's final hidden state (read back through the tied output matrix) is
# LayerNorm(sqrt(d_model) E[tgt] + PE), and ``encode`` returns LayerNorm(sqrt(d_model) E[src] + PE). The
# probe matches these closed forms against named alternatives.
def input_scales(d_model: int) -> dict[str, float]:
    return {"sqrt(d_model)": math.sqrt(d_model), "1 (no scaling)": 1.0, "1/sqrt(d_model)": 1 / math.sqrt(d_model),
            "d_model": float(d_model)}


PE_MULTIPLES = {"added once": 1.0, "absent": 0.0, "added twice": 2.0}


def positional_table(impl: Implementation, config: ModelConfig, length: int) -> torch.Tensor:
    """The implementation's own table when it exposes a usable one (position.formula judges its values), else
    the §3.5 table, float64 [length, d_model]. A table of zeros (a model with no positional encoding) is no table:
    the §3.5 one is used, so that the input shows the encoding absent."""
    model = build_model(impl, config)
    if has_capability(model, "positional_encoding"):
        try:
            t = model.positional_encoding(length).detach().double()
            t = t.squeeze(0) if t.dim() == 3 else t
            if tuple(t.shape) == (length, config.d_model) and bool(t.abs().max() > 0):
                return t
        except Exception:
            pass
    return sinusoid_table(length, config.d_model, dtype=torch.float64)


def input_candidates(config: ModelConfig, h: torch.Tensor, tokens: torch.Tensor, E: torch.Tensor,
                     pe: torch.Tensor) -> list[tuple[str, str]]:
    """The (scale, PE multiple) pairs whose LayerNorm(scale E[tokens] + multiple PE) equals h at real positions."""
    real = (tokens != config.pad_id)[..., None]
    ones = torch.ones(config.d_model, dtype=torch.float64)
    zeros = torch.zeros(config.d_model, dtype=torch.float64)
    found = []
    for s_name, s in input_scales(config.d_model).items():
        for p_name, m in PE_MULTIPLES.items():
            x = embedding_input(tokens, E, scale=s, pe=pe, pe_mult=m)
            expected = layer_norm(x, ones, zeros, config.norm_eps)
            if bool(((h - expected).abs() <= 1e-4 * (1 + expected.abs()))[real.expand_as(h)].all()):
                found.append((s_name, p_name))
    return found


def input_path(impl: Implementation, config: ModelConfig, stack: str) -> tuple[list[tuple[str, str]] | None, str]:
    """(the closed forms the ``stack``'s input matches, "") or (None, why it cannot be observed)."""
    config = readout_config(config)
    if stack == "decoder":
        state = sublayers_off(visible_state(config, seed=61, unit_norms=True), "decoder")
        h = hidden_states(impl, state, config)
        if h is None:
            return None, f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)"
        tgt = witness(config)[1]
        table = positional_table(impl, config, tgt.size(1))
        return input_candidates(config, h, tgt, state["tgt_embed.weight"], table), ""
    model = build_model(impl, config)
    if not (has_capability(model, "encode") and has_capability(model, "load_reference_state")):
        return None, f"{impl.name}: needs encode and load_reference_state"
    state = sublayers_off(visible_state(config, seed=62, unit_norms=True), "encoder")
    load_into(model, state, impl.name)
    with torch.no_grad():
        src = witness(config)[0]
        out = model.encode(src)
    out = (out[0] if isinstance(out, (tuple, list)) else out).double()
    table = positional_table(impl, config, src.size(1))
    return input_candidates(config, out, src, state["src_embed.weight"], table), ""


def check_input_path(impl: Implementation, config: ModelConfig, stack: str, *, part: Literal["scale", "pe"],
                     hint: str) -> None:
    """Fail the clause under test when the ``stack``'s input departs from sqrt(d_model) E[tokens] + PE in
    ``part`` (the embedding scale, or the positional table added once); skip when it cannot be observed or
    matches no closed form (other clauses judge that)."""
    found, why = input_path(impl, config, stack)
    if found is None:
        pytest.skip(why)
    if not found:
        pytest.skip(f"the {stack} input matches no closed-form candidate (other structure, e.g. a norm right after "
                    f"the embedding sum or pre-norm without a final norm): other clauses judge it")
    index, wanted = (0, "sqrt(d_model)") if part == "scale" else (1, "added once")
    told = sorted({f[index] for f in found})
    if len(told) > 1 and wanted in told:
        what = "embedding scale" if part == "scale" else "positional table's multiple"
        pytest.skip(f"the {stack} input matches LayerNorm of every {what} tried ({', '.join(told)}): "
                    + ("no positional encoding is added to it, and a layer norm of s E[tokens] does not depend on s "
                       "(position.added judges the encoding)" if part == "scale" else "the probe cannot tell them "
                       "apart on this input"))
    if all(f[index] != wanted for f in found):
        scale, pe = found[0]
        violation(measured=f"the {stack} input is {scale} x E[tokens] with the positional table {pe}",
                  expected="sqrt(d_model) x E[tokens] + PE (added once)",
                  call=f"forward/encode after load_reference_state with every {stack} sub-layer output zeroed, "
                       "unit norms",
                  hint=hint)

"""Reading the decoder's final hidden state back from the output, and closed-form probes built on it.

With the canonical (tied) pre-softmax matrix E [V, d_model] loaded, the model's
log-probabilities are ``h E^T - c`` with ``c`` the per-position log-partition.
When V > d_model and the all-ones vector is not in the span of E's columns,
``[E, 1] [h; -c] = log_probs`` has exactly one solution: the hidden state h
of every position is observable without hooks. The probes below choose
canonical weights for which the paper's model has a closed-form h (a norm
gain of zero makes the next sub-layer's input a known constant), so a
mismatch can be attributed to one sub-layer.
"""

from __future__ import annotations

import math

import torch

from spec.config import ModelConfig

from . import oracles
from .harness import build_model
from .inputs import CONFIG, random_tokens
from .probes import log_probs
from .weights import has_method, load_into, visible_state

__all__ = ["readout", "hidden_states", "post_norm_probe", "SRC", "TGT"]

SRC = random_tokens(CONFIG, [6, 4], 6, vocab=CONFIG.src_vocab, seed=31)
TGT = random_tokens(CONFIG, [5, 5], 5, vocab=CONFIG.tgt_vocab, seed=32)


def readout(logp: torch.Tensor, generator: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Solve [E, 1][h; -c] = log_probs per position: h [B, T, d] and the worst residual."""
    E = generator.detach().double()  # (V, d)
    A = torch.cat([E, torch.ones(E.size(0), 1, dtype=torch.float64)], dim=1)  # (V, d + 1)
    rhs = logp.double().reshape(-1, logp.size(-1)).T  # (V, B*T)
    sol = torch.linalg.lstsq(A, rhs).solution  # (d + 1, B*T)
    residual = (A @ sol - rhs).abs().max().item()
    h = sol[:-1].T.reshape(*logp.shape[:-1], E.size(1))  # (B, T, d)
    return h, residual


def hidden_states(impl, state: dict[str, torch.Tensor], clause: str, config: ModelConfig = CONFIG,
                  src: torch.Tensor = SRC, tgt: torch.Tensor = TGT) -> torch.Tensor | None:
    """The decoder's final hidden states [B, T, d] for these canonical weights, or None if not observable."""
    model = build_model(impl, config, clause)
    if not has_method(model, "load_reference_state"):
        return None
    load_into(model, state, clause, impl.name)
    logp = log_probs(model, impl, src, tgt, clause, config)
    h, residual = readout(logp, state["generator.weight"])
    return h if residual < 1e-3 else None


def zero_gain_state(layer_norm: str, *, seed: int = 41, bias: float = 0.3, **kw) -> dict[str, torch.Tensor]:
    """Visible weights with one norm's gain 0 and its bias a constant vector (representable by any norm)."""
    state = visible_state(CONFIG, seed=seed, **kw)
    state[f"{layer_norm}.weight"] = torch.zeros(CONFIG.d_model)
    state[f"{layer_norm}.bias"] = torch.full((CONFIG.d_model,), bias)
    return state


def is_constant_per_sample(h: torch.Tensor, tol: float = 1e-4) -> bool:
    """True when every position of a sample holds the same vector."""
    return bool(((h - h[:, :1]).abs() <= tol * (1 + h[:, :1].abs())).all())


def post_norm_probe(impl) -> tuple[bool | None, str]:
    """Is the last decoder layer's output its last norm (post-norm)? (True/False, or None with the reason).

    With that norm's gain 0 and a constant bias, the paper's decoder outputs
    the bias at every position: the final hidden states are identical across
    positions. Pre-norm adds the residual stream after the norm and varies.
    Probing the last layer keeps every attention out of the way, so a bug in
    masks or heads cannot pass for a pre-norm residual.
    """
    h = hidden_states(impl, zero_gain_state(f"{LAST}.norm3"), "norm.post-norm")
    if h is None:
        return None, f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)"
    return is_constant_per_sample(h), ""


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, form: str = "paper") -> torch.Tensor:
    return oracles.layer_norm(x, weight, bias, CONFIG.norm_eps, form=form)


def embedding_input(tokens: torch.Tensor, E: torch.Tensor, *, scale: float, pe: torch.Tensor, pe_mult: float):
    """scale * E[tokens] + pe_mult * PE, float64 [B, L, d]."""
    return E.double()[tokens] * scale + pe_mult * pe.double()[: tokens.size(1)]


SQRT_D = math.sqrt(CONFIG.d_model)


def _zero(state: dict[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
    out = dict(state)
    for n in names:
        out[n] = torch.zeros_like(state[n])
    return out


def sublayers_off(state: dict[str, torch.Tensor], stack: str) -> dict[str, torch.Tensor]:
    """Zero every sub-layer's output projection in one stack: each layer becomes its norms alone."""
    names = [n for n in state if n.startswith(stack + ".")
             and (n.endswith("attn.o.weight") or n.endswith("ffn.w2.weight") or n.endswith("ffn.w2.bias"))]
    return _zero(state, names)


LAST = f"decoder.{CONFIG.n_layers - 1}"


def last_sublayer_diagnosis(impl, scale: float = 1.0) -> tuple[list[tuple[str, str, str]], str]:
    """Which (activation, layer-norm form, residual) reproduce the last decoder sub-layer in closed form.

    With the last layer's norm2 gain 0 and a per-feature bias b2, the paper's
    FFN input is b2 at every position, so h = LN3(b2 + FFN(b2)) is known. The
    candidates name real bugs: GELU or no activation, a ReLU after W2, the
    unbiased std with eps outside, the residual lost (``F + F``, ``F``).

    ``scale`` < 1 shrinks b2 and the FFN's output (W2, its bias) so that the
    variance LN3 sees is close to eps: then eps inside or outside the square
    root, and its value, are told apart (at scale 1 they are not).
    """
    state = visible_state(CONFIG, seed=43)
    g = torch.Generator().manual_seed(44)
    b2 = torch.randn(CONFIG.d_model, generator=g) * scale
    state[f"{LAST}.norm2.weight"] = torch.zeros(CONFIG.d_model)
    state[f"{LAST}.norm2.bias"] = b2
    for n in ("ffn.w2.weight", "ffn.w2.bias"):
        state[f"{LAST}.{n}"] = state[f"{LAST}.{n}"] * scale
    h = hidden_states(impl, state, "ffn.formula")
    if h is None:
        return [], f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)"
    p = {k.split(f"{LAST}.", 1)[1]: v for k, v in state.items() if k.startswith(LAST + ".")}
    matches = []
    for act, kw in (("relu", {}), ("gelu", {"activation": "gelu"}), ("identity", {"activation": "identity"}),
                    ("relu-after-w2", {"after_w2": True})):
        f = oracles.feed_forward(b2, p["ffn.w1.weight"], p["ffn.w1.bias"], p["ffn.w2.weight"], p["ffn.w2.bias"], **kw)
        for residual, u in (("x + F(x)", b2.double() + f), ("F(x) + F(x)", 2 * f), ("F(x)", f)):
            for form in ("paper", "unbiased-std", "eps-outside", "unbiased-var"):
                expected = layer_norm(u, p["norm3.weight"], p["norm3.bias"], form)
                if bool(((h - expected).abs() <= 1e-4 * (1 + expected.abs())).all()):
                    matches.append((act, form, residual))
    return matches, ""

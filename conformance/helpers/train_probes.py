"""Measurements behind the ``train`` checks, and the names of what they find.

* ``diagnose_schedule``: a learning-rate trace against Eq. (3), naming the usual departures (step 0,
  one update late or early, stepped twice or once per epoch, another scale, d_model or warmup).
* ``optimizer_updates``: an optimizer's updates on a fixed gradient sequence beside Adam's with the
  paper's settings, and its hyperparameters as ``param_groups`` show them.
* ``recover_targets``: the target distribution a criterion optimizes, read from its gradient with
  respect to the scores: for a cross entropy against a fixed distribution q, the gradient with respect
  to the logits of a position is c * (softmax(logits) - q) with c > 0 its weight in the loss, so two
  different logits give c and then q.
* ``SMOOTHING_CONVENTIONS``: the three ways of spreading the label-smoothing mass the clause accepts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["eq3", "diagnose_schedule", "schedule_table", "OptimizerProbe", "optimizer_updates", "probe_parameters",
           "group_of",
           "describe_hyperparameters", "Recovery", "recover_targets", "SMOOTHING_CONVENTIONS", "convention_targets",
           "as_scores"]


# -- the learning-rate schedule (§5.3, Eq. (3)) ------------------------------------------------------------------
def eq3(k: Tensor, d_model: int, warmup: int) -> Tensor:
    """Eq. (3) over a float64 tensor of update numbers (k >= 1)."""
    return d_model ** -0.5 * torch.minimum(k.pow(-0.5), k * warmup ** -1.5)


KEY_STEPS = (1, 2, 3, 1000, 3999, 4000, 4001, 8000, 20_000, 100_000)


def schedule_table(rates: Tensor, expected: Tensor) -> str:
    shown = [k for k in KEY_STEPS if k <= rates.numel()]
    return "; ".join(f"update {k}: {rates[k - 1].item():.5g} (Eq. (3): {expected[k - 1].item():.5g})" for k in shown)


def _close(a: Tensor, b: Tensor, rtol: float = 1e-5) -> bool:
    return bool(((a - b).abs() <= rtol * b.abs() + 1e-15).all())


def diagnose_schedule(rates: Iterable[float], d_model: int, warmup: int) -> tuple[str, str] | None:
    """None when ``rates`` (the rate of updates 1, 2, ...) is Eq. (3); else (what it is, the likely cause)."""
    r = torch.tensor(list(rates), dtype=torch.float64)
    n = r.numel()
    k = torch.arange(1, n + 1, dtype=torch.float64)
    e = eq3(k, d_model, warmup)
    if not bool(torch.isfinite(r).all()):
        first = int((~torch.isfinite(r)).nonzero()[0]) + 1
        if first == 1:
            return (f"update 1 runs at {r[0].item()}",
                    "step_num counted from 0: Eq. (3) divides by zero at step 0 (count updates from 1)")
        return f"update {first} runs at {r[first - 1].item()}", "the schedule overflows"
    if _close(r, e):
        return None
    table = schedule_table(r, e)
    if bool((r == r[0]).all()):
        return (f"a constant rate {r[0].item():.4g} for all {n} updates (no warmup, no decay)",
                "not Eq. (3): a fixed learning rate, or a scheduler that never changes it per update "
                "(e.g. ReduceLROnPlateau, which moves only on a validation plateau)")
    late = eq3((k - 1).clamp_min(1), d_model, warmup)
    if _close(r[1:], late[1:]):
        if _close(r[:1], e[:1]):
            return (f"one update late: update k runs at Eq. (3)'s step k - 1, and updates 1 and 2 share lrate(1); "
                    f"{table}", "step_num counted from 0 with step 0 clamped to 1 (as the Annotated Transformer's "
                                "rate() does)")
        measured = f"one update late: update 1 runs at {r[0].item():.4g} and update k at Eq. (3)'s step k - 1; {table}"
        if r[0].item() == 0.0:  # Eq. (3)'s step 0 (its step_num * warmup^-1.5 term)
            return measured, "step_num counted from 0: the first update runs at Eq. (3)'s step 0 (count updates from 1)"
        return (measured, f"update 1 ran at the optimizer's own (base) rate {r[0].item():.4g}, which is no step of "
                          "Eq. (3): a schedule that sets the rate only when stepped (after each update) leaves the "
                          "first update at the rate the optimizer was built with (set Eq. (3)'s step 1 when the "
                          "schedule is built, and step k + 1 when it is stepped after update k)")
    if _close(r, eq3(k + 1, d_model, warmup)):
        return (f"one update early: update k runs at Eq. (3)'s step k + 1; {table}",
                "the scheduler is stepped before each update instead of after it")
    for times in (2, 3):
        if _close(r, eq3(times * k - (times - 1), d_model, warmup)):
            return (f"{times} schedule steps per update: update k runs at Eq. (3)'s step {times}k - {times - 1}; "
                    f"{table}", f"the scheduler is stepped {times} times per update")
    changes = (r[1:] != r[:-1]).nonzero().flatten() + 1  # indices where a new rate starts
    if changes.numel() >= 1:
        runs = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), changes]))
        every = int(runs[0])
        if every > 1 and bool((runs == every).all()):
            return (f"the rate changes only every {every} updates; {table}",
                    f"stepped once per epoch (of {every} batches) instead of once per update")
    ratio = r / e
    if bool(((ratio - ratio.mean()).abs() <= 1e-5 * ratio.mean().abs()).all()):
        c = ratio.mean().item()
        for other in (512, 1024, 256, 768, 128, 64, 2048):
            if other != d_model and math.isclose(c, math.sqrt(d_model / other), rel_tol=1e-5):
                return (f"Eq. (3)'s shape scaled by {c:.4g} = sqrt({d_model} / {other}); {table}",
                        f"d_model = {other} in the schedule while the model's d_model is {d_model}")
        return (f"Eq. (3)'s shape scaled by {c:.4g}; {table}",
                "a factor or base learning rate multiplies Eq. (3) (the paper has none)")
    peak = int(torch.argmax(r)) + 1
    if 1 < peak < n:
        scale = r / eq3(k, d_model, peak)
        if bool(((scale - scale.mean()).abs() <= 1e-3 * scale.mean().abs()).all()):
            c = scale.mean().item()
            scaled = "" if math.isclose(c, 1.0, rel_tol=1e-3) else f", scaled by {c:.4g}"
            return (f"Eq. (3)'s shape with warmup_steps = {peak}{scaled}; {table}",
                    f"warmup_steps = {peak} instead of {warmup}")
    named = dropped_min(r, k, d_model, warmup) or linear_warmup(r, k, peak)
    if named is not None:
        return f"{named[0]}; {table}", named[1]
    return (f"not Eq. (3)'s shape (its highest rate {r.max().item():.4g} at update {peak}); {table}",
            "another schedule (cosine decay, steps, a cycle ...)")


def _scale(r: Tensor, form: Tensor, rtol: float = 1e-5) -> float | None:
    """c when ``r`` = c * ``form`` at every update (within ``rtol``), else None."""
    ratio = r / form
    c = ratio.mean()
    return float(c) if bool(((ratio - c).abs() <= rtol * c.abs()).all()) else None


def _scaled(c: float) -> str:
    return "" if math.isclose(c, 1.0, rel_tol=1e-5) else f", scaled by {c:.4g}"


def dropped_min(r: Tensor, k: Tensor, d_model: int, warmup: int) -> tuple[str, str] | None:
    """One term of Eq. (3)'s min() alone (or a max() for the min), possibly scaled."""
    d = d_model ** -0.5
    forms = (
        (d * k.pow(-0.5), "step_num^-0.5 alone: no warmup, the rate starts at its highest and only decays",
         "the min() of Eq. (3) dropped, keeping its decay term step_num^-0.5: no warmup"),
        (d * k * warmup ** -1.5, f"step_num * {warmup}^-1.5 alone: the rate rises linearly for every update and never "
                                 "decays", "the min() of Eq. (3) dropped, keeping its warmup term: no decay"),
        (d * torch.maximum(k.pow(-0.5), k * warmup ** -1.5), "the larger of Eq. (3)'s two terms: the rate falls until "
                                                             f"update {warmup}, then rises",
         "max() where Eq. (3) takes min()"),
    )
    for form, measured, hint in forms:
        c = _scale(r, form)
        if c is not None:
            return f"{measured}{_scaled(c)}", hint
    return None


def _linear(y: Tensor, x: Tensor) -> bool:
    """True when y is a + b x at every point (within 1e-6 of y's range) and not constant."""
    if y.numel() < 3 or float(y.max() - y.min()) == 0.0:
        return False
    design = torch.stack([torch.ones_like(x), x], dim=1)
    coef = torch.linalg.lstsq(design, y[:, None]).solution
    return float((design @ coef - y[:, None]).abs().max()) <= 1e-6 * float(y.abs().max())


def linear_warmup(r: Tensor, k: Tensor, peak: int) -> tuple[str, str] | None:
    """A linear rise to the peak followed by something other than Eq. (3)'s step_num^-0.5 decay."""
    if peak < 3 or peak >= r.numel() or not _linear(r[:peak], k[:peak]):
        return None
    tail, top = r[peak - 1:], r[peak - 1].item()
    if bool((tail == top).all()):
        return (f"a linear warmup to {top:.4g} at update {peak}, then constant",
                "a linear warmup to a constant rate: Eq. (3) decays as step_num^-0.5 after its warmup")
    if _linear(tail, k[peak - 1:]):
        return (f"a linear warmup to {top:.4g} at update {peak}, then a linear decay",
                "a linear warmup and linear decay (e.g. transformers' get_linear_schedule_with_warmup): Eq. (3) "
                "decays as step_num^-0.5 after its warmup")
    return (f"a linear warmup to {top:.4g} at update {peak}, then a decay that is not step_num^-0.5",
            "a linear warmup followed by another decay: Eq. (3) decays as step_num^-0.5 after its warmup")


# -- the optimizer (§5.3) ------------------------------------------------------------------------------------------
def gradient_sequence(steps: int = 12) -> Tensor:
    """[steps, 8] float64 gradients whose Adam updates reveal beta1, beta2, epsilon and weight decay.

    columns: 1e-9 and 1e-8 constants (epsilon matters), a drop from 1 to 1e-3 after 4 steps (beta2's
    memory), alternating signs (beta1's), zero (any weight decay moves it), seeded noise, a large constant,
    a ramp."""
    t = torch.arange(steps, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    return torch.stack([
        torch.full((steps,), 1e-9, dtype=torch.float64),
        torch.full((steps,), 1e-8, dtype=torch.float64),
        torch.where(t < 4, 1.0, 1e-3).to(torch.float64),
        torch.where(t % 2 == 0, 1.0, -1.0).to(torch.float64),
        torch.zeros(steps, dtype=torch.float64),
        torch.randn(steps, generator=g, dtype=torch.float64),
        torch.full((steps,), 1e3, dtype=torch.float64),
        0.1 * (t + 1),
    ], dim=1)


@dataclass
class OptimizerProbe:
    updates: Tensor  # (8,) total change of each coordinate under the optimizer (a matrix: its first row)
    expected: Tensor  # (8,) the same under Adam(0.9, 0.98, 1e-9), no weight decay
    lr: float
    shape: tuple[int, ...] = (8,)  # the probe parameter's shape
    rows_agree: bool = True  # a matrix: every row moved as its first (they get the same gradients)

    @property
    def worst(self) -> tuple[int, float]:
        diff = (self.updates - self.expected).abs() / (self.expected.abs() + 1e-12)
        j = int(torch.argmax(diff))
        return j, float(diff[j])

    @property
    def ok(self) -> bool:
        return self.rows_agree and bool(((self.updates - self.expected).abs()
                                         <= 1e-6 * self.expected.abs() + 1e-13).all())


COLUMNS = ("gradient 1e-9", "gradient 1e-8", "gradient 1 then 1e-3", "alternating +-1", "zero gradient",
           "noise", "gradient 1e3", "ramp")


def probe_parameters() -> list[torch.nn.Parameter]:
    """What ``make_optimizer`` is given: an (8, 8) matrix and an (8,) vector of float64 ones, the two kinds a recipe
    may put in different parameter groups (weight decay on matrices only, say)."""
    return [torch.nn.Parameter(torch.ones(8, 8, dtype=torch.float64)),
            torch.nn.Parameter(torch.ones(8, dtype=torch.float64))]


def optimizer_updates(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], *, lr: float = 1e-3,
                      betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9) -> list[OptimizerProbe]:
    """Run ``optimizer`` (built over ``params``, float64 ones of 8 columns: a vector, or a matrix whose every row
    gets the same gradients) at rate ``lr`` on ``gradient_sequence``, beside ``torch.optim.Adam`` with the paper's
    settings on copies; one probe per parameter."""
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    reference = torch.optim.Adam(twins, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    for group in optimizer.param_groups:
        group["lr"] = lr
    starts = [p.detach().clone() for p in params]
    for grad in gradient_sequence():
        for p, twin in zip(params, twins):
            p.grad, twin.grad = grad.expand_as(p).clone(), grad.expand_as(p).clone()
        optimizer.step()
        reference.step()
    probes = []
    for p, twin, start in zip(params, twins, starts):
        moved, want = (p.detach() - start).reshape(-1, 8), (twin.detach() - start).reshape(-1, 8)
        rows_agree = bool(((moved - moved[:1]).abs() <= 1e-12 + 1e-9 * moved[:1].abs()).all())
        probes.append(OptimizerProbe(moved[0], want[0], lr, tuple(p.shape), rows_agree))
    return probes


def group_of(optimizer: Any, param: torch.nn.Parameter) -> tuple[int, dict]:
    """(index, group) of the parameter group holding ``param`` ((-1, {}) when none does)."""
    for i, group in enumerate(getattr(optimizer, "param_groups", None) or []):
        if any(p is param for p in group.get("params", [])):
            return i, group
    return -1, {}


def describe_hyperparameters(optimizer: Any, betas: tuple[float, float], eps: float,
                             group: dict | None = None) -> tuple[str, list[str]]:
    """("Adam(betas=(0.9, 0.999), eps=1e-08, weight_decay=0)", ["beta2 0.999, not 0.98", ...]) for ``group`` (the
    optimizer's first parameter group by default)."""
    if group is None:
        groups = getattr(optimizer, "param_groups", None) or [{}]
        group = groups[0]
    shown = {k: group[k] for k in ("betas", "eps", "weight_decay", "amsgrad") if k in group}
    text = f"{type(optimizer).__name__}({', '.join(f'{k}={v}' for k, v in shown.items())})"
    diffs = []
    if "betas" in group:
        b1, b2 = group["betas"]
        if b1 != betas[0]:
            diffs.append(f"beta1 {b1}, not {betas[0]}")
        if b2 != betas[1]:
            diffs.append(f"beta2 {b2}, not {betas[1]}")
    if "eps" in group and group["eps"] != eps:
        diffs.append(f"epsilon {group['eps']:g}, not {eps:g}")
    if group.get("weight_decay", 0):
        kind = "decoupled (AdamW)" if "AdamW" in type(optimizer).__name__ else "L2, added to the gradient"
        diffs.append(f"weight decay {group['weight_decay']:g} ({kind}), not 0")
    if group.get("amsgrad"):
        diffs.append("amsgrad on")
    return text, diffs


# -- the criterion (§5.4) ------------------------------------------------------------------------------------------
def as_scores(z: Tensor, kind: str) -> Tensor:
    """Logits z as the implementation's declared output: logits, log-probabilities or probabilities."""
    if kind == "logits":
        return z
    if kind == "log_probs":
        return torch.log_softmax(z, dim=-1)
    if kind == "probs":
        return torch.softmax(z, dim=-1)
    raise ValueError(f"unknown output kind {kind!r}")


@dataclass
class Recovery:
    q: Tensor  # (N, V) recovered target distribution (rows of padding labels: zeros)
    weight: Tensor  # (N,) c per position: its weight in the loss
    real_gradient: Tensor  # (N,) largest |gradient| of each position over both probes
    inconsistency: float  # largest |q(z1) - q(z2)| over real positions
    pad_gradient: float  # largest |gradient| at a padding-label position


def _loss_and_grad(criterion: Callable, z: Tensor, kind: str, labels: Tensor) -> tuple[Tensor, Tensor]:
    z = z.detach().clone().requires_grad_(True)
    loss = criterion(as_scores(z, kind), labels)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise TypeError(f"the criterion returned {shape}, expected a scalar loss")
    (grad,) = torch.autograd.grad(loss.reshape(()), z)
    return loss.detach().reshape(()).to(torch.float64), grad.to(torch.float64)


def recover_targets(criterion: Callable, kind: str, labels: Tensor, vocab: int, pad_id: int,
                    seed: int = 0) -> Recovery:
    """The distribution ``criterion(scores (N, V), labels (N,))`` trains each position towards."""
    g = torch.Generator().manual_seed(seed)
    z1 = 2.0 * torch.randn(labels.numel(), vocab, generator=g, dtype=torch.float64)
    z2 = 2.0 * torch.randn(labels.numel(), vocab, generator=g, dtype=torch.float64)
    _, g1 = _loss_and_grad(criterion, z1, kind, labels)
    _, g2 = _loss_and_grad(criterion, z2, kind, labels)
    p1, p2 = torch.softmax(z1, -1), torch.softmax(z2, -1)
    dp, dg = p1 - p2, g1 - g2
    weight = (dg * dp).sum(-1) / (dp * dp).sum(-1)  # (N,) c
    real = labels != pad_id
    safe = torch.where(weight.abs() > 1e-12, weight, torch.ones_like(weight))[:, None]
    q1, q2 = p1 - g1 / safe, p2 - g2 / safe
    q = torch.where(real[:, None], (q1 + q2) / 2, torch.zeros_like(q1))
    inconsistency = float(((q1 - q2).abs().amax(-1) * real).max()) if bool(real.any()) else 0.0
    pad_gradient = float(torch.cat([g1[~real], g2[~real]]).abs().max()) if bool((~real).any()) else 0.0
    real_gradient = torch.maximum(g1.abs().amax(-1), g2.abs().amax(-1))
    return Recovery(q=q, weight=weight, real_gradient=real_gradient, inconsistency=inconsistency,
                    pad_gradient=pad_gradient)


def convention_targets(labels: Tensor, vocab: int, pad_id: int, epsilon: float, convention: str) -> Tensor:
    """(N, V) float64 target distributions under one of ``SMOOTHING_CONVENTIONS`` (padding rows zero)."""
    n = labels.numel()
    if convention == "eps/(V-1)":
        q = torch.full((n, vocab), epsilon / (vocab - 1), dtype=torch.float64)
        q.scatter_(1, labels[:, None], 1.0 - epsilon)
    elif convention == "eps/V":
        q = torch.full((n, vocab), epsilon / vocab, dtype=torch.float64)
        q.scatter_(1, labels[:, None], 1.0 - epsilon + epsilon / vocab)
    elif convention == "eps/(V-2)":
        q = torch.full((n, vocab), epsilon / (vocab - 2), dtype=torch.float64)
        q[:, pad_id] = 0.0
        q.scatter_(1, labels[:, None], 1.0 - epsilon)
    else:
        raise ValueError(f"unknown convention {convention!r}; accepted: {', '.join(SMOOTHING_CONVENTIONS)}")
    return q.masked_fill((labels == pad_id)[:, None], 0.0)


SMOOTHING_CONVENTIONS: dict[str, str] = {
    "eps/(V-1)": "eps/(V-1) on every class but the target (tensor2tensor's convention, the reference's)",
    "eps/V": "eps/V on every class, the target included (Szegedy et al.; torch CrossEntropyLoss(label_smoothing))",
    "eps/(V-2)": "eps/(V-2) on every class but the target and padding (the Annotated Transformer's)",
}

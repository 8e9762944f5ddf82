"""train.* (§5, and §3.1's offset decoder input): gradients, the recipe an implementation exposes, learning.

``train.gradients`` runs on every model. The recipe checks (``train.lr-schedule``, ``train.optimizer``,
``train.label-smoothing``, ``train.loss-padding``, ``train.shift``) read the recipe capabilities of the
adapter contract (``spec.contract``: ``make_optimizer``, ``make_scheduler`` or ``learning_rate``,
``make_criterion``, ``make_batch``) and skip, naming the capability, when it is absent. They never call the
model's forward, so they judge a model whatever shapes it accepts. ``train.learns`` trains a tiny model with
the implementation's recipe, the reference's filling any piece it does not expose; it calls the model itself, so
a model that rejects some shapes (model.shape) skips it, naming the gate.

Components alone (``--component``, kinds ``optimizer``, ``lr_schedule`` and ``criterion``): the same
measurements on what the component's factory returns (``implementations/hookspecs.py``). Composed into the
reference (``reference+criterion=NAME``), a component is audited whole by the checks above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from aiayn_conformance.implementations import Component, ComponentUnavailable, Implementation
from aiayn_conformance.reference.training import adam, lrate, teacher_forcing
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import parameter_count
from aiayn_conformance.spec.tolerance import Tolerance, compare, tolerance
from aiayn_conformance.spec.training import TrainConfig

from .helpers import shapes
from .helpers.components import from_factory
from .helpers.harness import (
    CheckTimeout,
    ClauseViolation,
    ImplementationError,
    as_log_probs,
    build_model,
    could_not_check,
    describe_call,
    not_applicable,
    run_forward,
    seeded,
    violation,
)
from .helpers.inputs import BOS_ID, target_tokens, witness_batch
from .helpers.learning import (
    CONFORMING_RANGE,
    FLOOR_FACTOR,
    LOCKSTEP_UPDATES,
    OWN_START,
    SMALL_INIT_RANGE,
    TASKS,
    Lockstep,
    lockstep,
    lockstep_inputs,
    parameters_outside_the_schema,
    reference_initial_state,
    reference_lockstep,
    rounding_floor,
    train_implementation,
)
from .helpers.outputs import compare_real, log_probs
from .helpers.recipe import call, has_schedule, missing_schedule, schedule_trace, scheduler_trace
from .helpers.train_probes import (
    COLUMNS,
    SMOOTHING_CONVENTIONS,
    as_scores,
    convention_targets,
    describe_hyperparameters,
    diagnose_schedule,
    group_of,
    optimizer_updates,
    probe_parameters,
    recover_targets,
)
from .helpers.transplant import STATE_SEED, load_into, transplanted, visible_twin

PAPER = TrainConfig()  # the paper's recipe: what the implementation's capabilities are asked for
BOS = 1
Criterion = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def differentiable_log_probs(out: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "logits":
        return torch.log_softmax(out, dim=-1)
    if kind == "probs":
        return torch.log(out.clamp_min(1e-30))
    return out


@pytest.mark.clause("train.gradients")
def test_every_parameter_gets_a_finite_nonzero_gradient(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config.replace(dropout=0.0), train=True)
    src, tgt = witness_batch(config)
    labels = torch.roll(tgt, shifts=-1, dims=1).masked_fill(tgt == config.pad_id, -100)  # next tokens; pads ignored
    out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, grad=True)
    logp = differentiable_log_probs(out.float(), impl.output)
    loss = torch.nn.functional.nll_loss(logp.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    call_text = f"NLL of the next token at real positions of {describe_call(src, tgt, config.pad_id)}, backward()"
    missing, nonfinite, zero = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            missing.append(name)
        elif not bool(torch.isfinite(p.grad).all()):
            nonfinite.append(name)
        elif not bool((p.grad != 0).any()):
            zero.append(name)
    if nonfinite:
        violation(measured=f"non-finite gradients in {', '.join(nonfinite[:5])}",
                  expected="finite gradients for every parameter", call=call_text,
                  hint="NaN from fully masked softmax rows or an overflowing mask constant")
    if missing or zero:
        names = ", ".join((missing + zero)[:6]) + (" ..." if len(missing + zero) > 6 else "")
        violation(measured=f"{len(missing)} parameter(s) get no gradient and {len(zero)} an "
                  f"all-zero gradient: {names}", expected="every parameter takes part in the computation",
                  call=call_text, hint="a module built but never called (e.g. a layer norm that is defined but "
                                       "another one reused), or a path cut by detach()")


# -- train.equivalence ---------------------------------------------------------------------------------------------
# The recipe is the reference's whatever the implementation exposes: the clause judges the model's forward and
# backward pass; the implementation's own recipe pieces are judged by the recipe clauses below.
RECIPE_TEXT = (f"the reference's recipe (Adam(0.9, 0.98, 1e-9), Eq. (3) with warmup_steps = {LOCKSTEP_UPDATES}, label "
               "smoothing 0.1, BOS + target[:, :-1])")


def load_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    load_into(model, state)


def trainable_scalars(model: Any, frozen: list[str]) -> int:
    seen: set[int] = set()
    total = 0
    for name, p in model.named_parameters():
        if p.requires_grad and name not in frozen and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def train_in_lockstep(impl: Implementation, model: Any, cfg: ModelConfig, batches: list,
                      probe: tuple) -> tuple[Lockstep, list[str]]:
    """The implementation's lockstep run and the names of its parameters that did not move in it."""
    state = reference_initial_state(cfg)
    try:
        frozen = parameters_outside_the_schema(model, state, load_state)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        run = lockstep(model, impl.output, cfg, batches, probe, frozen=frozen)
    except (CheckTimeout, ImplementationError, ClauseViolation, pytest.skip.Exception):
        raise
    except Exception as exc:
        could_not_check("training from the reference's initial state raised", exc)
    still = [n for n, p in model.named_parameters() if n not in frozen and torch.equal(start[n], p.detach())]
    return run, still


def lockstep_hint(model: Any, cfg: ModelConfig, frozen: list[str], still: list[str], losses_agree: bool) -> str:
    """What the measurements show about where the updates part (never a guess at a line of code)."""
    hints = []
    if still:
        hints.append(f"{len(still)} parameter(s) never moved in {LOCKSTEP_UPDATES} updates: "
                     f"{', '.join(still[:4])}{' ...' if len(still) > 4 else ''} (requires_grad=False, a tensor "
                     "that is not an nn.Parameter, or a path cut by detach())")
    own, paper = trainable_scalars(model, frozen), parameter_count(cfg)
    if own != paper:
        hints.append(f"{own} trainable scalars where the paper's model has {paper} (parameters tied in the paper "
                     "trained apart, an extra module, or some left out)")
    if frozen:
        hints.append(f"{len(frozen)} parameter(s) outside the schema take part in the forward, held fixed at the "
                     "values load_reference_state gives them: a module the paper lacks (an extra layer norm, say) "
                     "can agree at the loaded weights and part from the paper's once the others move")
    if not hints:
        hints.append("every parameter moves and the counts agree, but the updates differ: a backward pass that is "
                     "not the forward's gradient (a detach() on one path, a gradient scaled or clipped inside the "
                     "model, a custom autograd Function)")
    if losses_agree:
        hints.append("the losses agree; only the outputs after the last update differ")
    return "; ".join(hints)


def require_the_reference_forward(impl: Implementation, config: ModelConfig) -> None:
    """Skip, as blocked by model.reference-equivalence, unless the implementation holding the visible weights (norm
    gains and biases far from 1 and 0, sharp attention) computes the reference's outputs: at the reference's initial
    state (unit gains, zero biases) an extra or shared norm is the identity and would only show once trained."""
    src, tgt = witness_batch(config)
    got = log_probs(transplanted(impl, config), impl, src, tgt, config)
    with torch.no_grad():
        want = as_log_probs(visible_twin(config)(src, tgt), "logits")
    found = compare_real(got, want, tgt, config.pad_id)
    if not found.ok:
        pytest.skip(f"blocked by model.reference-equivalence: holding the visible weights (seed {STATE_SEED}) the "
                    f"forward is not the reference's ({found.describe()} on "
                    f"{describe_call(src, tgt, config.pad_id)}), so its "
                    "updates cannot be judged apart from it")


def train_mode_departure(impl: Implementation, cfg: ModelConfig, batch: tuple[torch.Tensor, torch.Tensor]) -> str:
    """How the model in train mode at dropout 0, at the reference's initial state, departs from itself in eval mode
    on ``batch`` (two train-mode calls that differ: dropout left on; or train and eval that differ), or ''."""
    model = build_model(impl, cfg, train=True)
    load_into(model, reference_initial_state(cfg), impl.name)
    src, tgt = batch
    decoder_input, _ = teacher_forcing(tgt, BOS_ID)
    with seeded(1):
        a = log_probs(model.train(), impl, src, decoder_input, cfg)
    with seeded(2):
        b = log_probs(model.train(), impl, src, decoder_input, cfg)
    e = log_probs(model.eval(), impl, src, decoder_input, cfg)
    twice = compare_real(a, b, decoder_input, cfg.pad_id, kind=impl.output)
    if not twice.ok:
        return (f"two train-mode calls at dropout 0 differ ({twice.describe()}): dropout stays on although the "
                "configuration's rate is 0 (a rate written into the code, such as attention dropout)")
    modes = compare_real(a, e, decoder_input, cfg.pad_id, kind=impl.output)
    if not modes.ok:
        return f"train mode at dropout 0 computes another function than eval mode ({modes.describe()})"
    return ""


@pytest.mark.clause("train.equivalence")
@pytest.mark.canonical_weights("it trains from the reference's initial state, in lockstep with the reference")
def test_trains_in_lockstep_with_the_reference(impl: Implementation, config: ModelConfig) -> None:
    cfg = config.replace(dropout=0.0)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state(state): training in lockstep needs the reference's "
                    "initial state loaded into it (a capability, spec.contract)")
    require_the_reference_forward(impl, config)
    batches, probe = lockstep_inputs(cfg)
    # The reference's run first, while the implementation's model holds no gradients or optimizer state, and its
    # gradients dropped after its own run: one run's training state alive at a time (big, this check alone: a 9.8 GiB
    # peak, 10.6 GiB with the implementation's run first)
    expected = reference_lockstep(cfg)
    run, still = train_in_lockstep(impl, model, cfg, batches, probe)
    model.zero_grad(set_to_none=True)
    frozen = f"; held fixed (outside the schema): {', '.join(run.frozen)}" if run.frozen else ""
    call_text = (f"load_reference_state(the reference's initial state, seed 0), then {len(batches)} updates in train "
                 f"mode (dropout 0) on seeded padded batches {describe_call(*batches[0], config.pad_id)} ..., with "
                 f"{RECIPE_TEXT}; then the eval-mode log-probabilities of "
                 f"{describe_call(*probe, config.pad_id)}{frozen}")
    first = compare(run.loss[:1], expected.loss[:1], dtype=torch.float32, scope="training")
    if not first.ok:
        before = (f"before any update the loss is {run.loss[0]:.6g}, the reference's {expected.loss[0]:.6g} from the "
                  "same weights and batch")
        train_mode = train_mode_departure(impl, cfg, batches[0])
        if train_mode:
            pytest.skip(f"blocked by model.eval-determinism: {before}, while in eval mode the forward is the "
                        f"reference's: {train_mode}, so the updates cannot be judged apart from it")
        pytest.skip(f"blocked by model.reference-equivalence: {before}: in train mode (dropout 0) the forward equals "
                    "its eval mode, and at the reference's initial state it is not the reference's (at the visible "
                    "weights it is), so the updates cannot be judged apart from it")
    policy = tolerance(torch.float32, scope="training")
    gap = (run.loss - expected.loss).abs()
    allowed = policy.atol + policy.rtol * expected.loss.abs()
    outputs = compare(run.real_log_probs(), expected.real_log_probs(), tol=policy)
    floor = ""
    # Beyond the policy (a NaN loss too: it is never <= anything), is the difference more than rounding amplified?
    if not bool((gap <= allowed).all()) or not outputs.ok:
        measured = rounding_floor(cfg)
        allowed = torch.maximum(allowed, FLOOR_FACTOR * measured.loss)
        outputs = compare(run.real_log_probs(), expected.real_log_probs(),
                          tol=Tolerance(policy.rtol, max(policy.atol, FLOOR_FACTOR * measured.log_probs)))
        floor = f", or {FLOOR_FACTOR:g} times the rounding floor where that is more: {measured.describe()}"
    beyond = (~(gap <= allowed)).nonzero()  # a non-finite loss is beyond any allowance
    if not len(beyond) and outputs.ok:
        return
    curve = ", ".join(f"{a:.5g} ({b:.5g})" for a, b in zip(run.loss.tolist(), expected.loss.tolist()))
    part = int(beyond[0]) + 1 if len(beyond) else None
    apart = (f", apart from update {part} on (|diff| {float(gap[part - 1]):.3g} where {float(allowed[part - 1]):.3g} "
             f"is allowed; the largest {float(gap.max()):.3g})" if part else "")
    violation(measured=f"losses of updates 1..{len(batches)}: {curve} (the reference's in brackets){apart}; "
                       f"log-probabilities after the last update: {outputs.describe()}",
              expected=f"the reference's losses and outputs, update by update (the training policy's {policy}{floor}; "
                       "the same weights and batches make the same gradients and so the same updates, up to "
                       "rounding)",
              call=call_text, hint=lockstep_hint(model, cfg, run.frozen, still, part is None))


# -- the recipe an implementation exposes ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def adapter(impl: Implementation, config: ModelConfig) -> Any:
    return build_model(impl, config, train=True)


def require(model: Any, method: str, signature: str) -> None:
    if not has_capability(model, method):
        not_applicable(f"the implementation exposes no {method}({signature}) (a recipe capability, spec.contract)")


# -- train.lr-schedule -------------------------------------------------------------------------------------------
# Updates 1 to 5 x warmup: the start, the peak and well into the decay (20000 scheduler steps take a fraction of
# a second; the 100000 of the paper's run would add no information).
SCHEDULE_UPDATES = 5 * PAPER.warmup_steps


def judge_schedule(trace: Callable[[], list[float]], how: str, d_model: int) -> None:
    """Fail the clause unless ``trace()`` (the rate of updates 1 .. SCHEDULE_UPDATES) is Eq. (3) for ``d_model``."""
    warmup, n = PAPER.warmup_steps, SCHEDULE_UPDATES
    call_text = f"{how}, the rate of updates 1..{n} read (d_model {d_model})"
    try:
        rates = trace()
    except ComponentUnavailable as exc:  # a composed component that cannot run here
        pytest.skip(f"the schedule ({how}) is unavailable here: {exc}")
    except (CheckTimeout, ImplementationError):
        raise
    except ZeroDivisionError as exc:
        violation(measured=f"the schedule raised ZeroDivisionError ({exc}) for the first update",
                  expected=f"update 1 at lrate(1) = {lrate(1, d_model, warmup):.5g}", call=call_text,
                  hint="step_num counted from 0: Eq. (3) divides by zero at step 0 (count updates from 1)")
    except Exception as exc:
        could_not_check(f"the schedule ({how}) raised", exc)
    found = diagnose_schedule(rates, d_model, warmup)
    if found is not None:
        measured, hint = found
        violation(measured=measured,
                  expected=f"lrate(k) = {d_model}^-0.5 * min(k^-0.5, k * {warmup}^-1.5): "
                           f"{lrate(1, d_model, warmup):.5g} at update 1, peak {lrate(warmup, d_model, warmup):.5g} "
                           f"at update {warmup}, {lrate(n, d_model, warmup):.5g} at update {n}",
                  call=call_text, hint=hint)


@pytest.mark.clause("train.lr-schedule")
def test_learning_rate_follows_eq3(adapter: Any, config: ModelConfig) -> None:
    if not has_schedule(adapter):
        not_applicable(missing_schedule())
    how = ("make_scheduler(optimizer, TrainConfig()), .step() once per update"
           if has_capability(adapter, "make_scheduler") else "learning_rate(step_num, TrainConfig())")
    judge_schedule(lambda: schedule_trace(adapter, PAPER, SCHEDULE_UPDATES), how, config.d_model)


# -- train.optimizer -----------------------------------------------------------------------------------------------
def judge_optimizer(optimizer: Any, params: list[torch.nn.Parameter], made_by: str) -> None:
    """Fail the clause unless ``optimizer`` (built over ``params``: a matrix and a vector) updates each as
    Adam(0.9, 0.98, 1e-9) without decay, whatever parameter group holds it."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        could_not_check(f"{made_by} returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
    try:
        probes = optimizer_updates(optimizer, params)
    except CheckTimeout:
        raise
    except Exception as exc:
        text, _ = describe_hyperparameters(optimizer, PAPER.betas, PAPER.adam_eps)
        could_not_check(f"the optimizer {text} raised on step()", exc)
    groups = len(optimizer.param_groups)
    for param, probe in zip(params, probes):
        if not probe.ok:
            judge_parameter(optimizer, param, probe, groups, made_by)


def judge_parameter(optimizer: Any, param: torch.nn.Parameter, probe: Any, groups: int, made_by: str) -> None:
    index, group = group_of(optimizer, param)
    text, diffs = describe_hyperparameters(optimizer, PAPER.betas, PAPER.adam_eps, group)
    what = f"the {'x'.join(map(str, probe.shape))} {'matrix' if len(probe.shape) == 2 else 'vector'}"
    where = f"{what} (parameter group {index} of {groups})" if index >= 0 else f"{what} (in no parameter group)"
    call_text = (f"{made_by} over an 8x8 matrix and an 8-vector -> {groups} parameter group(s); lr set to "
                 f"{probe.lr:g}, 12 steps of fixed gradients on 8 float64 columns ({', '.join(COLUMNS)}), every row "
                 "of the matrix alike")
    if bool((probe.updates == 0).all()):
        measured = f"the optimizer left {where} unchanged"
        hint = ("the optimizer must update every parameter it receives (one filtered out of its groups, or groups "
                "built from other parameters than those passed)")
    elif not probe.rows_agree:
        measured = f"the rows of {where} moved differently though they got the same gradients"
        hint = "an update that is not per coordinate (a norm-wise or matrix-wise rule: LAMB, Adafactor ...)"
    else:
        j, rel = probe.worst
        measured = (f"{where}: {text}; its updates differ from Adam(0.9, 0.98, 1e-9)'s, most on the coordinate "
                    f"with {COLUMNS[j]}: {probe.updates[j].item():.6g} vs {probe.expected[j].item():.6g} "
                    f"(relative difference {rel:.3g})")
        hint = "; ".join(diffs) if diffs else "the update rule is not Adam's with these settings"
        if diffs and any("beta2 0.999" in x for x in diffs) and any("1e-08" in x for x in diffs):
            hint += " (torch.optim.Adam's defaults)"
        if groups > 1:
            hint += f", in the group holding {what} only"
    violation(measured=measured,
              expected="Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 and no weight decay (§5.3) for every "
                       "parameter, whatever its group",
              call=call_text, hint=hint)


@pytest.mark.clause("train.optimizer")
def test_optimizer_is_adam_with_the_paper_settings(adapter: Any) -> None:
    require(adapter, "make_optimizer", "params, train_config")
    params = probe_parameters()
    optimizer = call("make_optimizer(params, train_config)", adapter.make_optimizer, list(params), PAPER)
    judge_optimizer(optimizer, params, "make_optimizer(params, TrainConfig())")


# -- train.label-smoothing -----------------------------------------------------------------------------------------
def smoothing_labels(config: ModelConfig) -> torch.Tensor:
    """(N,) = 2 x 5 flattened: real targets on varied classes (one next to the padding id), then padding."""
    return torch.tensor([[5, 17, config.pad_id + 1, 36, 9], [9, 30, 2, config.pad_id, config.pad_id]]).flatten()


def judge_smoothing(criterion: Criterion, kind: str, made_by: str, request: pytest.FixtureRequest,
                    config: ModelConfig) -> None:
    """Fail the clause unless ``criterion`` (on scores of ``kind``) trains towards a smoothed target distribution
    (one of ``SMOOTHING_CONVENTIONS``, which is then noted) and trains padding targets towards nothing."""
    labels, vocab, eps = smoothing_labels(config), config.tgt_vocab, PAPER.label_smoothing
    call_text = (f"{made_by} on random {kind} scores [{labels.numel()}, {vocab}] and labels {labels.tolist()} "
                 f"(pad id {config.pad_id}); the distribution read from d loss / d logits")
    try:
        rec = recover_targets(criterion, kind, labels, vocab, config.pad_id)
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check("the criterion(scores, labels) raised", exc)
    real = labels != config.pad_id
    if rec.pad_gradient > 1e-9:
        violation(measured=f"padding target positions get a gradient (up to {rec.pad_gradient:.3g}): they are "
                           "trained towards a distribution",
                  expected="padding targets contribute nothing", call=call_text,
                  hint="padding not ignored (no ignore_index / weights), or smoothing applied at every position")
    if bool((rec.real_gradient[real] <= 1e-12).any()):
        n = int((real & (rec.real_gradient <= 1e-12)).nonzero()[0])
        violation(measured=f"no gradient reaches the scores of real target {n} (label {int(labels[n])})",
                  expected="every real target position trained", call=call_text,
                  hint="a real class ignored as padding (wrong ignore_index?)")
    if rec.inconsistency > 1e-6 or bool((rec.weight[real] <= 0).any()):
        violation(measured=f"the target distribution read from the gradient changes with the scores (by up to "
                           f"{rec.inconsistency:.3g}): the loss is not a cross entropy of the model's distribution "
                           "against fixed targets",
                  expected="-sum_j q_j log p_j with a fixed q per position", call=call_text,
                  hint="a second softmax: probabilities fed to a criterion that applies its own (log-)softmax, or "
                       "a loss on the scores themselves")
    q = rec.q[real]
    errors = {name: float((q - convention_targets(labels, vocab, config.pad_id, eps, name)[real]).abs().max())
              for name in SMOOTHING_CONVENTIONS}
    best = min(errors, key=lambda c: errors[c])
    if errors[best] <= 1e-5:  # one of the accepted spreads (the paper does not say which): reported
        request.node.user_properties.append(("aiayn_note", f"label smoothing: {SMOOTHING_CONVENTIONS[best]}"))
        return
    rows = torch.arange(q.size(0))
    true = q[rows, labels[real]]
    off = q.clone()
    off[rows, labels[real]] = float("nan")
    off_pad = off[:, config.pad_id]
    others = torch.cat([off[:, :config.pad_id], off[:, config.pad_id + 1:]], dim=1)
    others = others[~torch.isnan(others)].reshape(q.size(0), -1)
    found_eps = 1.0 - float(true.mean())
    measured = (f"normalized to sum 1, the true class gets {float(true.mean()):.6g} (eps = {found_eps:.4g}), the "
                f"other classes {float(others.min()):.4g} to {float(others.max()):.4g}, the padding class "
                f"{float(off_pad.mean()):.4g}")
    unnormalized = unnormalized_hint(rec.weight[real], float(true.mean()), float(others.mean()), eps, vocab)
    if found_eps < 1e-4 and float(others.abs().max()) < 1e-6:
        hint = "no label smoothing: the target is one-hot (a plain cross entropy)"
    elif unnormalized:
        hint = unnormalized
    elif float(others.max() - others.min()) < 1e-6 and float(true.min()) > float(others.max()):
        hint = f"eps_ls = {found_eps:.4g} instead of {eps:g} (closest spread: {SMOOTHING_CONVENTIONS[best]})"
    elif float(true.mean()) < float(others.max()):
        j = int(torch.argmax(others.max(dim=0).values))
        hint = f"mass on the wrong classes: the true class gets less than another (class {j + (j >= config.pad_id)})"
    else:
        hint = "the off-target mass is not spread evenly"
    violation(measured=measured,
              expected=f"1 - {eps:g} on the true class and {eps:g} spread evenly over the others ("
                       f"{'; '.join(SMOOTHING_CONVENTIONS.values())}); closest: {best}, off by {errors[best]:.3g}",
              call=call_text, hint=hint)


def unnormalized_hint(weight: torch.Tensor, true: float, other: float, eps: float, vocab: int) -> str:
    """The hint for a target distribution that does not sum to 1, or "".

    The gradient gives each position's distribution normalized (q / s) and its weight c = s * w, w the position's
    weight in the loss. With the loss a mean over the real targets (w = 1 / n) or a sum (w = 1), s follows; it is
    named when it is not 1 and s * q gives the true class exactly the paper's 1 - eps."""
    c = weight.to(torch.float64)
    if float((c - c.mean()).abs().max()) > 1e-9 * float(c.abs().mean()):
        return ""
    for normalization, s in (("a mean over the real targets", float(c.mean()) * c.numel()),
                             ("a sum", float(c.mean()))):
        if abs(s - 1.0) > 1e-6 and abs(s * true - (1.0 - eps)) < 1e-6:
            spread = s * other
            named = next((f" = {form}" for form, value in (("eps/V", eps / vocab), ("eps/(V-1)", eps / (vocab - 1)),
                                                          ("eps/(V-2)", eps / (vocab - 2)))
                          if abs(spread - value) < 1e-9), "")
            return (f"a target distribution that does not sum to 1: taking the loss as {normalization}, it sums to "
                    f"{s:.6g}, with 1 - eps = {1 - eps:g} on the true class and {spread:.4g}{named} on each other "
                    f"class{' (the eps/V the true class should also get is missing)' if named == ' = eps/V' else ''}")
    return ""


def own_criterion(adapter: Any) -> Criterion:
    require(adapter, "make_criterion", "train_config")
    criterion = call("make_criterion(train_config)", adapter.make_criterion, PAPER)
    if not callable(criterion):
        could_not_check(f"make_criterion(train_config) returned {type(criterion).__name__}, not a callable "
                        "criterion(scores, labels)")
    return criterion


@pytest.mark.clause("train.label-smoothing")
def test_criterion_optimizes_the_smoothed_distribution(impl: Implementation, adapter: Any,
                                                       request: pytest.FixtureRequest, config: ModelConfig) -> None:
    judge_smoothing(own_criterion(adapter), impl.output, "make_criterion(TrainConfig())", request, config)


# -- train.loss-padding --------------------------------------------------------------------------------------------
def judge_loss_padding(criterion: Criterion, kind: str, made_by: str, config: ModelConfig) -> None:
    """Fail the clause unless appending padding targets (and a row of them) changes neither the loss nor a
    gradient of ``criterion`` (on scores of ``kind``)."""
    vocab = config.tgt_vocab
    pad = config.pad_id
    labels = torch.tensor([[5, 17, 3, pad], [9, 30, pad, pad]])  # (B, T) with padding already
    extra = 3
    padded = torch.cat([labels, torch.full((2, extra), config.pad_id)], dim=1)  # (B, T + 3)
    padded = torch.cat([padded, torch.full((1, padded.size(1)), config.pad_id)], dim=0)  # and a row of padding
    g = torch.Generator().manual_seed(11)
    z_big = 2.0 * torch.randn(*padded.shape, vocab, generator=g, dtype=torch.float64)  # (B + 1, T + 3, V)
    z = z_big[:2, : labels.size(1)].clone()
    call_text = (f"{made_by} on {kind} scores and labels {labels.tolist()}, then the same with {extra} padding "
                 "positions appended to each row and a row of padding")

    def run(scores_z: torch.Tensor, lab: torch.Tensor) -> tuple[float, torch.Tensor]:
        leaf = scores_z.detach().clone().requires_grad_(True)
        try:
            loss = criterion(as_scores(leaf, kind).reshape(-1, vocab), lab.reshape(-1))
            (grad,) = torch.autograd.grad(loss.reshape(()), leaf)
        except CheckTimeout:
            raise
        except Exception as exc:
            could_not_check("the criterion(scores, labels) raised", exc)
        return float(loss.detach()), grad

    loss, grad = run(z, labels)
    loss_p, grad_p = run(z_big, padded)
    same_loss = abs(loss_p - loss) <= 1e-6 * abs(loss) + 1e-9
    shared = grad_p[:2, : labels.size(1)]
    scale = float(grad.abs().max()) or 1.0
    same_grad = float((shared - grad).abs().max()) <= 1e-6 * scale
    new = torch.ones_like(grad_p, dtype=torch.bool)
    new[:2, : labels.size(1)] = False
    at_padding = float(grad_p[new].abs().max())
    if same_loss and same_grad and at_padding <= 1e-12:
        return
    real, total, total_p = int((labels != config.pad_id).sum()), labels.numel(), padded.numel()
    hints = []
    if at_padding > 1e-12:
        hints.append(f"the appended padding positions get gradients (up to {at_padding:.3g}): padding targets "
                     "count in the loss (no ignore_index or weights)")
    if not same_loss and abs(loss_p / loss - total / total_p) < 1e-6:
        hints.append(f"the loss is divided by all {total} -> {total_p} positions, padding included, instead of "
                     f"the {real} real targets")
    violation(measured=f"loss {loss:.6g} -> {loss_p:.6g} with the padding appended; gradients at the real "
                       f"positions change by up to {float((shared - grad).abs().max()):.3g} (of {scale:.3g})",
              expected="the same loss and gradients: padding targets weighted 0, the loss normalized by the "
                       "real targets (or summed)", call=call_text,
              hint="; ".join(hints) or "the loss depends on the amount of padding")


@pytest.mark.clause("train.loss-padding")
def test_appended_padding_changes_no_loss_and_no_gradient(impl: Implementation, adapter: Any,
                                                          config: ModelConfig) -> None:
    judge_loss_padding(own_criterion(adapter), impl.output, "make_criterion(TrainConfig())", config)


# -- train.shift ---------------------------------------------------------------------------------------------------
@pytest.mark.clause("train.shift")
def test_decoder_input_is_the_target_shifted_right(adapter: Any, config: ModelConfig) -> None:
    require(adapter, "make_batch", "target, bos_id")
    # a target as batching makes it: ordinary tokens, the end symbol last, then padding (no special symbol inside)
    target = target_tokens(config, [5, 3, 1], 5, vocab=config.tgt_vocab, seed=21)
    made = call("make_batch(target, bos_id)", adapter.make_batch, target.clone(), BOS)
    call_text = f"make_batch(target {target.tolist()}, bos_id={BOS})"
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        could_not_check(f"{call_text} returned {type(made).__name__}, not a pair (decoder_input, labels)")
    decoder_input, labels = made
    for name, value in (("decoder input", decoder_input), ("labels", labels)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(target.shape):
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            violation(measured=f"the {name} is {shape}", call=call_text,
                      expected=f"{list(target.shape)} like the target (decoder input and labels aligned position by "
                               "position)", hint="the start symbol appended instead of replacing the last token?")
    real = target != config.pad_id
    want_input, _ = teacher_forcing(target, BOS)
    wrong_input = (decoder_input != want_input) & real
    wrong_labels = ((labels != target) & real) | ((labels != config.pad_id) & ~real)
    if not bool(wrong_input.any()) and not bool(wrong_labels.any()):
        return
    # name the usual mistakes
    leaks = bool(((decoder_input == target) | ~real).all())
    unshifted_pair = bool(((decoder_input[:, :-1] == target[:, :-1]) | ~real[:, 1:]).all()) and \
        bool(((labels[:, :-1] == target[:, 1:]) | ~real[:, 1:]).all())
    if leaks and bool(((labels == target) | ~real).all()):
        hint = "the decoder input is the target itself, not shifted: position i sees the token it must predict " \
               "(target leakage)"
    elif unshifted_pair:
        hint = "input target[:, :-1] and labels target[:, 1:] on a target without a start symbol: the first token " \
               "is never predicted and no BOS is used"
    elif not bool(wrong_input.any()):
        hint = labels_hint(labels, target, decoder_input, real)
    elif bool(wrong_input[:, 0].any()):
        hint = "the decoder input does not start with the start symbol"
    else:
        hint = "the decoder input is not the target offset by one position"
    b, i = (int(x) for x in (wrong_input | wrong_labels).nonzero()[0])
    violation(measured=f"decoder input {decoder_input.tolist()}, labels {labels.tolist()} (first difference: row "
                       f"{b}, position {i})",
              expected=f"decoder input {want_input.masked_fill(~real, config.pad_id).tolist()} (BOS, then the target "
                       "without "
                       "its last token; positions past the end unconstrained), labels = the target",
              call=call_text, hint=hint)


def labels_hint(labels: torch.Tensor, target: torch.Tensor, decoder_input: torch.Tensor, real: torch.Tensor) -> str:
    """The hint of train.shift when the decoder input is right and only the labels are wrong."""
    def same(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> bool:
        return bool(((a == b) | ~where).all())

    if same(labels[:, :-1], target[:, 1:], real[:, 1:]):
        return ("the decoder input is right (BOS + target[:, :-1]) but the labels are shifted too: position i is "
                "trained to predict target token i + 1, the shift applied to the labels as well as to the input")
    if same(labels, decoder_input, real):
        return ("the decoder input is right (BOS + target[:, :-1]) but the labels are that input: position i is "
                "trained to repeat the token it reads")
    return ("the decoder input is right (BOS + target[:, :-1]) but the labels are not the target: padding positions "
            "labelled, or the labels built from another tensor")


# -- train.learns --------------------------------------------------------------------------------------------------
@pytest.mark.clause("train.learns")
@pytest.mark.canonical_weights("it trains its own task model from an initial state (the reference's, or the "
                               "model's own initialisation)")
@pytest.mark.parametrize("task_name", list(TASKS))
def test_learns_a_tiny_task(impl: Implementation, task_name: str, request: pytest.FixtureRequest) -> None:
    task = TASKS[task_name]
    contract = shapes.current()
    if contract is not None and not contract.complete:
        pytest.skip(contract.need(f"training runs the forward on batches of {task.batch_size} sources of length "
                                  f"{task.max_len} and decodes every target length from 1 to {task.max_len + 1}"))
    try:
        _, curve = train_implementation(impl, task, seed=0)
    except (CheckTimeout, ImplementationError, ClauseViolation, pytest.skip.Exception):
        raise
    except Exception as exc:
        could_not_check(f"training on the {task.name} task raised", exc)
    request.node.user_properties.append(("aiayn_data", {"learning_curve": curve.to_json()}))
    if curve.passed:
        request.node.user_properties.append((
            "aiayn_note", f"{task.name}: {curve.accuracy:.0%} of held-out sequences after {len(curve.loss)} "
                          f"updates, trained with {curve.recipe}, from {curve.start}"))
        return
    first, last = curve.loss[0], curve.loss[-1]
    tf = curve.teacher_forced[-1]
    if curve.stopped:
        hint = f"{curve.stopped}; learning rate at that update: {curve.lr[-1]:.3g}"
    elif tf >= 0.9:
        hint = (f"teacher-forced, it predicts {tf:.0%} of the target tokens, but not from the source alone: the "
                "decoder read the future during training (causal mask), or the decoder input and labels are not offset "
                "as §3.1 offsets them (train.shift)")
    elif last > 0.7 * first:
        hint = (f"the loss barely fell ({first:.3g} -> {last:.3g}) at learning rates {min(curve.lr):.3g} to "
                f"{max(curve.lr):.3g}: the recipe does not train this model (rate, optimizer or criterion)")
    else:
        hint = (f"it learns, too slowly or not the task (loss {first:.3g} -> {last:.3g}, teacher-forced accuracy "
                f"{tf:.0%}, learning rates {min(curve.lr):.3g} to {max(curve.lr):.3g}): a weak recipe, or broken "
                "attention, masks or positional information")
    if curve.start == OWN_START:
        hint += (f"; it started from its own initialisation, which the paper does not fix and on which this tiny "
                 f"model's result hangs (the reference itself measured {SMALL_INIT_RANGE[task.name]} on this task "
                 "from N(0, 0.02) matrices): a load_reference_state would start it from the reference's")
    else:
        hint += "; not the initialisation: it started from the reference's initial state"
    violation(measured=f"greedy decoding reproduces {curve.accuracy:.0%} of {task.eval_size} held-out sequences "
                       f"after {len(curve.loss)} updates (held-out accuracy along the way: "
                       f"{', '.join(f'{a:.0%}' for a in curve.greedy)})",
              expected=f"at least {task.threshold:.0%} ({task.summary}, {task.min_len}-{task.max_len} symbols, "
                       f"{task.steps} updates of {task.batch_size}); from the reference's initial state conforming "
                       f"models measured {CONFORMING_RANGE[task.name]} (the reference, fused and an independently "
                       "written model, seeds 0-4)",
              call=f"build(config N=1, d_model 32, h 4, d_ff 64, vocab {task.vocab}, dropout 0), seed 0, from "
                   f"{curve.start}, trained with {curve.recipe}", hint=hint)


# -- components alone: optimizers, learning-rate schedules, criteria (--component) --------------------------------
# The same measurements as above, on what the component's factory returns (implementations/hookspecs.py): an
# optimizer over a probe parameter, a schedule over the reference's Adam for a model of the audit config's
# d_model, a criterion on logits over the audit config's target vocabulary.
@pytest.mark.clause("train.optimizer")
@pytest.mark.component_kind("optimizer")
def test_optimizer_component_is_adam_with_the_paper_settings(component: Component) -> None:
    params = probe_parameters()
    optimizer = from_factory(component, list(params), PAPER)
    judge_optimizer(optimizer, params, f"{component.name}: factory(params, TrainConfig())")


@pytest.mark.clause("train.lr-schedule")
@pytest.mark.component_kind("lr_schedule")
def test_lr_schedule_component_follows_eq3(component: Component, config: ModelConfig) -> None:
    optimizer = adam([torch.nn.Parameter(torch.zeros(1))], PAPER)
    d_model = config.d_model

    def make() -> Any:  # the factory's own exceptions are the schedule's (a ZeroDivisionError is a finding)
        return from_factory_raw(component, optimizer, d_model, PAPER)

    judge_schedule(lambda: scheduler_trace(make, optimizer, SCHEDULE_UPDATES),
                   f"{component.name}: factory(Adam, {d_model}, TrainConfig()), .step() once per update", d_model)


def from_factory_raw(component: Component, *args: Any) -> Any:
    """``component.factory(*args)`` letting its exceptions through (the check names them), but skipping a
    component that cannot run here (``ComponentUnavailable``)."""
    try:
        return component.factory(*args)
    except ComponentUnavailable as exc:
        pytest.skip(f"{component.kind} component {component.name!r} is unavailable here: {exc}")


def component_criterion(component: Component, config: ModelConfig) -> Criterion:
    criterion = from_factory(component, config.tgt_vocab, config.pad_id, PAPER)
    if not callable(criterion):
        could_not_check(f"{component.kind} component {component.name!r}: factory(vocab, pad_id, train_config) "
                        f"returned {type(criterion).__name__}, not a callable criterion(logits, labels)")
    return criterion


@pytest.mark.clause("train.label-smoothing")
@pytest.mark.component_kind("criterion")
def test_criterion_component_optimizes_the_smoothed_distribution(component: Component,
                                                                 request: pytest.FixtureRequest,
                                                                 config: ModelConfig) -> None:
    judge_smoothing(component_criterion(component, config), "logits",
                    f"{component.name}: factory({config.tgt_vocab}, {config.pad_id}, TrainConfig())", request, config)


@pytest.mark.clause("train.loss-padding")
@pytest.mark.component_kind("criterion")
def test_criterion_component_ignores_appended_padding(component: Component, config: ModelConfig) -> None:
    judge_loss_padding(component_criterion(component, config), "logits",
                       f"{component.name}: factory({config.tgt_vocab}, {config.pad_id}, TrainConfig())", config)

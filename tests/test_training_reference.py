"""The reference training pieces (reference/training.py) against the paper's derived numbers, and the
measurements the train checks rest on (conformance/helpers/train_probes.py)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from aiayn_conformance.conformance.helpers.train_probes import (
    SMOOTHING_CONVENTIONS,
    convention_targets,
    describe_hyperparameters,
    diagnose_schedule,
    group_of,
    optimizer_updates,
    probe_parameters,
    recover_targets,
)
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.reference.training import (
    LabelSmoothedCrossEntropy,
    LRateScheduler,
    PaperRecipe,
    adam,
    lrate,
    smoothed_targets,
    teacher_forcing,
    train_step,
)
from aiayn_conformance.spec import BASE_TRAINING, BIG_TRAINING, TrainConfig
from aiayn_conformance.spec.config import ModelConfig


# -- Eq. (3) (§5.3): the derived values of the paper's base and big models ----------------------------------------
@pytest.mark.parametrize("step, d_model, expected", [
    (1, 512, 1.7469e-07), (1000, 512, 1.7469e-04), (4000, 512, 6.9877e-04), (8000, 512, 4.9411e-04),
    (100_000, 512, 1.3975e-04), (4000, 1024, 4.9411e-04),
])
def test_lrate_matches_the_derived_values(step, d_model, expected):
    assert lrate(step, d_model, 4000) == pytest.approx(expected, rel=1e-4)


def test_lrate_peaks_at_warmup_and_decays_as_the_inverse_square_root():
    rates = [lrate(k, 512) for k in range(1, 12_001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000
    assert lrate(16_000, 512) == pytest.approx(lrate(4000, 512) / 2)  # step^-0.5 after the peak
    assert lrate(2000, 512) == pytest.approx(lrate(4000, 512) / 2)  # linear before it


@pytest.mark.parametrize("step, error", [(0, ValueError), (-3, ValueError), (1.0, TypeError), (True, TypeError)])
def test_lrate_rejects_step_zero_instead_of_clamping(step, error):
    with pytest.raises(error, match="step_num"):
        lrate(step, 512)


def test_scheduler_gives_update_k_the_rate_of_step_k():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = adam([param])
    scheduler = LRateScheduler(optimizer, 512, 4000)
    seen = []
    for _ in range(4000):
        seen.append(optimizer.param_groups[0]["lr"])
        param.grad = torch.zeros(1)
        optimizer.step()
        scheduler.step()
    assert seen[:3] == [lrate(1, 512), lrate(2, 512), lrate(3, 512)]
    assert seen[-1] == pytest.approx(6.9877e-04, rel=1e-4)
    assert diagnose_schedule(seen, 512, 4000) is None


def test_adam_has_the_paper_settings_and_no_weight_decay():
    group = adam([torch.nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
    assert group["lr"] == 0.0  # the scheduler's to set


def test_train_config_holds_the_paper_numbers_and_validates():
    assert (BASE_TRAINING.warmup_steps, BASE_TRAINING.betas, BASE_TRAINING.adam_eps, BASE_TRAINING.label_smoothing,
            BASE_TRAINING.weight_decay, BASE_TRAINING.train_steps) == (4000, (0.9, 0.98), 1e-9, 0.1, 0.0, 100_000)
    assert BIG_TRAINING.train_steps == 300_000
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(warmup_steps=0)
    with pytest.raises(ValueError, match="beta2"):
        TrainConfig(beta2=1.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        BASE_TRAINING.replace(label_smoothing=-0.1)


# -- label smoothing (§5.4), tensor2tensor's convention ----------------------------------------------------------
def test_smoothed_targets_at_v37000_are_tensor2tensors():
    q = smoothed_targets(torch.tensor([5, 0]), 37_000, 0.1, pad_id=0)
    assert q[0, 5].item() == pytest.approx(0.9)
    assert q[0, 6].item() == pytest.approx(2.7028e-06, rel=1e-4)
    assert q[0, 0].item() == pytest.approx(2.7028e-06, rel=1e-4)  # the padding class is one of the others
    assert q[0].sum().item() == pytest.approx(1.0)
    assert q[1].abs().sum().item() == 0.0  # a padding label has no distribution


def test_criterion_is_the_smoothed_cross_entropy_over_real_tokens():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 11, generator=g), torch.tensor([3, 4, 0, 7, 0, 10])
    criterion = LabelSmoothedCrossEntropy(11, 0.1, pad_id=0)
    q = smoothed_targets(labels, 11, 0.1, 0)
    manual = -(q * torch.log_softmax(logits.double(), -1)).sum() / 4  # 4 real targets
    assert criterion(logits, labels).item() == pytest.approx(manual.item(), rel=1e-6)
    # log-probabilities work as well as logits; (B, T, V) as well as (N, V)
    assert criterion(torch.log_softmax(logits, -1), labels).item() == pytest.approx(manual.item(), rel=1e-6)
    assert criterion(logits.reshape(2, 3, 11), labels.reshape(2, 3)).item() == pytest.approx(manual.item(), rel=1e-6)
    assert criterion(logits, torch.zeros(6, dtype=torch.long)).item() == 0.0  # all padding: 0, not NaN


def test_criterion_agrees_with_torch_up_to_the_spread():
    """torch's CrossEntropyLoss(label_smoothing) spreads eps/V (the target included): at V = 2 the two
    conventions differ most; the recovered targets tell them apart."""
    labels = torch.tensor([1, 2, 3])
    ours = recover_targets(LabelSmoothedCrossEntropy(9, 0.1, 0), "logits", labels, 9, 0)
    torch_ce = recover_targets(torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0), "logits", labels, 9, 0)
    for rec, convention in ((ours, "eps/(V-1)"), (torch_ce, "eps/V")):
        expected = convention_targets(labels, 9, 0, 0.1, convention)
        assert (rec.q - expected).abs().max() < 1e-9, convention
        assert rec.inconsistency < 1e-9 and rec.pad_gradient == 0.0
    assert set(SMOOTHING_CONVENTIONS) == {"eps/(V-1)", "eps/V", "eps/(V-2)"}


# -- teacher forcing (§3.1) and one update ------------------------------------------------------------------------
def test_teacher_forcing_shifts_right_with_bos_first():
    target = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    decoder_input, labels = teacher_forcing(target, bos_id=1)
    assert decoder_input.tolist() == [[1, 5, 6, 7], [1, 8, 2, 0]]
    assert labels is target
    with pytest.raises(ValueError, match="target"):
        teacher_forcing(torch.tensor([1, 2]), 1)


def test_train_step_lowers_the_loss_of_a_repeated_batch():
    torch.manual_seed(0)
    config = ModelConfig(src_vocab=9, tgt_vocab=9, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                         max_len=8)

    class Model(PaperRecipe, Transformer):
        pass

    model = Model(config)
    optimizer = model.make_optimizer(model.parameters(), BASE_TRAINING.replace(warmup_steps=10))
    scheduler = model.make_scheduler(optimizer, BASE_TRAINING.replace(warmup_steps=10))
    criterion = model.make_criterion(BASE_TRAINING)
    src, target = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[3, 4, 5, 2]])
    losses = [train_step(model, src, target, optimizer=optimizer, scheduler=scheduler, criterion=criterion,
                         bos_id=1, make_batch=model.make_batch).loss for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    assert optimizer.param_groups[0]["lr"] == lrate(31, 16, 10)


# -- the schedule diagnosis names the usual departures ------------------------------------------------------------
def _trace(fn, n: int = 20_000) -> list[float]:
    return [fn(k) for k in range(1, n + 1)]


@pytest.mark.parametrize("name, fn, words", [
    ("clamped", lambda k: lrate(max(k - 1, 1), 32), "updates 1 and 2 share"),
    ("from zero", lambda k: 0.0 if k == 1 else lrate(k - 1, 32), "update 1 runs at 0"),
    ("early", lambda k: lrate(k + 1, 32), "one update early"),
    ("twice", lambda k: lrate(2 * k - 1, 32), "2 schedule steps per update"),
    ("per epoch", lambda k: lrate((k - 1) // 50 + 1, 32), "every 50 updates"),
    ("scaled", lambda k: 2 * lrate(k, 32), "scaled by 2"),
    ("d_model 512", lambda k: lrate(k, 512), "sqrt(32 / 512)"),
    ("warmup 8000", lambda k: lrate(k, 32, 8000), "warmup_steps = 8000"),
    ("constant", lambda k: 1e-4, "constant rate"),
    ("inf first", lambda k: math.inf if k == 1 else lrate(k, 32), "update 1 runs at inf"),
])
def test_schedule_diagnosis_names_the_departure(name, fn, words):
    found = diagnose_schedule(_trace(fn), 32, 4000)
    assert found is not None and words in found[0], (name, found)


@pytest.mark.parametrize("first, fits, misfits", [
    (0.0, "step_num counted from 0", ""),
    (1e-3, "the optimizer's own (base) rate", "step_num counted from 0"),
])
def test_the_one_update_late_hint_fits_what_update_1_ran_at(first, fits, misfits):
    """Update k at Eq. (3)'s step k - 1: a step counted from 0 runs update 1 at rate 0 (Eq. (3)'s step 0); a base
    rate left by a schedule that sets the rate only when stepped is no step of Eq. (3), and is not named as one."""
    measured, hint = diagnose_schedule(_trace(lambda k: first if k == 1 else lrate(k - 1, 32)), 32, 4000)
    assert "one update late" in measured and fits in hint
    assert not misfits or not hint.startswith(misfits), hint


def test_optimizer_probe_sees_each_hyperparameter():
    def probe(make):
        param = torch.nn.Parameter(torch.ones(8, dtype=torch.float64))
        (found,) = optimizer_updates(make([param]), [param])
        return found

    assert probe(lambda p: torch.optim.Adam(p, betas=(0.9, 0.98), eps=1e-9)).ok
    assert probe(lambda p: torch.optim.AdamW(p, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)).ok
    for bad in ({"betas": (0.8, 0.98)}, {"betas": (0.9, 0.999)}, {"eps": 1e-8}, {"weight_decay": 1e-4}):
        kw = {"betas": (0.9, 0.98), "eps": 1e-9, **bad}
        assert not probe(lambda p, kw=kw: torch.optim.Adam(p, **kw)).ok, bad
    assert not probe(lambda p: torch.optim.SGD(p, lr=1e-3)).ok


def test_optimizer_probe_sees_each_parameter_group():
    matrix, vector = probe_parameters()
    decayed = torch.optim.AdamW([{"params": [matrix], "weight_decay": 0.1}, {"params": [vector], "weight_decay": 0.0}],
                                betas=(0.9, 0.98), eps=1e-9)
    on_matrix, on_vector = optimizer_updates(decayed, [matrix, vector])
    assert not on_matrix.ok and on_vector.ok and on_matrix.shape == (8, 8)
    assert group_of(decayed, matrix)[0] == 0 and group_of(decayed, vector)[0] == 1
    text, diffs = describe_hyperparameters(decayed, (0.9, 0.98), 1e-9, decayed.param_groups[0])
    assert "weight_decay=0.1" in text and any("weight decay 0.1" in d for d in diffs)


@pytest.mark.parametrize("name, fn, words", [
    ("no min, decay term", lambda k: 32 ** -0.5 * k ** -0.5, "the min() of Eq. (3) dropped, keeping its decay"),
    ("no min, warmup term", lambda k: 32 ** -0.5 * k * 4000 ** -1.5, "keeping its warmup term"),
    ("max for min", lambda k: 32 ** -0.5 * max(k ** -0.5, k * 4000 ** -1.5), "max() where Eq. (3) takes min()"),
    ("linear warmup, linear decay", lambda k: 1e-3 * (k / 4000 if k <= 4000 else (100_000 - k) / 96_000),
     "linear warmup and linear decay"),
    ("linear warmup, constant", lambda k: 1e-3 * min(k / 4000, 1.0), "linear warmup to a constant"),
])
def test_schedule_diagnosis_names_a_dropped_min_and_a_linear_warmup(name, fn, words):
    found = diagnose_schedule(_trace(fn), 32, 4000)
    assert found is not None and words in found[1], (name, found)


def test_target_recovery_sees_a_double_softmax_and_padding():
    labels = torch.tensor([3, 4, 0])
    double = recover_targets(lambda s, y: F.cross_entropy(s.softmax(-1), y, ignore_index=0), "logits", labels, 9, 0)
    assert double.inconsistency > 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted = recover_targets(torch.nn.CrossEntropyLoss(), "logits", labels, 9, 0)
    assert counted.pad_gradient > 1e-3

"""A model that accepts only some shapes gets one finding (model.shape) and a real verdict on the rest, fast.

One suite run per model of ``tests/shape_limited_models.py`` (a fixed length, a maximum length below the
witnesses', batch size 1 only), with the default (ci) hypothesis profile a user gets and without the ONNX
check. On each: model.shape fails exactly once, in the shape probe's check, with the accepted and rejected
shapes, the model's own error and a hint at the cause; the clauses the model can be judged on at its accepted
shapes pass (each model computes the paper's function there); every other check that does not pass skips
naming model.shape; nothing errors; and a rejection is paid for once: the model's forward raises only in the
shape probe, never again in a check or in a hypothesis example (its cost in seconds, at most 20 s per model on a
2-CPU machine, is measured by ``python -m benchmarks.suite_time``, not timed here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from aiayn_conformance.conformance.helpers import shapes
from aiayn_conformance.conformance.helpers.inputs import WITNESS_BATCHES, WITNESS_LENGTHS, WITNESS_SHAPE
from aiayn_conformance.spec.config import TINY as CONFIG

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "shape_limited_models.py"


def _listing() -> dict:
    spec = importlib.util.spec_from_file_location("_shape_limited_listing", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SHAPE_LIMITED


SHAPE_LIMITED = _listing()
# name -> (what the report lists as accepted, as rejected, a phrase of the hint)
REPORTED = {
    "fixed-length": ("source lengths 5; target lengths 5; batch sizes 1, 2, 3",
                     "source lengths 1, 4, 6, 7, 8, 9, 12, 24; target lengths 1, 4, 6, 7, 8, 9, 12, 24",
                     "position ids hard-coded"),
    "max-length-4": ("source lengths 1, 4; target lengths 1, 4; batch sizes 1, 2, 3",
                     "source lengths 5, 6, 7, 8, 9, 12, 24; target lengths 5, 6, 7, 8, 9, 12, 24",
                     "built for 4 positions instead of config.max_len = 24"),
    "batch-of-one": ("source lengths 1, 4, 5, 6, 7, 8, 9, 12, 24; target lengths 1, 4, 5, 6, 7, 8, 9, 12, 24; "
                     "batch sizes 1", "batch sizes 2, 3", "one sentence at a time"),
}
NO_ACCELERATOR = "no CUDA or MPS device on this machine"
ON_THE_CPU = "the audit runs on the CPU (--device cpu)"  # device.portable's check on the audit's device
# the probe tries each length (the witnesses', 1 and max_len) for both sequences, for the source alone and for
# the target alone, and each batch size: a rejection costs one call per probed shape
MAX_PROBE_CALLS = 3 * (len(WITNESS_LENGTHS) + 2) + len(WITNESS_BATCHES)


def run_suite(impl: str, tmp: Path) -> tuple[subprocess.CompletedProcess, list[dict], list[str]]:
    """(the process, its records, the forward calls the model rejected) of the suite over one implementation."""
    out, log = tmp / "results.json", tmp / "rejections.log"
    cmd = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider", f"--plugin={PLUGIN}",
           f"--impl={impl}", "--ignore=conformance/test_export.py", "--hypothesis-profile=ci",
           f"--results-json={out}"]
    env = {**os.environ, "AIAYN_TEST_REJECTIONS_LOG": str(log)}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.exists(), \
        f"the suite wrote no results (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-2000:]}"
    rejections = log.read_text().splitlines() if log.exists() else []
    return res, json.loads(out.read_text())["tests"], rejections


@pytest.fixture(scope="module", params=sorted(SHAPE_LIMITED))
def run(request, tmp_path_factory):
    name = request.param
    res, records, rejections = run_suite(f"shape-{name}", tmp_path_factory.mktemp(name))
    by_clause = defaultdict(list)
    for rec in records:
        by_clause[rec["clause"]].append(rec)
    return name, res, records, by_clause, rejections


def test_model_shape_fails_once_with_the_accepted_and_rejected_shapes(run):
    name, _, _, by_clause, _ = run
    failed = [r for r in by_clause["model.shape"] if r["outcome"] != "passed" and r["outcome"] != "skipped"]
    assert len(failed) == 1 and failed[0]["outcome"] == "failed", by_clause["model.shape"]
    assert "test_accepted_shapes" in failed[0]["nodeid"]
    accepted, rejected, hint = REPORTED[name]
    lines = [line.strip() for line in failed[0]["detail"].splitlines()]
    assert f"accepted: {accepted}" in lines and f"rejected: {rejected}" in lines, failed[0]["detail"]
    assert any(line.startswith("error:") and "raised: RuntimeError" in line for line in lines), failed[0]["detail"]
    hint_line = next(line for line in lines if line.startswith("hint:"))
    assert hint in hint_line, hint_line


def test_nothing_else_fails_and_nothing_errors(run):
    _, res, records, _, _ = run
    bad = [(r["clause"], r["outcome"], r["message"]) for r in records
           if r["outcome"] in ("failed", "error") and "test_accepted_shapes" not in r["nodeid"]]
    assert not bad, bad
    assert res.returncode == 1 and "INTERNALERROR" not in res.stdout + res.stderr, res.stdout[-3000:]


def test_the_clauses_it_can_be_judged_on_are_judged(run):
    name, _, _, by_clause, _ = run
    judged = SHAPE_LIMITED[name][2]
    unjudged = {c: [r["outcome"] for r in by_clause[c]] for c in judged
                if not any(r["outcome"] == "passed" for r in by_clause[c])}
    assert not unjudged, f"shape-{name}: never judged at an accepted shape: {unjudged}"


def test_every_skip_names_the_shape_gate(run):
    _, _, records, _, _ = run
    skipped = [r for r in records if r["outcome"] == "skipped"]
    assert skipped, "a model that rejects shapes must have checks that cannot run"
    unexplained = [(r["nodeid"], r["message"]) for r in skipped
                   if not r["message"].startswith("blocked by model.shape: ")
                   and not any(env in r["message"] for env in (NO_ACCELERATOR, ON_THE_CPU))]
    assert not unexplained, unexplained


def test_a_rejection_is_paid_for_once_in_the_probe(run):
    """The model raises at most once per shape the probe tries, and nowhere else: no check calls it at a rejected
    shape, and hypothesis neither draws one nor shrinks or replays a crash."""
    name, _, _, _, rejections = run
    assert 0 < len(rejections) <= MAX_PROBE_CALLS and len(set(rejections)) == len(rejections), \
        f"shape-{name}: {len(rejections)} rejected forward calls (expected 1 to {MAX_PROBE_CALLS}, " \
        f"each shape once, all in the probe): {rejections}"


# -- the probe and the fitting, on stand-ins (no suite run) ----------------------------------------------------
class _StandIn(torch.nn.Module):
    """forward returns zeros [B, T, V], or whatever ``rule(B, S, T)`` says: an exception to raise, or a shape."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def forward(self, src, tgt):
        got = self.rule(src.size(0), src.size(1), tgt.size(1))
        if isinstance(got, Exception):
            raise got
        return torch.zeros(*(got or (src.size(0), tgt.size(1), CONFIG.tgt_vocab)))


def _probe(rule):
    return shapes.probe(_StandIn(rule), CONFIG, lengths=WITNESS_LENGTHS, batches=WITNESS_BATCHES,
                        witness=WITNESS_SHAPE, impl_name="stand-in")


def test_the_probe_accepts_everything_of_a_conforming_model_in_a_dozen_calls():
    contract = _probe(lambda b, s, t: None)
    assert contract.complete and contract.base == WITNESS_SHAPE and contract.output is None
    assert len(contract.tried) <= 12, contract.tried


def test_a_wrong_shape_at_some_lengths_is_a_rejection():
    """A table that broadcasts a length-1 input up to its own 5 rows returns [B, 5, V] instead of raising."""
    contract = _probe(lambda b, s, t: (b, 5, CONFIG.tgt_vocab) if t == 1 else None if t == 5 and s == 5
                      else RuntimeError("size mismatch"))
    assert contract.accepted("tgt") == [5] and 1 in contract.rejected("tgt")
    assert "returned shape [3, 5, 37], expected [3, 1, 37]" in contract.probed["tgt"][1]


def test_a_wrong_output_everywhere_is_not_a_shape_rejection():
    contract = _probe(lambda b, s, t: (b, CONFIG.tgt_vocab))
    assert contract.complete and contract.output is not None and contract.output[0] == "shape [3, 37]"


def test_a_forward_that_always_raises_has_no_base():
    contract = _probe(lambda b, s, t: ValueError("no"))
    assert not contract.usable and contract.error == "forward(src [3, 7], tgt [3, 5]) raised: ValueError: no"
    assert contract.blocked(3, 7, 5).startswith("blocked by model.shape: forward raised at every probed shape")


def test_lengths_between_accepted_probes_are_accepted_and_witnesses_fit_to_them():
    contract = _probe(lambda b, s, t: None if max(s, t) <= 4 else RuntimeError("table of 4 rows"))
    assert contract.values("src", 1, 24) == [1, 2, 3, 4] and contract.accepted_words("tgt") == "target lengths 1-4 only"
    src = torch.tensor([[5, 6, 7, 8, 9, 1, 2], [5, 6, 7, 0, 0, 0, 0]])
    tgt = torch.tensor([[3, 4, 5, 6, 7], [3, 0, 0, 0, 0]])
    fit_src, fit_tgt = shapes.fit_pair(contract, src, tgt, 0)
    assert fit_src.tolist() == [[5, 6, 7, 8], [5, 6, 7, 0]] and fit_tgt.tolist() == [[3, 4, 5, 6], [3, 0, 0, 0]]
    fit_src, _ = shapes.fit_pair(contract, src, tgt, 0, src_room=1)  # room to append one pad token
    assert fit_src.size(1) == 3
    with pytest.raises(pytest.skip.Exception, match="appends 5 pad tokens to the source"):
        shapes.fit_pair(contract, src, tgt, 0, src_room=5)


def test_a_batch_limited_witness_keeps_the_rows_the_check_is_about():
    contract = _probe(lambda b, s, t: None if b == 1 else RuntimeError("one sentence"))
    src = torch.tensor([[1, 2], [0, 0], [3, 0]])
    tgt = torch.tensor([[1], [2], [3]])
    assert shapes.fit_pair(contract, src, tgt, 0)[0].tolist() == [[1, 2]]
    assert shapes.fit_pair(contract, src, tgt, 0, keep=(1,))[0].tolist() == [[0, 0]]
    with pytest.raises(pytest.skip.Exception, match="needs a batch of at least 2 rows.*only batch size 1"):
        shapes.fit_pair(contract, src, tgt, 0, min_batch=2)

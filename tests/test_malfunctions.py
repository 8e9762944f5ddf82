"""A broken implementation never crashes or stalls the suite: it fails its clauses with a one-line reason.

One suite run over the implementations of ``tests/fixtures/malfunctioning_plugin.py`` (a build that raises,
a forward that raises, NaN, a wrong shape, an integer dtype, a dict instead of a tensor, a forward that
never returns) and the reference beside them. A forward that raises at every shape is explained once by the
shape probe (model.shape), and the checks that need a forward call skip naming it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "fixtures" / "malfunctioning_plugin.py"
BUDGET = 10.0  # the reference builds the base preset in about 1.4 s warm: room for a loaded machine
# Checks that call forward in several ways: fixed witnesses, hypothesis, a module-scoped model, a parameter
# census that needs no forward at all. The smoke profile does not shrink: under the ci profile hypothesis
# spends seconds minimizing a crash, which a budget of a few seconds would (rightly) count as too slow.
CLAUSES = "model.shape,model.batch-independence,mask.causal,mask.finite,config.parameters"


def _malfunctions() -> dict[str, tuple[object, str]]:
    spec = importlib.util.spec_from_file_location("_malfunctions_listing", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MALFUNCTIONS


MALFUNCTIONS = _malfunctions()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("malfunctions") / "results.json"
    cmd = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider", f"--plugin={PLUGIN}",
           f"--impl=reference,{','.join(MALFUNCTIONS)}", f"--clause={CLAUSES}", f"--check-timeout={BUDGET}",
           "--hypothesis-profile=smoke", f"--results-json={out}"]
    started = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    assert out.exists(), \
        f"the suite wrote no results (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-2000:]}"
    records = defaultdict(list)
    for rec in json.loads(out.read_text())["tests"]:
        records[rec["subject"].split(":", 1)[1]].append(rec)
    return res, records, wall


def test_the_run_ends_with_failing_clauses_not_a_crash(run):
    res, _, _ = run
    assert res.returncode == 1, f"exit {res.returncode} (1 = some checks failed; 2-4 = the suite itself broke):\n" \
                                f"{res.stdout[-3000:]}{res.stderr[-2000:]}"
    assert "INTERNALERROR" not in res.stdout + res.stderr


@pytest.mark.parametrize("name", sorted(MALFUNCTIONS))
def test_each_malfunction_is_an_error_with_its_one_line_reason(run, name):
    _, records, _ = run
    _, reason = MALFUNCTIONS[name]
    recs = records.get(name)
    assert recs, f"{name}: no results"
    errors = [r for r in recs if r["outcome"] == "error"]
    assert errors, f"{name}: no check reported an error: {[(r['clause'], r['outcome']) for r in recs]}"
    for rec in errors:
        assert rec["message"].startswith(f"[{rec['clause']}]") and "could not be checked" in rec["message"], rec
        assert "\n" not in rec["message"] and len(rec["message"]) < 500, rec
    assert any(reason in r["message"] for r in errors), \
        f"{name}: no message says {reason!r}; got {sorted({r['message'] for r in errors})[:3]}"
    # A crash never reads as a verdict on the paper: no check of a malfunctioning model is a clause failure,
    # except mask.finite, which is exactly about NaN, and model.shape, which is exactly about what forward
    # returns (a tensor of the wrong shape or dtype, or no tensor at all).
    allowed = {"mask.finite"} | ({"model.shape"} if name in WRONG_OUTPUT else set())
    assert all(r["clause"] in allowed for r in recs if r["outcome"] == "failed"), recs


WRONG_OUTPUT = ["wrong-shape", "integer-output", "not-a-tensor"]


@pytest.mark.parametrize("name", WRONG_OUTPUT)
def test_a_wrong_output_fails_model_shape_with_what_it_measured(run, name):
    """model.shape's own checks judge the output's type, shape and dtype: a failure, measured vs expected; the
    other clauses still report that they could not be checked."""
    _, records, _ = run
    shape = [r for r in records[name] if r["clause"] == "model.shape"]
    assert shape and all(r["outcome"] == "failed" for r in shape), shape
    assert all("measured: forward returned" in r["detail"] and "expected:" in r["detail"] for r in shape), shape
    assert any(r["outcome"] == "error" for r in records[name] if r["clause"] != "model.shape")


def test_a_forward_that_always_raises_is_reported_once(run):
    """The shape probe finds that forward raises at every shape it tries: model.shape says so once (could not be
    checked), and every other check that needs a forward call skips naming model.shape, rather than repeating
    the crash under every clause (checks that need no forward call, such as config.parameters, still run)."""
    _, records, _ = run
    recs = records["forward-raises"]
    errors = [r for r in recs if r["outcome"] == "error"]
    assert len(errors) == 1 and errors[0]["clause"] == "model.shape", errors
    assert "forward raised at every probed shape" in errors[0]["message"], errors[0]
    skipped = [r for r in recs if r["outcome"] == "skipped"]
    # a transplant check skips earlier, for the adapter method it lacks, before it would call forward
    blocked = [r for r in skipped if "load_reference_state" not in r["message"]]
    assert blocked and all(r["message"].startswith("blocked by model.shape: forward raised at every probed shape")
                           and "CUDA kernel exploded" in r["message"] for r in blocked), blocked
    assert any(r["outcome"] == "passed" and r["clause"] == "config.parameters" for r in recs), recs


def test_the_reference_in_the_same_run_is_untouched(run):
    _, records, _ = run
    assert {r["outcome"] for r in records["reference"]} == {"passed"}, records["reference"]


def test_a_hanging_forward_costs_two_budgets_not_one_per_check(run):
    _, records, wall = run
    recs = records["hangs"]
    timed_out = [r for r in recs if "ran past its time budget" in r["message"]]
    given_up = [r for r in recs if "not run, because 2 earlier checks of hangs" in r["message"]]
    assert len(timed_out) == 2 and all(r["duration"] < BUDGET + 2 for r in timed_out), timed_out
    # The report says where the check was interrupted: inside the implementation's forward.
    assert all("interrupted at: " in r["detail"] and "malfunctioning_plugin.py" in r["detail"] for r in timed_out)
    assert all("interrupted at" not in r["detail"] for r in given_up)
    assert given_up and len(timed_out) + len(given_up) == len([r for r in recs if r["outcome"] == "error"])
    assert wall < 120, f"the run took {wall:.0f} s: a hang stalled it"


def test_our_diagnostic_is_found_inside_groups_and_chains():
    """Hypothesis reports a check whose replay failed differently as a group of both exceptions."""
    from aiayn_conformance.conformance.helpers.harness import CheckTimeout, ImplementationError
    from aiayn_conformance.conformance.helpers.reports import diagnostic as _diagnostic

    timeout, crash = CheckTimeout("[model.shape] too slow"), ImplementationError("[model.shape] crashed")
    if sys.version_info >= (3, 11):
        assert _diagnostic(BaseExceptionGroup("flaky", [ValueError("x"), timeout])) is timeout  # noqa: F821
    try:
        try:
            raise crash
        except ImplementationError:
            raise RuntimeError("while reporting") from None
    except RuntimeError as outer:
        assert _diagnostic(outer) is crash  # the context is kept even when the cause is suppressed
    assert _diagnostic(KeyError("unrelated")) is None


def test_time_spent_waiting_for_a_cpu_is_given_back_up_to_a_bound():
    from aiayn_conformance.conformance.helpers.budget import MAX_STRETCH, budget_left
    assert budget_left(120, 120, 0.0) is None  # no waiting: spent at the budget
    assert budget_left(120, 120, None) is None  # waiting unknown: wall time, as before
    assert budget_left(120, 120, 50.0) == pytest.approx(50.0)  # 50 s behind other processes: 50 s more
    assert budget_left(120, 170, 50.0) is None  # the 120 s of its own are used
    assert budget_left(120, MAX_STRETCH * 120, MAX_STRETCH * 120 - 1) is None  # never past the stretch bound
    assert budget_left(120, 500, 450.0) == pytest.approx(70.0)  # 50 s of its own used
    assert budget_left(120, 500, 490.0) == pytest.approx(MAX_STRETCH * 120 - 500)  # the stretch bound first


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="no Linux schedstat here")
def test_the_runqueue_wait_is_read_and_only_grows():
    from aiayn_conformance.conformance.helpers.budget import runqueue_wait
    first = runqueue_wait()
    sum(range(10**6))
    second = runqueue_wait()
    assert first is not None and second is not None and 0 <= first <= second


def test_the_default_budget_grows_with_the_model_beyond_base():
    """Without --check-timeout or $AIAYN_CHECK_TIMEOUT a check gets DEFAULT_TIMEOUT up to the base model at a
    vocabulary of 37,000, and proportionally more above it: the big model's checks read 3.4 times the weights."""
    from aiayn_conformance.conformance.helpers.budget import default_timeout
    from aiayn_conformance.conformance.helpers.options import DEFAULT_TIMEOUT
    from aiayn_conformance.spec.config import BASE, BIG, TINY

    assert default_timeout(TINY) == default_timeout(BASE) == DEFAULT_TIMEOUT
    assert 3 * DEFAULT_TIMEOUT < default_timeout(BIG) < 4 * DEFAULT_TIMEOUT

"""Parallel suite processes share the CPUs: conformance/helpers/threads.py and ``aiayn audit``'s thread share."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiayn_conformance.audit import runner
from aiayn_conformance.conformance.helpers import threads
from aiayn_conformance.spec.config import BIG, ModelConfig
from aiayn_conformance.spec.schema import parameter_count

HAVE_XDIST = importlib.util.find_spec("xdist") is not None


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    return monkeypatch


def test_share_divides_the_cpus_and_never_gives_zero(clean_env):
    assert [threads.share(n) for n in (1, 2, 3, 8, 16, 0)] == [8, 4, 2, 1, 1, 8]


def test_precedence(clean_env):
    assert threads.wanted_threads(None) == (None, "torch's default")
    assert threads.wanted_threads(4) == (2, "8 CPUs shared by 4 xdist workers")
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert threads.wanted_threads(4) == (None, "$OMP_NUM_THREADS")
    clean_env.setenv(threads.ENV, "5")
    assert threads.wanted_threads(4) == (5, f"${threads.ENV}")


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5"])
def test_a_bad_thread_count_is_named(clean_env, value):
    clean_env.setenv(threads.ENV, value)
    with pytest.raises(ValueError, match=rf"{threads.ENV}='{value}': expected a whole number of threads, at least 1"):
        threads.wanted_threads(None)


def test_audit_jobs_get_their_share_unless_the_user_chose(clean_env):
    assert threads.environment_for(3) == {threads.ENV: "2"}
    clean_env.setenv("OMP_NUM_THREADS", "1")
    assert threads.environment_for(3) == {}
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.setenv(threads.ENV, "4")
    assert threads.environment_for(3) == {}


def _run_probe(tmp_path, *args, env=None):
    """Run a one-test pytest session (the conformance plugin loads through its pytest11 entry point) whose test
    asserts the thread count torch has in the process that runs it."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import os, torch
        def test_threads():
            assert torch.get_num_threads() == int(os.environ["EXPECTED_THREADS"]), torch.get_num_threads()
    """))
    base = {k: v for k, v in os.environ.items() if k not in (threads.ENV, "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**base, **(env or {})})


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_XDIST, reason="pytest-xdist is not installed")
def test_xdist_workers_take_their_share(tmp_path):
    cpus = threads.available_cpus()
    if cpus < 2:
        pytest.skip(f"{cpus} CPU: one thread per worker is also torch's default, nothing to tell apart")
    res = _run_probe(tmp_path, "-v", "-n", "2", "--impl=reference", env={"EXPECTED_THREADS": str(cpus // 2)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"torch threads: {cpus // 2} per xdist worker ({cpus} CPUs shared by 2 xdist workers)" in res.stdout, \
        res.stdout[:2000]
    # The negative control: the same probe expecting torch's default fails under two workers.
    res = _run_probe(tmp_path, "-n", "2", env={"EXPECTED_THREADS": str(cpus)})
    assert res.returncode == 1, res.stdout[-3000:]


def test_the_environment_variable_sets_the_count_and_a_bad_one_is_a_usage_error(tmp_path):
    res = _run_probe(tmp_path, env={threads.ENV: "1", "EXPECTED_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    res = _run_probe(tmp_path, env={threads.ENV: "many", "EXPECTED_THREADS": "1"})
    assert res.returncode == 4 and f"{threads.ENV}='many': expected a whole number" in res.stderr, res.stderr


# -- aiayn audit: one implementation at a large size split over the spare job slots ---------------------------
GIB = 2**30
BASE_PARAMETERS = parameter_count(ModelConfig())  # Table 3's base at 37,000 shared tokens: 63,045,632
BIG_PARAMETERS = parameter_count(BIG)  # Table 3's big at 37,000 shared tokens: 214,171,648


@pytest.fixture
def outside_xdist(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    return monkeypatch


@pytest.mark.skipif(not HAVE_XDIST, reason="pytest-xdist is not installed")
def test_one_large_run_is_split_over_the_spare_slots_as_memory_allows(outside_xdist):
    assert runner.split_workers(2, 1, BASE_PARAMETERS, memory=24 * GIB)[0] == 2
    assert runner.split_workers(8, 1, BASE_PARAMETERS, memory=20 * GIB)[0] == 3  # 5.7 GiB a worker at base
    assert runner.split_workers(8, 2, BASE_PARAMETERS, memory=40 * GIB)[0] == 3  # 4 slots a run, memory for 3 each
    workers, why = runner.split_workers(2, 1, BIG_PARAMETERS, memory=24 * GIB)
    assert workers == 1 and "24.0 GiB available holds fewer than two suite processes of about 17.0 GiB" in why, why
    assert runner.split_workers(2, 1, BIG_PARAMETERS, memory=40 * GIB)[0] == 2  # where two big workers fit
    assert runner.split_workers(2, 1, BASE_PARAMETERS, memory=None)[0] == 2  # memory unknown: the slots decide


def test_no_split_without_spare_slots_at_small_sizes_or_inside_a_worker(outside_xdist):
    assert runner.split_workers(2, 2, BASE_PARAMETERS, memory=24 * GIB) == (1, "")  # a slot for each run
    assert runner.split_workers(1, 1, BASE_PARAMETERS, memory=24 * GIB) == (1, "")
    assert runner.split_workers(2, 1, runner.SPLIT_FROM - 1, memory=24 * GIB) == (1, "")  # start-up would eat it
    outside_xdist.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert runner.split_workers(2, 1, BASE_PARAMETERS, memory=24 * GIB) == (1, "")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_XDIST, reason="pytest-xdist is not installed")
def test_a_split_audit_folds_every_workers_records(tmp_path):
    """End to end at 5.3M parameters (a 37,000-token vocabulary at d_model 144): two clauses of two test files,
    each judged and passed, their records gathered from the two workers by the controller."""
    out = tmp_path / "audit.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", threads.ENV, "OMP_NUM_THREADS")}
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", "--impl", "reference", "--jobs", "2",
                          "--config", "d_model=144,n_heads=4,d_ff=288,n_layers=2,src_vocab=37000,tgt_vocab=37000",
                          "--clause", "attention.scale,mask.causal", "--format", "json", "--output", str(out)],
                         capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "each suite run split over 2 pytest-xdist workers" in res.stderr, res.stderr[-3000:]
    clauses = json.loads(out.read_text())["implementations"]["reference"]["clauses"]
    assert {c: clauses[c]["status"] for c in ("attention.scale", "mask.causal")} == \
        {"attention.scale": "pass", "mask.causal": "pass"}, clauses


def test_a_split_run_hands_out_the_longest_files_first():
    """Under pytest-xdist the suite's workers collect the longest files first (items.longest_files_first), each
    file's checks together and in order, and the audit asks xdist to keep that order (keep_file_order)."""
    from aiayn_conformance.conformance.helpers.items import CONFORMANCE_DIR, LONGEST_FILES, longest_files_first

    class Item:
        def __init__(self, path: Path, name: str) -> None:
            self.path, self.name = path, name

    collected = [Item(CONFORMANCE_DIR / f, f"{f}::{i}") for f in
                 ("test_attention.py", "test_export.py", "test_decode.py", "test_ffn.py") for i in range(2)]
    collected.append(Item(CONFORMANCE_DIR.parent / "tests" / "test_decode.py", "elsewhere"))
    order = [i.name for i in longest_files_first(collected)]  # type: ignore[arg-type]
    assert order == ["test_decode.py::0", "test_decode.py::1", "test_export.py::0", "test_export.py::1",
                     "test_attention.py::0", "test_attention.py::1", "test_ffn.py::0", "test_ffn.py::1", "elsewhere"]
    assert set(LONGEST_FILES) <= {p.name for p in CONFORMANCE_DIR.glob("test_*.py")}  # no stale name
    if HAVE_XDIST:
        assert runner.keep_file_order() == ["--no-loadscope-reorder"]  # the test extra's xdist has it (3.6+)

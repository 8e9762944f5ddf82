"""Parallel suite processes share the CPUs: conformance/helpers/threads.py and ``aiayn audit``'s thread share."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from aiayn_conformance.conformance.helpers import threads

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

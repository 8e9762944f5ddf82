"""tests/conftest.py: the processes the tests start get their worker's torch thread share and, where Python may not
write bytecode into the checkout, a private bytecode folder for the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn_conformance.conformance.helpers import threads

ROOT = Path(__file__).resolve().parents[1]
OWNER = "AIAYN_TEST_PYCACHE_OWNER"


def child(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def test_a_child_of_an_xdist_worker_gets_the_workers_thread_share(request):
    workers = getattr(request.config, "workerinput", {}).get("workercount")
    if not workers:
        pytest.skip("not under pytest-xdist: the processes started here keep torch's default")
    if threads.user_choice() == "OMP_NUM_THREADS":
        pytest.skip("OMP_NUM_THREADS is set: the user's choice, inherited as it is")
    # Set by the user (kept) or by tests/conftest.py (the worker's share); unset, the children used every core.
    expected = os.environ.get(threads.ENV)
    assert expected, f"{threads.ENV} is not set in an xdist worker of {workers}: the processes it starts would " \
                     f"run torch on all {threads.available_cpus()} CPUs beside the other workers " \
                     f"(expected {threads.share(workers)}, the worker's share)"
    seen = child(f"import os; print(os.environ.get({threads.ENV!r}))")
    assert seen == expected, f"a child process saw {threads.ENV}={seen!r}, expected {expected!r}"


def test_without_bytecode_writes_the_children_share_a_private_folder():
    if not os.environ.get(OWNER):
        pytest.skip("PYTHONDONTWRITEBYTECODE was not set for this run: Python caches bytecode as usual")
    prefix = Path(os.environ["PYTHONPYCACHEPREFIX"])
    assert prefix.is_dir() and not prefix.is_relative_to(ROOT), prefix
    seen = child("import sys; print(sys.flags.dont_write_bytecode, sys.pycache_prefix)")
    assert seen == f"0 {prefix}", f"a child process saw (dont_write_bytecode, pycache_prefix) = {seen!r}"
    cached = list(prefix.rglob("*.pyc"))
    assert cached, f"no bytecode was written under {prefix}"
    assert not any(p.is_relative_to(ROOT) for p in cached)

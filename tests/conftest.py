"""The project's own test run: bytecode and torch threads for its child processes.

The tests start well over a hundred Python processes (pytest-xdist workers, the suite and ``aiayn audit`` run in
subprocesses). Where ``PYTHONDONTWRITEBYTECODE`` is set, as in many container images, each of them compiled the
project's modules and pytest rewrote the test modules' assertions again: about 1.8 s of every process's start
(``pytest conformance/ --collect-only``: 5.5 s without bytecode, 3.7 s with it, on the project's 2-core machine).
For this run only, the processes the tests start share compiled bytecode in a private temporary folder
(``PYTHONPYCACHEPREFIX``), removed when the run ends; nothing is written into the checkout, which is what the
setting asks for. Without the setting Python caches bytecode as usual and nothing here applies.

Under pytest-xdist each worker gives torch its share of the CPUs (``conformance.helpers.threads``). The processes a
worker
starts get the same share through ``AIAYN_TORCH_THREADS``, unless the user chose a count: with torch's default of
one thread per core, each of those runs competed with the other workers (they used more CPU time than wall time).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from aiayn_conformance.conformance.helpers import threads

_OWNER = "AIAYN_TEST_PYCACHE_OWNER"  # the pid of the process that made the folder, the one that removes it

if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="aiayn-test-pycache-")
    os.environ[_OWNER] = str(os.getpid())
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_unconfigure(config) -> None:
    if os.environ.get(_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after the conformance plugin has set this worker's own count and header
def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: an end-to-end run (the suite or a command in a subprocess, a toolkit "
                                       "trained and audited) that the README's test command leaves to CI's second run")
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:  # the share of the worker count, as ``aiayn audit`` gives its concurrent runs (none if chosen)
        os.environ.update(threads.environment_for(int(workers)))

"""torch's CPU threads when several suite processes share the machine.

torch sizes its intra-op thread pool to the number of cores in every process. Two pytest-xdist
workers (or two ``aiayn audit`` jobs) on a two-core machine then run four busy threads on two
cores. The suite's operations are tiny, so the threads spend their time waiting for each other:
on the project's 2-core CI machine the same four implementations took 7.5 s with one thread per
worker and 80 to 124 s with torch's default, varying from run to run. Each process therefore
takes its share of the CPUs.

Precedence, highest first:

``AIAYN_TORCH_THREADS=N``   every suite process uses N threads (``aiayn audit`` sets it for its jobs);
``OMP_NUM_THREADS``         left to torch, which reads it at start-up;
an xdist worker             the available CPUs divided by the number of workers, at least 1;
otherwise                   torch's default.
"""

from __future__ import annotations

import os

ENV = "AIAYN_TORCH_THREADS"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share(processes: int) -> int:
    """Threads for each of ``processes`` processes running at once: the CPUs divided evenly, at least 1."""
    return max(1, available_cpus() // max(1, processes))


def user_choice() -> str | None:
    """The variable by which the user chose the thread count, if any (the first of the precedence)."""
    return next((var for var in (ENV, "OMP_NUM_THREADS") if os.environ.get(var, "").strip()), None)


def wanted_threads(workers: int | None) -> tuple[int | None, str]:
    """The thread count this process should use (None: leave torch alone), and why."""
    chosen = user_choice()
    if chosen == ENV:
        value = os.environ[ENV].strip()
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV}={value!r}: expected a whole number of threads, at least 1")
        return n, f"${ENV}"
    if chosen is not None:
        return None, f"${chosen}"
    if workers:
        return share(workers), f"{available_cpus()} CPUs shared by {workers} xdist workers"
    return None, "torch's default"


def environment_for(processes: int) -> dict[str, str]:
    """Variables for each of ``processes`` suite runs started at once (``aiayn audit``'s jobs): their share
    of the CPUs, or nothing when the user chose a count (the runs inherit that choice)."""
    return {} if user_choice() else {ENV: str(share(processes))}


def header_line(xdist_workers: int | None) -> str:
    """The report header's line in a process that runs no checks itself: xdist's controller."""
    n, why = wanted_threads(xdist_workers)
    return f"torch threads: {n or 'torch default'} per xdist worker ({why})"


def apply(workers: int | None) -> str:
    """Set torch's intra-op threads as :func:`wanted_threads` says; return a line for the report header."""
    import torch

    n, why = wanted_threads(workers)
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return f"torch threads: {torch.get_num_threads()} ({why})"

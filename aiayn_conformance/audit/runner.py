"""Running the suite for an audit: the subjects planned into suite runs (``plan``, ``take_shard``, ``group``),
each run in a subprocess of its own (``run_job``) with ``--results-json``, its records folded into one status per
subject and clause (``results.fold``).

The suite runs in one process per job slot (``--jobs``), each auditing a share of the implementations and the
components, so that start-up is paid once per core; ``--isolate`` gives every implementation its own process,
and a grouped process that dies is re-run one implementation at a time. When there are fewer runs than job slots
(one implementation at the paper's sizes), each run spreads its test files over the spare slots as pytest-xdist
workers, where memory allows (``split_workers``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aiayn_conformance.implementations.availability import version_note
from aiayn_conformance.spec import CLAUSES

from .locations import locate
from .results import AuditResult, ClauseResult, SubjectResult, fold
from .shards import Shard

__all__ = ["Job", "Progress", "audit", "group", "plan", "run_job", "split_workers", "take_shard"]


# -- running the suite ---------------------------------------------------------------------------------------
@dataclass
class Job:
    """One suite run: an implementation (``--impl``) or the selected components (``--component``),
    or a group of those (``parts``) run in one process to pay the start-up once."""
    label: str
    args: list[str]
    subjects: list[SubjectResult]
    parts: list[Job] = field(default_factory=list)
    runnable: bool = True  # False: an unavailable implementation, reported without running the suite


def group(jobs: list[Job], n: int) -> list[Job]:
    """Merge single jobs into ``n`` suite runs (round-robin, so each run gets a mix of subjects).

    Starting pytest, torch and onnx costs seconds per process; one process per core pays it once.
    A group that dies without results is re-run one subject at a time (see ``run_job``), so a crashing
    implementation still costs only its own clauses."""
    if n >= len(jobs):
        return jobs
    out = []
    for i in range(n):
        parts = jobs[i::n]
        impls = [s.name for j in parts for s in j.subjects if s.kind == "implementation"]
        comps = [s.name for j in parts for s in j.subjects if s.kind == "component"]
        args = ([f"--impl={','.join(impls)}"] if impls else []) + ([f"--component={','.join(comps)}"] if comps else [])
        out.append(Job(",".join(j.label for j in parts), args, [s for j in parts for s in j.subjects], parts))
    return out


# A suite process's peak resident memory grows with the audit configuration's parameters (its models, their copies
# and gradients, the visible and reference states): since the memos of models are emptied between test files
# (settings.release_models), measured 13.3 GiB at big (214M parameters) in one process, 5.2 GiB for the larger of two
# xdist workers at base (63M) (BENCHMARKS.md). Per worker this allows 80 bytes a parameter (72 would cover both) and
# 1 GiB for the interpreter, torch and the small models.
BYTES_PER_PARAMETER = 80
WORKER_BASELINE_BYTES = 2**30
# Below this many parameters a run is split no more: a worker's start-up (torch, the plugins, its own models and
# shape probe: seconds) costs what the split saves (the tiny preset's audit of the reference: 35 s split over two
# workers, 36 s in one process; at base 138-148 s against 183-184 s, interleaved).
SPLIT_FROM = 5_000_000


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's MemAvailable, else the physical memory), None if
    unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def split_workers(slots: int, runs: int, parameters: int, memory: int | None = None) -> tuple[int, str]:
    """pytest-xdist workers for each of ``runs`` suite runs sharing ``slots`` job slots, and why: the spare slots
    (at least two per run) for an audit configuration of ``parameters`` >= SPLIT_FROM, when pytest-xdist is
    installed, this is not itself a pytest-xdist worker (its siblings already hold the CPUs) and ``memory`` (default:
    what is available now) holds that many workers at that size; else 1 (no split)."""
    spare = slots // max(1, runs)
    if spare < 2 or parameters < SPLIT_FROM:
        return 1, ""
    if importlib.util.find_spec("xdist") is None:
        return 1, "pytest-xdist is not installed"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return 1, ""  # the test suite's own worker: its sibling workers already hold the CPUs
    memory = available_memory() if memory is None else memory
    need = parameters * BYTES_PER_PARAMETER + WORKER_BASELINE_BYTES
    if memory is None:
        return spare, f"{spare} pytest-xdist workers, one test file at a time (available memory unknown)"
    fits = min(spare, memory // (need * runs))
    if fits < 2:
        return 1, (f"{memory / 2**30:.1f} GiB available holds fewer than two suite processes of about "
                   f"{need / 2**30:.1f} GiB each")
    return fits, f"{fits} pytest-xdist workers, one test file at a time"


def keep_file_order() -> list[str]:
    """pytest-xdist's flag that hands the files out in their collected order (the suite's workers collect the
    longest files first: conformance.helpers.items.longest_files_first) instead of most tests first, where the
    installed pytest-xdist has it (3.6 and later); else nothing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = tuple(int(part) for part in re.findall(r"\d+", version("pytest-xdist"))[:2])
    except PackageNotFoundError:
        return []
    return ["--no-loadscope-reorder"] if release >= (3, 6) else []


class Progress:
    """One status line on stderr: which subjects run, how many tests of each are done."""

    def __init__(self, stream=sys.stderr, enabled: bool | None = None):
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.lock = threading.Lock()
        self.state: dict[str, str] = {}
        self.finished = 0
        self.total = 0

    def update(self, label: str, text: str | None) -> None:
        with self.lock:
            if text is None:
                self.state.pop(label, None)
                self.finished += 1
            else:
                self.state[label] = text
            if self.enabled:
                running = ", ".join(f"{k} {v}" for k, v in self.state.items())
                line = f"[{self.finished}/{self.total} done] {running}"
                width = 118
                self.stream.write("\r" + line[:width].ljust(width))
                self.stream.flush()

    def log(self, line: str) -> None:
        with self.lock:
            if self.enabled:
                self.stream.write("\r" + " " * 118 + "\r")
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 118 + "\r")
            self.stream.flush()


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _cause(text: str) -> str:
    """The line of a failed suite run's output that says why: pytest's ``ERROR: ...`` usage line, else the last
    ``SomeError: ...`` line, else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ERROR:"):
            return ln[len("ERROR:"):].strip()
    errors = [ln.lstrip("E ").strip() for ln in lines if re.match(r"^(E\s+)?\w*(Error|Exception)\b.*:", ln)]
    return errors[-1] if errors else (lines[-1] if lines else "")


# Third-party pytest plugins the suite never uses, kept out of its processes: where installed (hydra-core comes with
# fairseq), hydra's took 0.7 s of each process's start-up (python -X importtime), paid again by every xdist worker.
UNUSED_PYTEST_PLUGINS = ("-p", "no:hydra_pytest", "-p", "no:anyio")


def run_job(job: Job, *, plugins: list[str], extra: list[str], workdir: Path, timeout: float,
            progress: Progress, stream_output: bool = False, env: dict[str, str] | None = None) -> None:
    """Run the suite for one job and fold its records into ``job.subjects``.

    ``env``: variables added to the suite process's environment (the torch thread share).
    """
    from aiayn_conformance import conformance

    suite = Path(conformance.__file__).resolve().parent
    out = workdir / f"run-{abs(hash(job.label))}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "pytest", str(suite), "-p", "no:cacheprovider", *UNUSED_PYTEST_PLUGINS,
           f"--results-json={out}", f"--rootdir={suite.parent}", *job.args, *[f"--plugin={p}" for p in plugins], *extra]
    # The suite runs in the project's directory: a plugin module named from the caller's directory is looked for
    # there too (implementations.registry; plugin files are passed as absolute paths: audit.command).
    env = {**(env or {}), "AIAYN_CALLER_DIR": os.environ.get("AIAYN_CALLER_DIR") or os.getcwd()}
    if not stream_output:
        cmd.append("-q")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=None if stream_output else subprocess.PIPE,
                            stderr=None if stream_output else subprocess.PIPE, text=True,
                            cwd=suite.parent, env={**os.environ, **(env or {})})
    reader = threading.Thread(target=lambda: setattr(proc, "_captured", proc.communicate()), daemon=True)
    reader.start()
    progress_file = out.with_name(out.name + ".progress")
    timed_out = False
    while reader.is_alive():
        reader.join(0.5)
        try:
            lines = progress_file.read_text().splitlines()
        except OSError:
            lines = []
        total = next((ln.split()[1] for ln in lines if ln.startswith("total ")), "?")
        done = sum(1 for ln in lines if ln == "done")
        progress.update(job.label, f"{done}/{total}")
        if time.monotonic() - started > timeout:
            timed_out = True
            proc.kill()
            reader.join()
    stdout, stderr = getattr(proc, "_captured", ("", "")) or ("", "")
    elapsed = time.monotonic() - started
    progress.update(job.label, None)
    records: list[dict] | None = None
    if out.exists():
        try:
            records = json.loads(out.read_text())["tests"]
        except (ValueError, KeyError):
            records = None
    if (records is None or timed_out) and len(job.parts) > 1:
        progress.log(f"  the grouped run of {job.label} ended without results; re-running each alone")
        progress.total += len(job.parts)
        for part in job.parts:
            run_job(part, plugins=plugins, extra=extra, workdir=workdir, timeout=timeout / len(job.parts),
                    progress=progress, stream_output=stream_output, env=env)
        return
    try:
        collected = any(ln.startswith("total ") for ln in progress_file.read_text().splitlines())
    except OSError:
        collected = False
    if timed_out or (records is None and collected):  # the implementation hung or killed the run: not judged
        why = (f"the suite run timed out after {timeout:.0f} s" if timed_out else
               f"the suite run ended with exit status {proc.returncode} and wrote no results (the checks were "
               "collected, so the implementation ended the process)")
        tail = _tail((stderr or "") + "\n" + (stdout or ""))
        for subject in job.subjects:
            subject.seconds = elapsed
            subject.clauses = {c: ClauseResult("error", why, tail) for c in CLAUSES}
        return
    if records is None:  # not one check was collected: the run could not audit (a plugin that fails to import)
        cause = _cause((stderr or "") + "\n" + (stdout or ""))
        for subject in job.subjects:
            subject.seconds = elapsed
            subject.could_not_audit = (f"the suite run ended with exit status {proc.returncode} and wrote no "
                                       f"results" + (f": {cause}" if cause else ""))
        return
    prefix = {"implementation": "impl:", "component": "component:"}
    for subject in job.subjects:
        mine = [r for r in records if r.get("subject") == prefix[subject.kind] + subject.name]
        subject.clauses = fold(mine, subject.deviations)
        subject.learning_curves = [r["data"]["learning_curve"] for r in mine
                                   if isinstance(r.get("data"), dict) and "learning_curve" in r["data"]]
        subject.seconds = elapsed if len(job.subjects) == 1 else sum(r.get("duration", 0.0) for r in mine)


def plan(registry, impl_selection: str | None, component_selection: str | None) -> list[Job]:
    jobs: list[Job] = []
    if impl_selection:
        for impl in registry.select(impl_selection):
            subject = SubjectResult(impl.name, "implementation", impl.source, impl.summary, dict(impl.deviations),
                                    unavailable=impl.unavailable, note=version_note(impl.written_for),
                                    location=locate(impl.build, impl.deviations))
            # An implementation that cannot be built here is reported as unavailable, with no suite run.
            jobs.append(Job(impl.name, [f"--impl={impl.name}"], [subject], runnable=not impl.unavailable))
    if component_selection:
        comps = registry.select_components(component_selection)
        if comps:
            subjects = [SubjectResult(f"{c.kind}:{c.name}", "component", c.source, c.summary, dict(c.deviations),
                                      location=locate(c.factory, c.deviations)) for c in comps]
            # Components are cheap: all of them in one run, each its own subject in the records.
            selection = ",".join(s.name for s in subjects)
            jobs.append(Job("components", [f"--component={selection}"], subjects))
    return jobs


def take_shard(jobs: list[Job], shard: Shard) -> list[Job]:
    """The jobs of ``shard``'s subjects (``aiayn_conformance.audit.shards``): whole jobs for implementations, and the
    components job cut down to the components the shard holds."""
    out = []
    for job in jobs:
        mine = [s for s in job.subjects if shard.holds(s.name)]
        if len(mine) == len(job.subjects):
            out.append(job)
        elif mine:  # the components job: its share only
            out.append(Job(job.label, [f"--component={','.join(s.name for s in mine)}"], mine, runnable=job.runnable))
    return out


def audit(jobs: list[Job], *, plugins: list[str], extra: list[str], jobs_n: int, timeout: float,
          progress: Progress, with_figures: bool = False, isolate: bool = False, parameters: int = 0) -> AuditResult:
    """Run ``jobs`` (``jobs_n`` suite runs at a time) and fold their records into the subjects; ``parameters``:
    the audit configuration's parameter count, which bounds how many workers a run may split into
    (``split_workers``)."""
    started = time.monotonic()
    singles = jobs
    jobs = [j for j in jobs if j.runnable]
    for job in singles:
        if not job.runnable:
            progress.log(f"  {job.label}: {job.subjects[0].verdict}")
    if not jobs:
        progress.close()
        return AuditResult([s for job in singles for s in job.subjects], time.monotonic() - started)
    if not isolate:
        jobs = group(jobs, jobs_n)
        timeout = timeout * max(len(j.parts) for j in jobs) if any(j.parts for j in jobs) else timeout
    progress.total = len(jobs)
    from aiayn_conformance.conformance.helpers import threads

    runs = min(max(1, jobs_n), len(jobs))
    workers, why = split_workers(jobs_n, runs, parameters)
    if workers > 1:
        extra = [*extra, "-n", str(workers), "--dist", "loadfile", *keep_file_order()]
    if why:
        progress.log(f"aiayn audit: each suite run {'split over' if workers > 1 else 'in one process:'} {why}")
    env = threads.environment_for(runs * workers)  # each concurrent process's share of the CPUs
    with tempfile.TemporaryDirectory(prefix="aiayn-audit-") as tmp:
        workdir = Path(tmp)

        def one(job: Job) -> None:
            run_job(job, plugins=plugins, extra=extra, workdir=workdir, timeout=timeout, progress=progress, env=env)
            for s in job.subjects:
                progress.log(f"  {s.name}: {s.verdict} ({s.seconds:.0f} s)")
            if with_figures:
                from .figures import figures_for, learning_curves_figure

                for s in job.subjects:
                    if s.kind == "implementation":
                        s.figures, s.figure_errors = figures_for(s.name, plugins=plugins, workdir=workdir)
                        if s.learning_curves:
                            try:
                                s.figures.update(learning_curves_figure(s.name, s.learning_curves))
                            except Exception as exc:  # a picture lost, never the report
                                s.figure_errors.append(f"learning curves: {type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=max(1, jobs_n)) as pool:
            list(pool.map(one, jobs))
    progress.close()
    return AuditResult([s for job in singles for s in job.subjects], time.monotonic() - started)

"""Training and inference throughput of implementations, side by side, on the same inputs.

Each measurement runs in its own fresh process (so peak memory is per
measurement and one run's allocator state cannot slow the next), with the
same thread count. What is measured:

* ``train``: one step = forward + cross-entropy at every target position (the
  random batches hold no padding) + backward + Adam (beta 0.9/0.98, eps 1e-9,
  §5.3); ``eval``: one forward in eval mode under ``torch.no_grad``.
* presets: ``base`` is Table 3's; ``small`` (d_model 256, h 4, d_ff 1024, 3
  layers, vocabulary 8000) is this module's, for quick runs (``config_for``).
* tokens per second counts source plus target tokens of the batch.
* model FLOPs per step are counted once with ``torch.utils.flop_counter`` on
  the reference for each workload (fused library kernels such as
  nn.Transformer's eval fast path hide their FLOPs from the counter, so every
  implementation is credited with the same model FLOPs), then divided by the
  median step time; the machine's peak is measured in the same run as a large
  float32 matmul.
* peak memory is the process's peak resident set size growth during the
  measurement on CPU, and ``torch.cuda.max_memory_allocated`` on CUDA.

Usage: ``python -m benchmarks`` (everything, writes BENCHMARKS.md) or
``python -m benchmarks.perf --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

IMPLS = ("reference", "fused", "torch-nn")
WORKLOADS = (  # (preset, batch, length)
    ("small", 8, 64),
    ("base", 8, 128),
    ("base", 8, 256),
)


@dataclass
class Result:
    impl: str
    preset: str
    batch: int
    length: int
    mode: str
    device: str
    dtype: str
    times: list[float]
    tokens: int
    flops: float
    peak_mem_mb: float
    error: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def spread(self) -> float:
        """(max - min) / median, in percent."""
        return 100 * (max(self.times) - min(self.times)) / self.median if len(self.times) > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.median

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.median


def config_for(preset: str, length: int):
    from aiayn_conformance.spec import BASE, ModelConfig

    if preset == "small":
        return ModelConfig(src_vocab=8000, tgt_vocab=8000, d_model=256, n_heads=4, d_ff=1024, n_layers=3,
                           max_len=max(length, 64))
    if preset == "base":
        return BASE.replace(max_len=max(length, BASE.max_len))
    from aiayn_conformance.spec import preset as named

    return named(preset).replace(max_len=max(length, 64))


def _log_probs(out, kind: str):
    import torch

    if kind == "logits":
        return torch.log_softmax(out.float(), dim=-1)
    if kind == "probs":
        return torch.log(out.float().clamp_min(1e-30))
    return out.float()


def measure(impl_name: str, preset: str, batch: int, length: int, mode: str, *, repeats: int, warmup: int,
            device: str = "cpu", dtype: str = "float32", threads: int | None = None) -> Result:
    """One measurement in this process."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from aiayn_conformance.implementations import get_registry

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    impl = get_registry().get(impl_name)
    cfg = config_for(preset, length)
    dev = torch.device(device)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = impl.build(cfg).to(dev)
    src = torch.randint(1, cfg.src_vocab, (batch, length), device=dev)
    tgt_in = torch.randint(1, cfg.tgt_vocab, (batch, length), device=dev)
    tgt_out = torch.randint(1, cfg.tgt_vocab, (batch, length), device=dev)
    autocast = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else torch.autocast(device_type=dev.type, enabled=False))
    if mode == "train":
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast:
                out = model(src, tgt_in)
                loss = torch.nn.functional.nll_loss(_log_probs(out, impl.output).flatten(0, 1), tgt_out.flatten())
            loss.backward()
            opt.step()
    else:
        model.eval()

        def step():
            with torch.no_grad(), autocast:
                model(src, tgt_in)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with FlopCounterMode(display=False) as counter:
        step()
    flops = float(counter.get_total_flops())
    for _ in range(warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024  # KiB -> MiB on Linux
    return Result(impl_name, preset, batch, length, mode, device, dtype, times, batch * 2 * length, flops, peak)


def matmul_peak(n: int = 2048, repeats: int = 15, device: str = "cpu", threads: int | None = None) -> float:
    """Best FLOP/s of an n x n float32 matmul (2 n^3 FLOPs) over ``repeats``: the machine's attainable peak.

    The best, not the median: on a shared machine a median peak falls with the neighbours' load and a
    model step measured in a quieter moment then shows more than 100% of it."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    a @ b
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times)


def run_isolated(args: list[str], timeout: float) -> dict:
    """Run one measurement in a fresh process and parse its JSON line."""
    cmd = [sys.executable, "-m", "benchmarks.perf", "--worker", *args]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def run_all(impls=IMPLS, workloads=WORKLOADS, modes=("train", "eval"), *, repeats: int = 3, warmup: int = 2,
            device: str = "cpu", dtypes=("float32",), threads: int | None = None, timeout: float = 1800,
            progress=print) -> tuple[list[Result], float]:
    threads_arg = ["--threads", str(threads)] if threads else []
    peak = run_isolated(["peak", "--device", device, *threads_arg], timeout)
    peak_flops = float(peak.get("peak", float("nan")))
    progress(f"matmul peak: {peak_flops / 1e9:.1f} GFLOP/s (float32, {device})")
    results = []
    for dtype in dtypes:
        for preset, batch, length in workloads:
            for mode in modes:
                for impl in impls:
                    progress(f"  {impl:<10} {preset:<5} B={batch} L={length} {mode:<5} {dtype} ...")
                    args = ["measure", impl, preset, str(batch), str(length), mode, "--repeats", str(repeats),
                            "--warmup", str(warmup), "--device", device, "--dtype", dtype, *threads_arg]
                    data = run_isolated(args, timeout)
                    if data.get("error") or "times" not in data:
                        results.append(Result(impl, preset, batch, length, mode, device, dtype, [], 0, 0.0, 0.0,
                                              error=data.get("error") or "no result"))
                    else:
                        results.append(Result(**data))
    model_flops = {(r.preset, r.batch, r.length, r.mode, r.dtype): r.flops for r in results
                   if r.impl == "reference" and not r.error}
    for r in results:
        r.flops = model_flops.get((r.preset, r.batch, r.length, r.mode, r.dtype), r.flops)
    return results, peak_flops


def table(results: list[Result], peak_flops: float) -> str:
    """A Markdown table: throughput, ratio to torch-nn measured in the same run, share of the matmul peak."""
    baseline = {(r.preset, r.batch, r.length, r.mode, r.dtype): r for r in results
                if r.impl == "torch-nn" and not r.error}
    rows = ["| implementation | preset | batch | length | step | dtype | median s/step | spread | tokens/s "
            "| vs torch-nn | GFLOP/s | % of matmul peak | peak mem MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.error:
            rows.append(f"| {r.impl} | {r.preset} | {r.batch} | {r.length} | {r.mode} | {r.dtype} | "
                        f"error: {r.error} | | | | | | |")
            continue
        base = baseline.get((r.preset, r.batch, r.length, r.mode, r.dtype))
        ratio = f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base else "n/a"
        share = f"{100 * r.flops_per_s / peak_flops:.0f}%" if peak_flops == peak_flops else "n/a"
        rows.append(f"| {r.impl} | {r.preset} | {r.batch} | {r.length} | {r.mode} | {r.dtype} | {r.median:.3f} "
                    f"| ±{r.spread / 2:.0f}% | {r.tokens_per_s:,.0f} | {ratio} | {r.flops_per_s / 1e9:.1f} | {share} "
                    f"| {r.peak_mem_mb:,.0f} |")
    return "\n".join(rows)


def targets(results: list[Result], peak_flops: float) -> list[str]:
    """The benchmark issue's targets, judged on this run's figures (float32 training at the base preset)."""
    def find(impl, length, mode="train"):
        return next((r for r in results if r.impl == impl and r.preset == "base" and r.batch == 8
                     and r.length == length and r.mode == mode and r.dtype == "float32" and not r.error), None)

    lines = []
    for length in (128, 256):
        fused, ref, tnn = find("fused", length), find("reference", length), find("torch-nn", length)
        if not (fused and ref and tnn):
            lines.append(f"- base, length {length}: not measured")
            continue
        f_ratio, r_ratio = fused.tokens_per_s / tnn.tokens_per_s, ref.tokens_per_s / tnn.tokens_per_s
        lines.append(f"- base, batch 8, length {length}, training: fused {f_ratio:.2f}x torch-nn (target >= 1.0: "
                     f"{'met' if f_ratio >= 1.0 else f'missed by {1.0 - f_ratio:.2f}'}); reference {r_ratio:.2f}x "
                     f"(target >= 0.8: {'met' if r_ratio >= 0.8 else f'missed by {0.8 - r_ratio:.2f}'})")
    for mode in ("train", "eval"):
        fused = find("fused", 256, mode)
        if fused and peak_flops == peak_flops:
            share = fused.flops_per_s / peak_flops
            lines.append(f"- fused, base, batch 8, length 256, {mode}: {100 * share:.0f}% of the matmul peak "
                         f"(target >= 60%: {'met' if share >= 0.6 else f'missed by {100 * (0.6 - share):.0f} points'})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf", description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("what", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default=",".join(IMPLS), help="comma-separated implementations")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (oneDNN sets up kernels)")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32; CUDA: both)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--quick", action="store_true", help="only the small preset")
    args = parser.parse_args(argv)
    if args.worker:
        kind, *rest = args.what
        if kind == "peak":
            print(json.dumps({"peak": matmul_peak(device=args.device, threads=args.threads)}))
            return 0
        impl, preset, batch, length, mode = rest
        res = measure(impl, preset, int(batch), int(length), mode, repeats=args.repeats, warmup=args.warmup,
                      device=args.device, dtype=args.dtype or "float32", threads=args.threads)
        print(json.dumps(asdict(res)))
        return 0
    dtypes = (args.dtype,) if args.dtype else (("float32", "bfloat16") if args.device == "cuda" else ("float32",))
    workloads = WORKLOADS[:1] if args.quick else WORKLOADS
    results, peak = run_all(tuple(args.impl.split(",")), workloads, repeats=args.repeats, warmup=args.warmup,
                            device=args.device, dtypes=dtypes, threads=args.threads)
    print(table(results, peak))
    return 0


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())

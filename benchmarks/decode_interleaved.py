"""Cached CPU decoders against CTranslate2, measured interleaved: is each at least 1.5x as fast?

The decoders (``ctranslate2``, the baseline; ``fused cached``; ``onnxruntime cached``; ``eager cached`` on
request) decode the same sources with the same weights (the reference at the base preset, random weights,
seed 0), exactly ``--new-tokens`` tokens each, since no end symbol can stop them. A *cell* is (vocabulary,
threads, batch, search). In a cell every decoder runs once untimed, its tokens compared with CTranslate2's,
then once per round in an order that rotates each round, each in a worker process of its own (``Models``
says why), so that load which comes and goes falls on every decoder alike. A decoder's ratio is its median
over CTranslate2's median in the same cell; the target is at most 0.67 (1.5x the tokens per second) in
every cell. Two floors (``ProductFloor``, ``TorchProductFloor``) and an estimate at the machine's rates
(``MachineRates``) say how much of a ratio the matrix products alone take. BENCHMARKS.md has the results.

Usage: ``python3 -m benchmarks.decode_interleaved [--quick] [--preset base] [--vocabs 8000,37000]
[--threads 1,2] [--batches 1,8] [--searches greedy,beam] [--rounds 5] [--new-tokens 50]
[--decoders NAME,...] [--profile]``. ``--quick`` is a smoke test (the tiny preset, small vocabularies, few
tokens and rounds); ``--profile`` prints where the time goes inside one decode.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import cpu_name

SRC_LEN = 32
NEW_TOKENS = 50
BEAM = 4
ALPHA = 0.6
BOS, NEVER = 1, -1
TARGET_RATIO = 0.67  # time ratio vs CTranslate2: 1 / 1.5, rounded as the issue states it
BASELINE = "ctranslate2"
FLOOR = "products only (onnxruntime)"  # not decoders: the floors of decoders on onnxruntime's kernels
TORCH_FLOOR = "products only (PyTorch)"  # ... and on the fused path's PyTorch kernels (ProductFloor, TorchProductFloor)
FLOORS = (FLOOR, TORCH_FLOOR)
ESTIMATE = "products at machine rates"  # computed, not run (products_estimate)
DECODERS = ("eager cached", "fused cached", "onnxruntime cached", *FLOORS)
DEFAULT_DECODERS = ("fused cached", "onnxruntime cached", *FLOORS)  # eager cached, the slowest, on request
PYTORCH = ("eager cached", "fused cached")

Decode = Callable[[Any, int], Any]  # (src, beam) -> tokens [B, L]


@dataclass(frozen=True)
class Cell:
    vocab: int
    threads: int
    batch: int
    beam: int

    @property
    def search(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


@dataclass(frozen=True)
class MachineRates:
    """What this machine sustained at ``threads`` threads: ``stream`` bytes read from memory per second and
    ``gemm`` float32 FLOP/s (``measure_rates``)."""

    threads: int
    stream: float
    gemm: float

    def describe(self) -> str:
        return (f"{self.threads} thread(s): memory streaming {self.stream / 1e9:.1f} GB/s, "
                f"float32 GEMM {self.gemm / 1e9:.0f} GFLOP/s")


def product_shapes(cfg: Any) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(in, out) of every product by a weight matrix in an exact float32 decode, as ``ProductFloor`` runs them:
    the encoder's (per layer Q|K|V, W^O, W_1, W_2, then each decoder layer's cross-attention K|V), run over every
    source token, and one step's (per decoder layer Q|K|V, W^O, cross-attention W^Q and W^O, W_1, W_2, then the
    vocabulary projection)."""
    d, f, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    encoder = [(d, 3 * d), (d, d), (d, f), (f, d)] * L + [(d, 2 * d)] * L
    step = [(d, 3 * d), (d, d), (d, d), (d, d), (d, f), (f, d)] * L + [(d, cfg.tgt_vocab)]
    return encoder, step


def products_estimate(cfg: Any, cell: Cell, rates: MachineRates, new_tokens: int, src_len: int = SRC_LEN) -> float:
    """Seconds the products of one decode of ``cell`` would take at ``rates``: each product the longer of its float32
    weights read once at ``rates.stream`` and its 2 x rows x in x out FLOPs at ``rates.gemm``; the encoder's at
    B x S rows, the first step's at B rows, the others' at B x K."""
    encoder, step = product_shapes(cfg)

    def seconds(shapes: list[tuple[int, int]], rows: int) -> float:
        return sum(max(4 * i * o / rates.stream, 2 * rows * i * o / rates.gemm) for i, o in shapes)

    B = cell.batch
    return (seconds(encoder, B * src_len) + seconds(step, B)
            + (new_tokens - 1) * seconds(step, B * cell.beam))


def _rates_worker(conn: Any, threads: int, nbytes: int, repeats: int, gemm_n: int) -> None:
    """In a fresh process: the best of ``repeats`` reads of an ``nbytes`` array by ``threads`` threads (np.dot of its
    part with itself, one BLAS thread each), then ``matmul_peak`` of ``gemm_n`` x ``gemm_n`` at ``threads``."""
    import os

    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = "1"  # before numpy loads its BLAS: the threads below are the only parallelism
    try:
        from concurrent.futures import ThreadPoolExecutor

        import numpy as np

        from benchmarks.perf import matmul_peak

        a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
        parts = np.array_split(a, threads)
        best = float("inf")
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(pool.map(lambda x: float(np.dot(x, x)), parts))
                best = min(best, time.perf_counter() - t0)
        conn.send(("ok", (a.nbytes / best, matmul_peak(gemm_n, threads=threads))))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    """``target(conn, *args)`` started in a fresh process (``multiprocessing``'s spawn, a daemon): the process and
    this side's end of the pipe it answers on."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    child.close()
    return process, conn


def measure_rates(threads: int, *, nbytes: int = 256 << 20, repeats: int = 7, gemm_n: int = 2048) -> MachineRates:
    """This machine's memory streaming rate and float32 GEMM rate at ``threads``, measured in a worker process of its
    own (so that no runtime's thread pool in this process takes part). RuntimeError with the reason on failure."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    process, conn = _spawn(_rates_worker, threads, nbytes, repeats, gemm_n)
    try:
        status, value = conn.recv()
    except EOFError:
        status, value = "error", "its worker process ended without an answer"
    finally:
        process.join(timeout=30)
        conn.close()
    if status != "ok":
        raise RuntimeError(f"measuring the machine's rates failed: {value}")
    return MachineRates(threads, *value)


@dataclass
class Result:
    cell: Cell
    times: dict[str, list[float]] = field(default_factory=dict)
    same: dict[str, bool] = field(default_factory=dict)  # tokens equal CTranslate2's (baseline absent: not set)
    errors: dict[str, str] = field(default_factory=dict)
    estimate: float | None = None  # seconds: the products at the machine's rates (``products_estimate``)
    rates: MachineRates | None = None  # the rates that estimate used

    def median(self, name: str) -> float:
        t = self.times.get(name)
        return statistics.median(t) if t else float("nan")

    def ratio(self, name: str) -> float | None:
        """This decoder's median time over CTranslate2's, in this cell; None when either is missing."""
        if not self.times.get(name) or not self.times.get(BASELINE):
            return None
        return self.median(name) / self.median(BASELINE)

    def estimate_ratio(self) -> float | None:
        """The products at the machine's rates over CTranslate2's median, in this cell; None when either is missing."""
        if self.estimate is None or not self.times.get(BASELINE):
            return None
        return self.estimate / self.median(BASELINE)

    def best(self, names: Sequence[str]) -> tuple[str, float] | None:
        """The fastest of ``names`` relative to CTranslate2, among those whose tokens equal CTranslate2's."""
        ratios = [(n, r) for n in names if (r := self.ratio(n)) is not None and self.same.get(n, False)]
        return min(ratios, key=lambda x: x[1]) if ratios else None


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rotation(names: Sequence[str], round_: int) -> list[str]:
    """The order of ``round_``: the list rotated left by ``round_`` places."""
    k = round_ % len(names) if names else 0
    return [*names[k:], *names[:k]]


def run_cell(cell: Cell, decoders: dict[str, Decode], src: Any, rounds: int,
             clock: Callable[[], float] = time.perf_counter) -> Result:
    """Warm each decoder up once (its tokens compared with the baseline's), then ``rounds`` rotating rounds."""
    result = Result(cell)
    tokens: dict[str, list[list[int]]] = {}
    for name, decode in decoders.items():
        try:
            out = decode(src, cell.beam)
            if out is not None:  # None: not a decoder (the product floor), timed only
                tokens[name] = out.tolist()
        except Exception as exc:  # one failing decoder must not lose the others' figures
            result.errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    alive = [n for n in decoders if n not in result.errors]
    if BASELINE in tokens:
        result.same = {n: tokens[n] == tokens[BASELINE] for n in alive if n != BASELINE and n in tokens}
    result.times = {n: [] for n in alive}
    for r in range(rounds):
        for name in rotation(alive, r):
            gc.collect()
            t0 = clock()
            decoders[name](src, cell.beam)
            result.times[name].append(clock() - t0)
    return result


def _verdict(ratio: float) -> str:
    return "met" if ratio <= TARGET_RATIO else "MISSED"


def report(results: Sequence[Result], names: Sequence[str], *, header: str, new_tokens: int,
           rounds: int) -> list[str]:
    """A markdown table (one row per cell: CTranslate2's median, each decoder's ratio, the verdicts) and a summary."""
    ours = [n for n in names if n != BASELINE]
    estimated = any(res.estimate is not None for res in results)
    extra = [ESTIMATE] if estimated else []
    out = [header, "",
           f"Time relative to CTranslate2 in the same cell (median of {rounds} interleaved rounds each; below 1 = "
           f"faster; target <= {TARGET_RATIO:g}, i.e. >= 1.5x CTranslate2's tokens/s). '≠' marks a decoder whose "
           f"tokens differ from CTranslate2's. {new_tokens} new tokens per source." +
           (f" '{ESTIMATE}' is computed from the machine's measured rates (below the table), not run." if estimated
            else ""), "",
           "| vocab | threads | batch | search | ctranslate2 s | " + " | ".join([*ours, *extra]) +
           " | best PyTorch | best | target |",
           "|---" * (8 + len(ours) + len(extra)) + "|"]
    misses, unequal, above, machine_above = [], [], [], []
    for res in results:
        c = res.cell
        cells = []
        for n in ours:
            r = res.ratio(n)
            if n in res.errors:
                cells.append(f"failed: {res.errors[n]}")
            elif r is None:
                cells.append(f"{res.median(n):.3f} s" if res.times.get(n) else "-")
            else:
                mark = "" if res.same.get(n, True) else " ≠"
                cells.append(f"{r:.2f}{mark}")
            if res.same.get(n) is False:
                unequal.append(f"{n} at vocab {c.vocab}, {c.threads} thread(s), batch {c.batch}, {c.search}")
        if estimated:
            e = res.estimate_ratio()
            cells.append("-" if e is None else f"{e:.2f}")
            if e is not None and e > TARGET_RATIO:
                machine_above.append(f"vocab {c.vocab}, {c.threads} thread(s), batch {c.batch}, {c.search}: {e:.2f}")
        base = f"{res.median(BASELINE):.3f}" if res.times.get(BASELINE) else (res.errors.get(BASELINE) or "-")
        best_pt, best = res.best([n for n in ours if n in PYTORCH]), res.best(ours)
        bp = f"{best_pt[1]:.2f} ({best_pt[0]})" if best_pt else "-"
        b = f"{best[1]:.2f} ({best[0]})" if best else "-"
        verdict = _verdict(best[1]) if best else "-"
        floor = res.ratio(FLOOR)
        if floor is not None and floor > TARGET_RATIO:
            above.append(f"vocab {c.vocab}, {c.threads} thread(s), batch {c.batch}, {c.search}: {floor:.2f}")
            verdict += " (floor above the target)" if verdict == "MISSED" else ""
        if best and not verdict.startswith("met"):
            misses.append(f"vocab {c.vocab}, {c.threads} thread(s), batch {c.batch}, {c.search}: best {best[1]:.2f} "
                          f"({best[0]})")
        out.append(f"| {c.vocab} | {c.threads} | {c.batch} | {c.search} | {base} | " + " | ".join(cells) +
                   f" | {bp} | {b} | {verdict} |")
    out.append("")
    judged = [r for r in results if r.best(ours)]
    out.append(f"Cells meeting the target: {len(judged) - len(misses)} of {len(judged)}" +
               (f"; missed: {'; '.join(misses)}" if misses else ""))
    if any(res.times.get(FLOOR) and res.times.get(BASELINE) for res in results):
        out.append(f"Cells where the matrix products alone ({FLOOR}) take more than "
                   f"{TARGET_RATIO:g} of CTranslate2's time: {len(above)}" + (f": {'; '.join(above)}" if above else ""))
    if any(res.times.get(TORCH_FLOOR) and res.times.get(BASELINE) for res in results):
        slow = [f"vocab {r.cell.vocab}, {r.cell.threads} thread(s), batch {r.cell.batch}, {r.cell.search}: {x:.2f}"
                for r in results if (x := r.ratio(TORCH_FLOOR)) is not None and x > 1]
        out.append(f"Cells where the PyTorch path's matrix products alone ({TORCH_FLOOR}) take longer than "
                   f"CTranslate2's whole decode: {len(slow)}" + (f": {'; '.join(slow)}" if slow else ""))
    if estimated and any(r.estimate_ratio() is not None for r in results):
        out.append(f"Cells where the products at the machine's rates ({ESTIMATE}) would take more than "
                   f"{TARGET_RATIO:g} of CTranslate2's time: {len(machine_above)}" +
                   (f": {'; '.join(machine_above)}" if machine_above else ""))
        rates = {(r.cell.vocab, r.rates.threads): r.rates for r in results if r.rates is not None}
        out.append("Machine rates, measured before each vocabulary's cells at each thread count: " +
                   "; ".join(f"vocab {v}, {m.describe()}" for (v, _), m in rates.items()))
    out.append("Tokens equal to CTranslate2's in every cell and decoder" if not unequal and judged else
               f"Tokens DIFFER from CTranslate2's: {'; '.join(unequal)}" if unequal else
               "Tokens not compared (CTranslate2 not measured)")
    return out


# -- the decoders ---------------------------------------------------------------------------------------------
def _search(decoder: Any, src: Any, beam: int, pad_id: int, new_tokens: int) -> Any:
    import torch

    from aiayn_conformance.reference.decoding import beam_search, greedy_search

    with torch.inference_mode():
        if beam == 1:
            return greedy_search(decoder, src, bos_id=BOS, eos_id=NEVER, pad_id=pad_id, max_len=new_tokens).tokens
        return beam_search(decoder, src, bos_id=BOS, eos_id=NEVER, pad_id=pad_id, beam_size=beam, alpha=ALPHA,
                           max_len=new_tokens).tokens


class Models:
    """One vocabulary's model in every runtime: the exports are written once into ``tmp``, and each decoder runs
    alone in its own worker process (``Isolated``), made per thread count on demand.

    Why processes: each runtime brings its own thread pool (PyTorch's OpenMP threads, CTranslate2's,
    onnxruntime's), and at 2 threads on a 2-core machine the pools of one process slowed each other by
    1.5-2x (BENCHMARKS.md has the measurements). One process per decoder, run one at a time in the rotating
    order, keeps the interleaving without that contention. ``local`` builds the same decoders in this
    process (``--profile``, the tests).
    """

    def __init__(self, cfg: Any, tmp: Path, names: Sequence[str], new_tokens: int):
        import torch

        from aiayn_conformance.implementations import get_registry

        self.cfg, self.tmp, self.names, self.n = cfg, tmp, names, new_tokens
        torch.manual_seed(0)
        self.model = get_registry().get("reference").build(cfg).eval()
        torch.save(self.model.state_dict(), tmp / STATE_FILE)  # what every worker loads
        self._workers: dict[str, Isolated] = {}
        self._threads: int | None = None
        self.notes: list[str] = []
        if "onnxruntime cached" in names:
            from aiayn_conformance.export.kv_cache import export_cached_generation

            t0 = time.perf_counter()
            export_cached_generation(self.model, tmp / "cached", cfg, progress=_say)
            self.notes.append(f"vocab {cfg.tgt_vocab}: ONNX export {time.perf_counter() - t0:.0f} s")
        self.ct2 = False
        if BASELINE in names:
            from aiayn_conformance.export import ctranslate2 as ct2

            if ct2.available():
                ct2.export_ctranslate2(self.model, tmp / "ct2", cfg)
                self.ct2 = True
            else:
                self.notes.append("ctranslate2: not measured (the package is not installed); no ratios")

    def _measured(self) -> list[str]:
        return [n for n in self.names if n != BASELINE or self.ct2]

    def decoders(self, threads: int) -> dict[str, Decode]:
        """Each decoder at ``threads`` in a worker process of its own (the previous thread count's are closed)."""
        if self._threads != threads:
            self.close()
            self._workers = {name: Isolated(name, self.cfg, self.tmp, self.n, threads) for name in self._measured()}
            self._threads = threads
        return dict(self._workers)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers, self._threads = {}, None

    def local(self, threads: int) -> dict[str, Decode]:
        """The same decoders in this process (no isolation): for ``--profile`` and the tests."""
        return {name: make_decoder(name, self.cfg, self.tmp, self.n, threads) for name in self._measured()}


STATE_FILE = "reference_state.pt"


def make_decoder(name: str, cfg: Any, tmp: Path, n: int, threads: int) -> Decode:
    """Decoder ``name`` at ``threads`` from the exports and the reference's weights in ``tmp``."""
    import torch

    from aiayn_conformance.implementations import get_registry

    if name not in (BASELINE, *DECODERS):
        raise ValueError(f"unknown decoder {name!r}; accepted: {', '.join((BASELINE, *DECODERS))}")
    pad = cfg.pad_id
    if name == BASELINE:
        from aiayn_conformance.export.ctranslate2 import CT2Decoder

        ct2 = CT2Decoder(tmp / "ct2", threads=threads)
        return lambda src, k: ct2.search(src, eos_id=NEVER, beam_size=k, length_penalty=ALPHA, max_len=n)[0]
    if name == "onnxruntime cached":
        from aiayn_conformance.export.kv_cache import OrtCachedDecoder

        ort = OrtCachedDecoder.load(tmp / "cached", threads=threads)
        return lambda src, k: _search(ort, src, k, pad, n)
    state = torch.load(tmp / STATE_FILE)
    if name in ("eager cached", FLOOR):
        model = get_registry().get("reference").build(cfg).eval()
        model.load_state_dict(state)
        if name == FLOOR:
            return ProductFloor(model, tmp / f"floor-{threads}", n, threads)
        return lambda src, k: _search(model, src, k, pad, n)
    fused = get_registry().get("fused").build(cfg).eval()  # fused cached and its floor need no reference model
    fused.load_reference_state(state)
    if name == "fused cached":
        return lambda src, k: _search(fused, src, k, pad, n)
    return TorchProductFloor(fused, n)  # TORCH_FLOOR


def _serve(conn: Any, name: str, cfg: Any, tmp: Path, n: int, threads: int) -> None:
    """A worker's loop: build decoder ``name``, then answer each (src, beam) with ("ok", its output) or
    ("error", one line) until None arrives."""
    import torch

    torch.set_num_threads(threads)
    try:
        decode = make_decoder(name, cfg, tmp, n, threads)
        conn.send(("ok", None))
    except Exception as exc:  # reported by the parent, where the cell's table shows it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while (job := conn.recv()) is not None:
        try:
            conn.send(("ok", decode(*job)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Isolated:
    """Decoder ``name`` alone in a worker process (``multiprocessing``'s spawn): calling it sends (src, beam) and
    returns what the decoder returned (tokens, or None for a floor). The pipe adds well under a millisecond
    per call (a few kB each way) to decodes of 0.1 s and more. A failure in the worker raises RuntimeError."""

    def __init__(self, name: str, cfg: Any, tmp: Path, n: int, threads: int):
        self.name = name
        self.process, self.conn = _spawn(_serve, name, cfg, tmp, n, threads)
        self.failed = ""
        try:
            self._reply()  # built, or the error that stopped it: raised at each call, so each cell reports it
        except RuntimeError as exc:
            self.failed = str(exc)

    def _reply(self) -> Any:
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.name}: its worker process ended (exit code {self.process.exitcode})") from None
        if status == "error":
            raise RuntimeError(value)
        return value

    def __call__(self, src: Any, beam: int) -> Any:
        if self.failed:
            raise RuntimeError(self.failed)
        self.conn.send((src, beam))
        return self._reply()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self.conn.close()


class _Floor:
    """What both floors share: fixed inputs per row count, and a decode's schedule of products (``__call__``)."""

    d_model: int
    n: int  # steps per decode
    _inputs: dict[int, Any]

    def _x(self, rows: int) -> Any:
        """Fixed float32 rows (rows, d_model), made once per row count (numpy)."""
        import numpy as np

        if rows not in self._inputs:
            self._inputs[rows] = np.random.default_rng(rows).standard_normal((rows, self.d_model)).astype(np.float32)
        return self._inputs[rows]

    def _encoder_products(self, x: Any) -> None:
        raise NotImplementedError

    def _step_products(self, x: Any) -> None:
        raise NotImplementedError

    def __call__(self, src: Any, beam: int) -> None:
        """The encoder's products over B * S rows, then ``n`` steps' (B rows, then B * K); None: no tokens."""
        B, S = src.shape
        self._encoder_products(self._x(B * S))
        for step in range(self.n):
            self._step_products(self._x(B if step == 0 else B * beam))
        return None


class ProductFloor(_Floor):
    """Only the matrix products by the weights of an exact float32 decode, in onnxruntime: a floor, not a decoder.

    Two graphs of MatMuls on the model's own weights, each product fed the previous one's output (a Slice where
    Q|K|V's output feeds W^O), rows symbolic: ``encoder`` (per encoder layer Q|K|V, W^O, W_1, W_2, then every
    decoder layer's cross-attention K|V from the result) and ``step`` (per decoder layer Q|K|V, W^O,
    cross-attention W^Q and W^O, W_1, W_2, then the vocabulary projection and an ArgMax, so that no logits are
    copied out). Attention, normalization, softmax, embedding, the search and every copy are left out: a
    decoder computes all of that on top. Called like a decoder, it runs ``encoder`` on B * S rows and ``step``
    ``new_tokens`` times (B rows at the first step, B * K after) and returns None (no tokens to compare).
    """

    def __init__(self, model: Any, folder: Path, new_tokens: int, threads: int):
        import numpy as np
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        from aiayn_conformance.export.common import session

        def t(*linears: Any) -> Any:  # the products' right operands [in, out], outputs side by side
            return np.ascontiguousarray(np.concatenate([x.weight.detach().numpy() for x in linears]).T)

        enc, cross, dec = [], [], []
        for layer in model.encoder:
            sa = layer.self_attn
            enc += [t(sa.q, sa.k, sa.v), t(sa.o), t(layer.ffn.w1), t(layer.ffn.w2)]
        for layer in model.decoder:
            sa, xa = layer.self_attn, layer.cross_attn
            cross.append(t(xa.k, xa.v))
            dec += [t(sa.q, sa.k, sa.v), t(sa.o), t(xa.q), t(xa.o), t(layer.ffn.w1), t(layer.ffn.w2)]
        dec.append(t(model.generator))
        self.d_model = d = model.config.d_model

        def graph(name: str, chain: list[Any], side: list[Any], path: Path) -> Path:
            nodes, inits, cur, width = [], [], "x", d
            for i, w in enumerate(chain):
                if w.shape[0] != width:  # Q|K|V's output: its first d_model columns feed the next product
                    nodes.append(helper.make_node("Slice", [cur, "zero", f"k{i}", "one"], [f"s{i}"]))
                    inits.append(numpy_helper.from_array(np.array([w.shape[0]], np.int64), f"k{i}"))
                    cur = f"s{i}"
                inits.append(numpy_helper.from_array(w, f"w{i}"))
                nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"y{i}"]))
                cur, width = f"y{i}", w.shape[1]
            outputs = []
            for j, w in enumerate(side):  # every product of ``side`` takes the chain's result
                inits.append(numpy_helper.from_array(w, f"c{j}"))
                nodes.append(helper.make_node("MatMul", [cur, f"c{j}"], [f"kv{j}"]))
                outputs.append(helper.make_tensor_value_info(f"kv{j}", TensorProto.FLOAT, None))
            if not side:
                nodes.append(helper.make_node("ArgMax", [cur], ["out"], axis=-1, keepdims=0))
                outputs.append(helper.make_tensor_value_info("out", TensorProto.INT64, None))
            inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                      numpy_helper.from_array(np.array([1], np.int64), "one")]
            x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", d])
            onnx.save(helper.make_model(helper.make_graph(nodes, name, [x], outputs, inits),
                                        opset_imports=[helper.make_opsetid("", 17)]), str(path))
            return path

        folder.mkdir(parents=True, exist_ok=True)
        self.encoder = session(graph("encoder_products", enc, cross, folder / "encoder_products.onnx"),
                               threads=threads)
        self.step = session(graph("step_products", dec, [], folder / "step_products.onnx"), threads=threads)
        self.n = new_tokens
        self._inputs = {}

    def _encoder_products(self, x: Any) -> None:
        self.encoder.run(None, {"x": x})

    def _step_products(self, x: Any) -> None:
        self.step.run(None, {"x": x})


class TorchProductFloor(_Floor):
    """``ProductFloor`` on the ``fused`` path's own PyTorch kernels: a floor for it, not a decoder.

    The encoder's products and the cross-attention K|V by ``F.linear`` on the fused model's weights (as its
    ``encode`` computes them), the step's by the very objects its cached step multiplies with (``_step_weights``:
    oneDNN-packed on a CPU in float32), in the same order and at the same rows as ``ProductFloor``; None returned.
    """

    def __init__(self, fused_model: Any, new_tokens: int):
        from aiayn_conformance.implementations.builtins import fused

        self.model, self.n, self.d_model = fused_model, new_tokens, fused_model.config.d_model
        self.fused = fused
        self._inputs = {}

    def _encoder_products(self, x: Any) -> None:
        import torch
        import torch.nn.functional as F

        d = self.d_model
        with torch.inference_mode():
            y = torch.from_numpy(x)
            for layer in self.model.encoder:
                y = F.linear(F.linear(y, layer.self_attn.qkv.weight)[:, :d], layer.self_attn.o.weight)
                ffn = layer.ffn
                y = F.linear(F.linear(y, ffn.w1.weight, ffn.w1.bias), ffn.w2.weight, ffn.w2.bias)
            for layer in self.model.decoder:
                F.linear(y, layer.cross_attn.kv.weight)

    def _step_products(self, x: Any) -> None:
        import torch

        self.step(torch.from_numpy(x))

    def step(self, y: Any) -> Any:
        """One step's products on rows y (N, d_model), each fed the previous one's output: the argmax (N,)."""
        import torch

        d = self.d_model
        with torch.inference_mode():
            weights = self.fused._step_weights(self.model, y)  # what the fused step multiplies with
            for qkv, o, cross_q, cross_o, w1, w2 in weights.layers:
                y = w2(w1(cross_o(cross_q(o(qkv(y)[:, :d])))))
            return weights.generator(y).argmax(-1)


def profile(cfg: Any, cell: Cell, new_tokens: int, rows: int = 14) -> list[str]:
    """Operator tables of one decode per decoder: torch.profiler for eager and fused, cProfile for onnxruntime."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(cell.threads)
    out = [f"One decode each: {cell}, {new_tokens} new tokens", ""]
    with tempfile.TemporaryDirectory() as tmp:
        decoders = Models(cfg, Path(tmp), [BASELINE, *DECODERS], new_tokens).local(cell.threads)
        src = torch.randint(3, cfg.src_vocab, (cell.batch, SRC_LEN), generator=torch.Generator().manual_seed(1))
        for name, decode in decoders.items():
            decode(src, cell.beam)  # warm-up
            t0 = time.perf_counter()
            if name in PYTORCH:
                with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                    decode(src, cell.beam)
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
            elif name == BASELINE:
                decode(src, cell.beam)
                table = "(CTranslate2: timed only)"
            else:
                pr = cProfile.Profile()
                pr.runcall(decode, src, cell.beam)
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(rows)
                table = buf.getvalue()
            out += [f"== {name}: {time.perf_counter() - t0:.3f} s (with the profiler's overhead)", table]
    return out


def machine() -> str:
    cpu = cpu_name()
    import os

    import torch

    versions = [f"torch {torch.__version__}"]
    for module in ("onnxruntime", "ctranslate2"):
        try:
            versions.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            pass
    return f"{cpu}, {os.cpu_count()} logical cores; Python {platform.python_version()}, {', '.join(versions)}"


def bench(cfg_for_vocab: Callable[[int], Any], vocabs: Sequence[int], threads: Sequence[int], batches: Sequence[int],
          beams: Sequence[int], rounds: int, new_tokens: int, names: Sequence[str],
          measure: Callable[[int], MachineRates] = measure_rates) -> tuple[list[Result], list[str]]:
    """Every cell of every vocabulary; ``measure`` gives the machine's rates at a thread count."""
    results, notes = [], []
    for vocab in vocabs:
        cfg = cfg_for_vocab(vocab)
        with tempfile.TemporaryDirectory() as tmp:
            models = Models(cfg, Path(tmp), names, new_tokens)
            try:
                results += _grid(models, cfg, threads, batches, beams, rounds, measure)
            finally:
                models.close()
                notes += models.notes
    return results, notes


def _grid(models: Models, cfg: Any, threads: Sequence[int], batches: Sequence[int], beams: Sequence[int],
          rounds: int, measure: Callable[[int], MachineRates] = measure_rates) -> list[Result]:
    """One vocabulary's cells, a thread count at a time (its workers made once for its cells)."""
    import torch

    g = torch.Generator().manual_seed(1)
    sources = {b: torch.randint(3, cfg.src_vocab, (b, SRC_LEN), generator=g) for b in batches}
    results = []
    for n_threads in threads:
        rates = None
        try:  # before this thread count's workers start: nothing else runs meanwhile
            rates = measure(n_threads)
        except RuntimeError as exc:
            models.notes.append(f"vocab {cfg.tgt_vocab}, {n_threads} thread(s): no {ESTIMATE} ({exc})")
        decoders = models.decoders(n_threads)
        for batch in batches:
            for beam in beams:
                cell = Cell(cfg.tgt_vocab, n_threads, batch, beam)
                t0 = time.perf_counter()
                result = run_cell(cell, decoders, sources[batch], rounds)
                if rates is not None:
                    result.rates = rates
                    result.estimate = products_estimate(cfg, cell, rates, models.n)
                results.append(result)
                _say(f"vocab {cell.vocab}, {n_threads} thread(s), batch {batch}, {cell.search}: "
                     f"{time.perf_counter() - t0:.0f} s")
    return results


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"error: {what} must be comma-separated positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.decode_interleaved", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: tiny preset, 8 new tokens, 2 rounds, 1 thread")
    p.add_argument("--preset", default=None, help="base (default), small, tiny or big")
    p.add_argument("--vocabs", default=None, help="comma-separated vocabulary sizes (default 8000,37000)")
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2)")
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--searches", default="greedy,beam", help="greedy, beam or both (default greedy,beam)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per cell (default 5)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per source (default 50)")
    p.add_argument("--profile", action="store_true",
                   help="print where one decode's time goes for each decoder instead of the grid")
    p.add_argument("--decoders", default=",".join(DEFAULT_DECODERS),
                   help=f"comma-separated, from {', '.join(DECODERS)} (default {','.join(DEFAULT_DECODERS)}; "
                        "CTranslate2 always runs when installed)")
    args = p.parse_args(argv)
    names = [BASELINE, *(n.strip() for n in args.decoders.split(",") if n.strip())]
    unknown = [n for n in names[1:] if n not in DECODERS]
    if unknown:
        p.error(f"unknown decoder {unknown[0]!r}; accepted: {', '.join(DECODERS)}")
    searches = [s.strip() for s in args.searches.split(",") if s.strip()]
    if not searches or any(s not in ("greedy", "beam") for s in searches):
        p.error(f"--searches takes greedy, beam or both, got {args.searches!r}")
    beams = [1 if s == "greedy" else BEAM for s in searches]
    preset = args.preset or ("tiny" if args.quick else "base")
    vocabs = _ints(args.vocabs or ("40,64" if args.quick else "8000,37000"), "--vocabs")
    threads = _ints(args.threads or ("1" if args.quick else "1,2"), "--threads")
    batches = _ints(args.batches, "--batches")
    rounds = args.rounds or (2 if args.quick else 5)
    new_tokens = args.new_tokens or (8 if args.quick else NEW_TOKENS)

    from benchmarks.perf import config_for

    base = config_for(preset, SRC_LEN)
    # positions for the source and the limit: the exports' tables cover max_len + 50
    def cfg_for_vocab(v: int) -> Any:
        return base.replace(src_vocab=v, tgt_vocab=v)

    if args.profile:
        for line in profile(cfg_for_vocab(vocabs[0]), Cell(vocabs[0], threads[0], batches[0], beams[0]), new_tokens):
            print(line, flush=True)
        return 0
    t0 = time.perf_counter()
    def measure(threads: int) -> MachineRates:
        if args.quick:  # a smoke run: the rates' code runs, on small arrays
            return measure_rates(threads, nbytes=16 << 20, repeats=2, gemm_n=256)
        return measure_rates(threads)

    results, notes = bench(cfg_for_vocab, vocabs, threads, batches, beams, rounds, new_tokens, names, measure)
    header = (f"{preset} preset, source length {SRC_LEN}, {machine()}; {datetime.date.today().isoformat()}; "
              f"whole grid {time.perf_counter() - t0:.0f} s")
    for line in report(results, names, header=header, new_tokens=new_tokens, rounds=rounds):
        print(line, flush=True)
    for note in notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

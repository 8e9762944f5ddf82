"""The interleaved decode benchmark (benchmarks.decode_interleaved): the rotation, the within-cell ratios and
verdicts from synthetic timings, and its --quick smoke run end to end (tiny models, no figures judged)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.decode_interleaved import (
    BASELINE,
    ESTIMATE,
    Cell,
    MachineRates,
    Result,
    measure_rates,
    product_shapes,
    products_estimate,
    report,
    rotation,
    run_cell,
)

ROOT = Path(__file__).resolve().parents[1]


def test_rotation_moves_each_decoder_to_every_place():
    names = ["a", "b", "c"]
    orders = [rotation(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted({o[i] for o in orders}) == names for i in range(3))


def test_run_cell_interleaves_the_rounds_and_compares_tokens_with_the_baseline():
    calls: list[str] = []
    now = [0.0]
    cost = {BASELINE: 1.0, "fast": 0.5, "wrong": 0.2}

    def decoder(name, tokens):
        def decode(src, beam):
            calls.append(name)
            now[0] += cost[name]
            return tokens

        return decode

    same, other = torch.tensor([[3, 4]]), torch.tensor([[3, 5]])
    decoders = {BASELINE: decoder(BASELINE, same), "fast": decoder("fast", same), "wrong": decoder("wrong", other)}
    res = run_cell(Cell(8000, 1, 1, 1), decoders, torch.zeros(1, 2), rounds=3, clock=lambda: now[0])
    warmup, timed = calls[:3], calls[3:]
    assert warmup == [BASELINE, "fast", "wrong"]
    assert timed == [BASELINE, "fast", "wrong", "fast", "wrong", BASELINE, "wrong", BASELINE, "fast"]
    assert res.same == {"fast": True, "wrong": False}
    assert res.ratio("fast") == pytest.approx(0.5) and res.ratio("wrong") == pytest.approx(0.2)


def result(cell: Cell, seconds: dict[str, float], same: dict[str, bool] | None = None) -> Result:
    return Result(cell, {n: [s * 0.9, s, s * 1.2] for n, s in seconds.items()}, same or {})


def test_report_judges_each_cell_by_its_own_baseline():
    names = [BASELINE, "eager cached", "fused cached", "onnxruntime cached"]
    met = result(Cell(8000, 1, 1, 1), {BASELINE: 1.0, "eager cached": 1.5, "fused cached": 0.6,
                                       "onnxruntime cached": 0.7}, {"eager cached": True, "fused cached": True,
                                                                   "onnxruntime cached": True})
    missed = result(Cell(37000, 2, 8, 4), {BASELINE: 4.0, "eager cached": 4.0, "fused cached": 3.0,
                                           "onnxruntime cached": 2.8},
                    {"eager cached": True, "fused cached": False, "onnxruntime cached": True})
    missed.errors["eager cached"] = "RuntimeError: out of memory"
    del missed.times["eager cached"]
    out = "\n".join(report([met, missed], names, header="H", new_tokens=50, rounds=3))
    assert "| 8000 | 1 | 1 | greedy | 1.000 | 1.50 | 0.60 | 0.70 | 0.60 (fused cached) | 0.60 (fused cached) | met |" \
        in out
    assert ("| 37000 | 2 | 8 | beam 4 | 4.000 | failed: RuntimeError: out of memory | 0.75 ≠ | 0.70 | "
            "- | 0.70 (onnxruntime cached) | MISSED |") in out  # a decoder with other tokens is never the best
    assert "Cells meeting the target: 1 of 2; missed: vocab 37000, 2 thread(s), batch 8, beam 4: best 0.70" in out
    assert "Tokens DIFFER from CTranslate2's: fused cached at vocab 37000, 2 thread(s), batch 8, beam 4" in out


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "onnxscript",
                                                                        "ctranslate2")),
                    reason="the onnx and ctranslate2 extras are needed for the smoke run")
@pytest.mark.slow
def test_quick_run_prints_a_full_table_with_equal_tokens():
    res = subprocess.run([sys.executable, "-m", "benchmarks.decode_interleaved", "--quick", "--vocabs", "40"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| 40 |")]
    assert len(rows) == 4, res.stdout  # batch 1 and 8, greedy and beam 4
    assert all("failed" not in ln and "≠" not in ln for ln in rows), res.stdout
    assert "Tokens equal to CTranslate2's in every cell and decoder" in res.stdout
    assert "Cells meeting the target:" in res.stdout and "tiny preset" in res.stdout
    table = [ln for ln in res.stdout.splitlines() if ln.startswith("|")]
    assert len({ln.count("|") for ln in table}) == 1, table[:3]  # header, separator and rows: one column count


def test_bad_arguments_are_refused_with_what_is_accepted():
    from benchmarks.decode_interleaved import main

    with pytest.raises(SystemExit, match="--vocabs must be comma-separated positive integers"):
        main(["--vocabs", "x"])
    with pytest.raises(SystemExit):
        main(["--decoders", "nope"])


def test_report_names_the_cells_whose_product_floor_is_above_the_target():
    from benchmarks.decode_interleaved import FLOOR

    names = [BASELINE, "onnxruntime cached", FLOOR]
    low = result(Cell(8000, 2, 1, 1), {BASELINE: 1.0, "onnxruntime cached": 0.6, FLOOR: 0.4},
                 {"onnxruntime cached": True})
    high = result(Cell(8000, 1, 8, 4), {BASELINE: 1.0, "onnxruntime cached": 0.9, FLOOR: 0.75},
                  {"onnxruntime cached": True})
    out = "\n".join(report([low, high], names, header="H", new_tokens=50, rounds=3))
    assert "| 8000 | 2 | 1 | greedy | 1.000 | 0.60 | 0.40 | - | 0.60 (onnxruntime cached) | met |" in out
    # the floor is timed, never a decoder: never the best, never compared for tokens
    assert ("| 8000 | 1 | 8 | beam 4 | 1.000 | 0.90 | 0.75 | - | 0.90 (onnxruntime cached) | "
            "MISSED (floor above the target) |") in out
    assert ("take more than 0.67 of CTranslate2's time: 1: vocab 8000, 1 thread(s), batch 8, beam 4: 0.75" in out)
    assert "Tokens equal to CTranslate2's in every cell and decoder" in out


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")),
                    reason="the onnx extra is needed for the product floor")
def test_product_floor_runs_exactly_the_decodes_products(tmp_path):
    import numpy as np
    import onnx

    from aiayn_conformance.implementations import get_registry
    from aiayn_conformance.spec import TINY
    from benchmarks.decode_interleaved import ProductFloor

    torch.manual_seed(0)
    model = get_registry().get("reference").build(TINY).eval()
    floor = ProductFloor(model, tmp_path, new_tokens=3, threads=1)
    L = TINY.n_layers
    for name, products in (("encoder_products.onnx", 4 * L + L), ("step_products.onnx", 6 * L + 1)):
        ops = [n.op_type for n in onnx.load(str(tmp_path / name)).graph.node]
        assert ops.count("MatMul") == products, (name, ops)
    # The step's chain is the decoder's products in order, on the model's own weights (W^T: x @ W^T = linear(x)).
    x = np.random.default_rng(0).standard_normal((5, TINY.d_model)).astype(np.float32)
    y = torch.from_numpy(x)
    with torch.no_grad():
        for layer in model.decoder:
            sa, xa = layer.self_attn, layer.cross_attn
            for lin in (sa.q, sa.o, xa.q, xa.o, layer.ffn.w1, layer.ffn.w2):  # Q of Q|K|V feeds W^O
                y = y @ lin.weight.T
        expected = (y @ model.generator.weight.T).argmax(-1)
    assert floor.step.run(None, {"x": x})[0].tolist() == expected.tolist()
    rows = []
    for graph in (floor.encoder, floor.step):
        run = graph.run
        graph.run = lambda out, feed, run=run: rows.append(feed["x"].shape[0]) or run(out, feed)  # type: ignore
    assert floor(torch.zeros(2, 7, dtype=torch.long), 4) is None  # not a decoder: no tokens
    assert rows == [2 * 7, 2, 8, 8]  # the encoder over every source token, then B rows, then B x K
    # the machine-rate estimate counts exactly these products: the graphs' weights [in, out], in order
    encoder, step = product_shapes(TINY)
    for name, shapes in (("encoder_products.onnx", encoder), ("step_products.onnx", step)):
        graph = onnx.load(str(tmp_path / name)).graph
        weights = {w.name: tuple(w.dims) for w in graph.initializer}
        assert [weights[n.input[1]] for n in graph.node if n.op_type == "MatMul"] == shapes, name


def test_torch_product_floor_multiplies_with_the_fused_steps_own_weights(monkeypatch):
    from aiayn_conformance.implementations import get_registry
    from aiayn_conformance.implementations.builtins import fused
    from aiayn_conformance.spec import TINY
    from benchmarks.decode_interleaved import TorchProductFloor

    torch.manual_seed(0)
    model = get_registry().get("fused").build(TINY).eval()
    floor = TorchProductFloor(model, new_tokens=3)
    x = torch.randn(5, TINY.d_model, generator=torch.Generator().manual_seed(0))
    y, d = x, TINY.d_model
    with torch.no_grad():
        for layer in model.decoder:  # F.linear on the model's parameters: the products the step's objects compute
            y = y @ layer.self_attn.qkv.weight[:d].T @ layer.self_attn.o.weight.T @ layer.cross_attn.q.weight.T
            y = y @ layer.cross_attn.o.weight.T
            y = torch.relu(y @ layer.ffn.w1.weight.T + layer.ffn.w1.bias) @ layer.ffn.w2.weight.T + layer.ffn.w2.bias
        expected = (y @ model.generator.weight.T).argmax(-1)
    assert floor.step(x).tolist() == expected.tolist()
    rows, real = [], fused._step_weights
    monkeypatch.setattr(fused, "_step_weights", lambda m, x: rows.append(x.shape[0]) or real(m, x))
    assert floor(torch.zeros(2, 7, dtype=torch.long), 4) is None  # not a decoder: no tokens
    assert rows == [2, 8, 8]  # B rows at the first step, B x K after, on the fused step's own weight objects


def test_a_decoder_whose_worker_cannot_build_it_fails_its_cells_with_the_reason(tmp_path):
    """Each decoder runs in a worker process of its own (Isolated); one that cannot be built is reported in every cell
    by run_cell, with the worker's one-line reason, and the other decoders' figures are kept."""
    from aiayn_conformance.spec import TINY
    from benchmarks.decode_interleaved import Cell, Isolated, run_cell

    broken = Isolated("nope", TINY, tmp_path, 3, 1)
    try:
        assert broken.failed == ("ValueError: unknown decoder 'nope'; accepted: ctranslate2, eager cached, "
                                 "fused cached, onnxruntime cached, products only (onnxruntime), "
                                 "products only (PyTorch)")
        result = run_cell(Cell(40, 1, 1, 1), {"nope": broken, "fine": lambda src, beam: None}, src=None, rounds=1)
        assert result.errors == {"nope": f"RuntimeError: {broken.failed}"} and list(result.times) == ["fine"]
    finally:
        broken.close()
    assert not broken.process.is_alive()


def test_products_estimate_takes_each_product_at_the_slower_of_the_machines_two_rates():
    from aiayn_conformance.spec import TINY

    encoder, step = product_shapes(TINY)
    d, f, L, V = TINY.d_model, TINY.d_ff, TINY.n_layers, TINY.tgt_vocab
    assert sum(i * o for i, o in step) == L * (3 * d * d + 3 * d * d + 2 * d * f) + d * V
    assert sum(i * o for i, o in encoder) == L * (3 * d * d + d * d + 2 * d * f) + L * 2 * d * d
    memory_bound = MachineRates(1, stream=4.0, gemm=1e30)  # 1 weight per second, FLOPs free
    compute_bound = MachineRates(1, stream=1e30, gemm=2.0)  # weights free, 1 multiply-add per second
    cell = Cell(V, 1, 2, 3)  # batch 2, beam 3
    weights = sum(i * o for i, o in encoder) + 5 * sum(i * o for i, o in step)  # the encoder's, then 5 steps'
    assert products_estimate(TINY, cell, memory_bound, 5, src_len=7) == pytest.approx(weights)
    macs = 2 * 7 * sum(i * o for i, o in encoder) + (2 + 4 * 6) * sum(i * o for i, o in step)
    assert products_estimate(TINY, cell, compute_bound, 5, src_len=7) == pytest.approx(macs)


def test_report_adds_the_machine_rate_estimate_and_names_the_cells_it_puts_above_the_target():
    names = [BASELINE, "onnxruntime cached"]
    rates = MachineRates(1, stream=30e9, gemm=90e9)
    low = result(Cell(8000, 1, 1, 1), {BASELINE: 1.0, "onnxruntime cached": 0.6}, {"onnxruntime cached": True})
    high = result(Cell(8000, 1, 8, 4), {BASELINE: 1.0, "onnxruntime cached": 0.9}, {"onnxruntime cached": True})
    low.estimate, low.rates, high.estimate, high.rates = 0.3, rates, 0.7, rates
    out = "\n".join(report([low, high], names, header="H", new_tokens=50, rounds=3))
    assert f"| ctranslate2 s | onnxruntime cached | {ESTIMATE} | best PyTorch |" in out
    assert "| 8000 | 1 | 1 | greedy | 1.000 | 0.60 | 0.30 | - | 0.60 (onnxruntime cached) | met |" in out
    assert "| 8000 | 1 | 8 | beam 4 | 1.000 | 0.90 | 0.70 | - | 0.90 (onnxruntime cached) | MISSED |" in out
    assert (f"Cells where the products at the machine's rates ({ESTIMATE}) would take more than 0.67 of "
            "CTranslate2's time: 1: vocab 8000, 1 thread(s), batch 8, beam 4: 0.70") in out
    assert "vocab 8000, 1 thread(s): memory streaming 30.0 GB/s, float32 GEMM 90 GFLOP/s" in out
    assert ESTIMATE not in "\n".join(report([result(Cell(8000, 1, 1, 1), {BASELINE: 1.0})], names, header="H",
                                            new_tokens=50, rounds=3))  # no estimate: no column


def test_machine_rates_are_measured_in_a_worker_and_a_failure_says_why():
    rates = measure_rates(1, nbytes=4 << 20, repeats=2, gemm_n=128)
    assert rates.threads == 1 and rates.stream > 0 and rates.gemm > 0
    with pytest.raises(RuntimeError, match="measuring the machine's rates failed: ValueError: negative dimensions"):
        measure_rates(1, nbytes=-4, repeats=1, gemm_n=64)  # the worker's own error, sent back in one line
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        measure_rates(0)

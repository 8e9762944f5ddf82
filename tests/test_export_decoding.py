"""Cached decoding exported to ONNX: the CLI's acceptance command, the graphs' dynamic axes, whole greedy and
beam searches in onnxruntime against PyTorch, and a broken cache (positions restarted at 0) caught by verify."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "onnxscript")),
    reason="the onnx extra is not installed")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The README's command, run once: its output folder, stdout and the model it exported (rebuilt)."""
    from aiayn_conformance.export import resolve_model
    from aiayn_conformance.spec import TINY

    out = tmp_path_factory.mktemp("generation")
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "export", "--impl", "reference", "--preset", "tiny",
                          "--generation", "--out-dir", str(out), "--verify"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    model, _ = resolve_model("reference", TINY)  # the CLI's weights: the same seed
    return out, res.stdout, model


@pytest.mark.slow
def test_cli_writes_cached_graphs_and_verifies_greedy_and_beam(exported):
    out, stdout, _ = exported
    assert {p.name for p in out.iterdir()} == {"encoder_kv.onnx", "decoder_step.onnx", "generation.json"}
    lines = [ln for ln in stdout.splitlines() if ln.startswith(("verified:", "MISMATCH:"))]
    assert len(lines) == 3 and all(ln.startswith("verified:") for ln in lines), stdout
    assert "greedy search in onnxruntime equals PyTorch" in lines[0] and "no EOS" in lines[0]
    assert "past lengths 0..57" in lines[0]  # 8 source tokens + 50 (§6.1), beyond TINY.max_len = 24
    assert "beam search (K = 4, α = 0.6) in onnxruntime equals PyTorch" in lines[2] and "12 rows" in lines[2]
    assert all("worst per-step |Δ log p| = " in ln for ln in lines)


@pytest.mark.slow
def test_graph_axes_stay_symbolic_and_the_manifest_describes_them(exported):
    import onnx

    from aiayn_conformance.spec import TINY

    out, _, _ = exported
    manifest = json.loads((out / "generation.json").read_text())
    assert manifest["n_layers"] == TINY.n_layers and manifest["max_positions"] == TINY.max_len + 50
    assert (manifest["pad_id"], manifest["bos_id"], manifest["eos_id"]) == (0, 1, 2)
    step = onnx.load(str(out / "decoder_step.onnx")).graph

    def dims(values):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    inputs, outputs = dims(step.input), dims(step.output)
    assert list(inputs) == manifest["step"]["inputs"] and list(outputs) == manifest["step"]["outputs"]
    h, d_k = TINY.n_heads, TINY.d_model // TINY.n_heads
    assert inputs["tokens"] == ["rows"] and inputs["src"] == ["rows", "src_len"]
    assert inputs["past_key.1"] == ["past_len", "rows", h, d_k]  # time-major: the filled prefix of a buffer
    assert inputs["cross_value.0"] == ["rows", h, "src_len", d_k]
    assert outputs["logits"] == ["rows", TINY.tgt_vocab] and outputs["new_value.1"] == ["rows", h, d_k]
    encoder = dims(onnx.load(str(out / "encoder_kv.onnx")).graph.output)
    assert encoder["cross_key.1"] == ["rows", h, "src_len", d_k]


@pytest.mark.slow
def test_sessions_do_not_spin_between_runs(exported):
    """A step decoder's sessions leave the cores to the search between steps: onnxruntime's intra-op threads spin
    after each run unless told not to (BENCHMARKS.md: 0.95 against 0.56 of CTranslate2's time, 2 threads)."""
    from aiayn_conformance.export import OrtCachedDecoder

    out, _, _ = exported
    ort = OrtCachedDecoder.load(out, threads=2)
    for sess in (ort.encoder, ort.step):
        options = sess.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert options.intra_op_num_threads == 2


@pytest.mark.slow
def test_onnxruntime_decodes_other_shapes_and_refuses_positions_beyond_the_table(exported):
    from aiayn_conformance.export import ExportError, OrtCachedDecoder
    from aiayn_conformance.reference.decoding import beam_search, greedy_search

    out, _, model = exported
    ort = OrtCachedDecoder.load(out)
    src = torch.randint(1, 37, (5, 3), generator=torch.Generator().manual_seed(7))  # 5 rows, S = 3
    src[2, 1:] = 0
    src[4, :] = 0  # a source of padding only: a fully masked cross-attention row must not give NaN
    for search, kw in ((greedy_search, {}), (beam_search, {"beam_size": 3})):
        got = search(ort, src, bos_id=1, eos_id=5, pad_id=0, max_len=6, **kw)
        expected = search(model, src, bos_id=1, eos_id=5, pad_id=0, max_len=6, **kw)
        assert torch.equal(got.tokens, expected.tokens)
        assert torch.isfinite(got.scores).all() and torch.allclose(got.scores, expected.scores, atol=1e-4)
    # Past the preallocated capacity (S + 51 = 54 positions) the buffers grow, up to the table's 74 positions.
    got = greedy_search(ort, src, bos_id=1, eos_id=-1, pad_id=0, max_len=ort.max_positions)
    expected = greedy_search(model, src, bos_id=1, eos_id=-1, pad_id=0, max_len=ort.max_positions)
    assert got.tokens.shape[1] == ort.max_positions > src.shape[1] + 51
    assert torch.equal(got.tokens, expected.tokens) and torch.allclose(got.scores, expected.scores, atol=1e-3)
    with pytest.raises(ExportError, match="beyond the exported position table"):
        greedy_search(ort, src, bos_id=1, eos_id=-1, pad_id=0, max_len=ort.max_positions + 1)


@pytest.mark.slow
def test_verify_catches_a_step_whose_positions_restart_at_zero(exported, tmp_path, monkeypatch):
    from aiayn_conformance.export import verify_cached_generation
    from aiayn_conformance.export.kv_cache import export_cached_step
    from aiayn_conformance.reference.model import Transformer
    from aiayn_conformance.spec import TINY
    from aiayn_conformance.spec.decoding import TRANSLATION

    out, _, model = exported
    for name in ("encoder_kv.onnx", "generation.json"):
        shutil.copy(out / name, tmp_path / name)
    # The bug: every new token is embedded at position 0 instead of the prefix length t.
    monkeypatch.setattr(model, "embed", lambda tokens, embedding, start=0: Transformer.embed(model, tokens, embedding))
    export_cached_step(model, tmp_path / "decoder_step.onnx", TINY)
    monkeypatch.undo()
    checks = verify_cached_generation(tmp_path, model, TINY, decode=TRANSLATION.replace(extra_length=6))
    # A run that stops after its first step feeds position 0 alone, where the bug changes nothing: every run past
    # it must differ (with no end symbol every source runs to its limit, so there is always one).
    ran_on = [c for c in checks if c.steps > 1]
    assert ran_on and not any(c.ok for c in ran_on), [c.describe() for c in checks]
    worst = checks[0]
    assert worst.worst_log_prob > 1e-2 and worst.worst_at[1] >= 1  # step 0 (position 0) is right, later ones not
    assert "DIFFERS FROM PyTorch" in worst.describe()


def test_no_cache_keeps_the_full_prefix_export(monkeypatch, tmp_path, capsys):
    from aiayn_conformance import export
    from aiayn_conformance.cli import main

    calls = []

    class Check:
        ok = True

        def describe(self):
            return "full-prefix check"

    monkeypatch.setattr(export.onnx, "export_generation", lambda model, out, config, progress: calls.append("prefix")
                        or (Path(out) / "encoder.onnx", Path(out) / "decoder.onnx"))
    monkeypatch.setattr(export.onnx, "verify_generation", lambda *a, **k: Check())
    monkeypatch.setattr(export.kv_cache, "export_cached_generation", lambda *a, **k: calls.append("cached"))
    assert main(["export", "--preset", "tiny", "--generation", "--no-cache", "--out-dir", str(tmp_path),
                 "--verify"]) == 0
    assert calls == ["prefix"] and "verified: full-prefix check" in capsys.readouterr().out


def test_reference_for_gives_a_conforming_implementation_the_same_weights():
    from aiayn_conformance.export import ExportError, reference_for
    from aiayn_conformance.implementations import get_registry
    from aiayn_conformance.reference.model import Transformer
    from aiayn_conformance.spec import TINY

    fused = get_registry().get("fused").build(TINY).eval()
    twin = reference_for(fused, TINY)
    assert isinstance(twin, Transformer) and twin is not fused
    src, tgt = torch.randint(1, 37, (2, 6)), torch.randint(1, 37, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(fused(src, tgt), twin(src, tgt), atol=1e-5, rtol=1e-5)
    assert reference_for(twin, TINY) is twin
    with pytest.raises(ExportError, match="has no load_reference_state"):
        reference_for(torch.nn.Linear(2, 2), TINY)


def test_a_cached_pair_of_another_layout_is_refused_with_what_to_do(tmp_path):
    """A folder exported before the time-major layout (outputs present_key.{i}) names the fix: export again."""
    import onnx
    from onnx import TensorProto, helper

    from aiayn_conformance.export import ExportError, OrtCachedDecoder

    def graph(path, inputs, outputs):
        nodes = [helper.make_node("Identity", [inputs[0]], [name]) for name in outputs]
        value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in inputs]
        out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in outputs]
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", value, out),
                                    opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    encoder = graph(tmp_path / "encoder_kv.onnx", ["src"], ["cross_key.0", "cross_value.0"])
    old_step = graph(tmp_path / "decoder_step.onnx", ["past_key.0", "past_value.0"],
                     ["logits", "present_key.0", "present_value.0"])
    with pytest.raises(ExportError, match=r"not a cached-decoding pair of this version .*present_key\.0.*"
                                          r"export them again with aiayn export --generation"):
        OrtCachedDecoder(encoder, old_step, pad_id=0)

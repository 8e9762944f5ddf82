"""ONNX export: equivalence, greedy decoding in onnxruntime, and the CLI's errors."""

import importlib.util
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
def tiny():
    from aiayn_conformance.spec import TINY

    return TINY


@pytest.mark.slow
def test_onnxruntime_greedy_decoding_equals_pytorch(tmp_path, tiny):
    from aiayn_conformance.export import export_generation, ort_greedy_decode, torch_greedy_decode, verify_generation
    from aiayn_conformance.reference.model import Transformer

    torch.manual_seed(0)  # its sources decode differently (first tokens 6, 31, 31), so one can finish early; at
    model = Transformer(tiny).eval()  # seed 3 every source repeats one token and all end together
    enc, dec = export_generation(model, tmp_path, tiny)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        src = torch.randint(1, tiny.src_vocab, (3, 8), generator=g)
        src[1, 5:] = tiny.pad_id
        ort_tokens = ort_greedy_decode(enc, dec, src, bos_id=1, eos_id=2, pad_id=tiny.pad_id, max_new_tokens=12)
        pt_tokens = torch_greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=12)
        assert ort_tokens.tolist() == pt_tokens.tolist()
    check = verify_generation(enc, dec, model, tiny, max_new_tokens=12)
    assert check.ok and check.tokens_equal and check.eos_tokens_equal, check.describe()
    assert check.steps == 12 and check.eos_finished_early and check.max_logit_diff < 1e-4, check.describe()
    # The same graphs against other weights: the per-step logits expose it even where argmax might not.
    other = verify_generation(enc, dec, Transformer(tiny).eval(), tiny, max_new_tokens=12)
    assert not other.ok and other.max_logit_diff > 1e-2 and "DIFFERS FROM" in other.describe()


@pytest.mark.slow
def test_verify_reports_the_worst_error_and_catches_a_mismatch(tmp_path, tiny):
    from aiayn_conformance.export import export_onnx, verify
    from aiayn_conformance.reference.model import Transformer

    torch.manual_seed(4)
    model = Transformer(tiny).eval()
    path = export_onnx(model, tmp_path / "m.onnx", tiny)
    good = verify(path, model, tiny)
    assert good.ok and good.max_abs < 1e-4 and good.shapes_checked == 4
    other = Transformer(tiny).eval()  # different weights: onnxruntime no longer matches it
    bad = verify(path, other, tiny)
    assert not bad.ok and bad.max_abs > 1e-2 and "worst |onnxruntime - torch|" in bad.describe()


def cli(*args):
    return subprocess.run([sys.executable, "-m", "aiayn_conformance", "export", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_cli_export_and_verify(tmp_path):
    res = cli("--impl", "reference", "--preset", "tiny", "--out", str(tmp_path / "m.onnx"), "--verify")
    assert res.returncode == 0, res.stderr
    assert "verified:" in res.stdout and (tmp_path / "m.onnx").exists()
    assert "exporting" in res.stderr  # progress


@pytest.mark.parametrize("args, message, code", [
    (["--impl", "nope", "--preset", "tiny", "--out", "x.onnx"], "unknown implementation 'nope'; known:", 2),
    (["--preset", "huge", "--out", "x.onnx"], "unknown preset 'huge'; accepted: base, big, tiny", 2),
    (["--preset", "tiny", "--out", "/proc/forbidden/x.onnx"], "cannot write /proc/forbidden/x.onnx", 1),
    (["--preset", "tiny", "--generation"], "--generation needs --out-dir", 2),
    (["--preset", "tiny", "--format", "ctranslate2"], "--format ctranslate2 needs --out-dir", 2),
])
def test_cli_errors_are_one_line(args, message, code):
    res = cli(*args)
    assert res.returncode == code, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("preset", ["base", "big"])
def test_above_the_threshold_the_export_check_runs_on_a_small_twin_of_the_structure(preset):
    """export.onnx at the paper's sizes exports the audit's structure (heads, epsilon, tying, padding id) at a small
    width, vocabulary and depth, the first and last layer of each stack; TINY is exported as it is."""
    from aiayn_conformance.conformance.test_export import EXPORT_AT_FULL_SIZE, structural_twin
    from aiayn_conformance.spec.config import TINY
    from aiayn_conformance.spec.config import preset as named
    from aiayn_conformance.spec.schema import parameter_count

    config = named(preset)
    twin = structural_twin(config)
    assert parameter_count(config) > EXPORT_AT_FULL_SIZE >= parameter_count(twin)
    assert (twin.n_heads, twin.norm_eps, twin.share_embeddings, twin.pad_id, twin.max_len) == \
        (config.n_heads, config.norm_eps, config.share_embeddings, config.pad_id, config.max_len)
    assert (twin.d_model, twin.n_layers, twin.tgt_vocab) == (8 * config.n_heads, 2, 64)
    assert structural_twin(config.replace(n_layers=1)).n_layers == 1
    assert parameter_count(TINY) <= EXPORT_AT_FULL_SIZE


def test_the_end_symbol_of_the_eos_run_ends_the_sources_at_different_steps():
    """verify_generation's EOS run takes, of the first source's tokens, the first that ends the sources at different
    steps; where every source would end together, the first source's first token."""
    from aiayn_conformance.export.onnx import early_end_symbol

    assert early_end_symbol(torch.tensor([[5, 7, 5], [5, 9, 9], [5, 5, 7]])) == 7  # 5 ends all at step 0
    assert early_end_symbol(torch.tensor([[6, 6], [31, 6]])) == 6  # source 1 ends one step later
    assert early_end_symbol(torch.tensor([[10, 10], [10, 10]])) == 10  # none can: every source ends together

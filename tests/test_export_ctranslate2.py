"""CTranslate2 conversion: greedy decoding emits PyTorch's tokens, for the reference and for a conforming
implementation through its canonical state, and verify catches conversions that are not the paper's model."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                                reason="ctranslate2 is not installed (pip install 'aiayn-conformance[ctranslate2]')")

ROOT = Path(__file__).resolve().parents[1]


def test_cli_converts_and_verifies_greedy_decoding(tmp_path):
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "export", "--format", "ctranslate2", "--impl", "reference",
                          "--preset", "tiny", "--out-dir", str(tmp_path / "ct2"), "--verify"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("verified:", "MISMATCH:"))]
    assert len(lines) == 2 and all(ln.startswith("verified: greedy search in CTranslate2 equals PyTorch")
                                   for ln in lines), res.stdout
    assert {"model.bin", "config.json", "aiayn.json"} <= {p.name for p in (tmp_path / "ct2").iterdir()}


@pytest.mark.parametrize("name", ["reference", "fused"])
def test_greedy_tokens_and_per_step_log_probs_equal_pytorch(name, tmp_path):
    from aiayn_conformance.export import resolve_model
    from aiayn_conformance.export.ctranslate2 import export_ctranslate2, verify_ctranslate2
    from aiayn_conformance.spec import TINY

    model, output = resolve_model(name, TINY)
    export_ctranslate2(model, tmp_path, TINY)
    checks = verify_ctranslate2(tmp_path, model, TINY, output_kind=output)
    assert [c.ok for c in checks] == [True, True], [c.describe() for c in checks]
    assert checks[0].steps == 8 + 50 and checks[0].worst_log_prob < 1e-4
    assert "EOS = " in checks[1].setting


def _save(spec, out: Path) -> None:
    import json

    spec.validate()
    spec.optimize(quantization=None)
    out.mkdir()
    spec.save(str(out))
    (out / "aiayn.json").write_text(json.dumps({"pad_id": 0, "bos_id": 1, "eos_id": 2, "max_positions": 74,
                                                "src_vocab": 37, "tgt_vocab": 37}))


@pytest.mark.parametrize("bug", ["ctranslate2's own sinusoids (concatenated halves)", "unscaled embeddings"])
def test_verify_catches_a_conversion_that_is_not_the_papers_model(bug, tmp_path):
    from ctranslate2.specs import model_spec

    from aiayn_conformance.export.ctranslate2 import transformer_spec, verify_ctranslate2
    from aiayn_conformance.reference.model import Transformer
    from aiayn_conformance.spec import TINY

    torch.manual_seed(5)
    model = Transformer(TINY).eval()
    spec = transformer_spec(model.state_dict(), TINY)
    if bug.startswith("ctranslate2's own"):
        spec.encoder.position_encodings.encodings = model_spec.OPTIONAL
        spec.decoder.position_encodings.encodings = model_spec.OPTIONAL
    else:
        spec.encoder.scale_embeddings = False
        spec.decoder.scale_embeddings = False
    _save(spec, tmp_path / "ct2")
    checks = verify_ctranslate2(tmp_path / "ct2", model, TINY)
    assert not any(c.ok for c in checks)
    assert checks[0].worst_log_prob > 1e-2 and "DIFFERS FROM PyTorch" in checks[0].describe()


def test_decoder_maps_ids_and_applies_per_source_limits(tmp_path):
    from aiayn_conformance.export.ctranslate2 import CT2Decoder, export_ctranslate2
    from aiayn_conformance.reference.decoding import greedy_search
    from aiayn_conformance.reference.model import Transformer
    from aiayn_conformance.spec import TINY

    torch.manual_seed(6)
    model = Transformer(TINY).eval()
    export_ctranslate2(model, tmp_path, TINY)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    tokens, _ = CT2Decoder(tmp_path).search(src, eos_id=-1, extra_length=3)  # limits 7 and 5
    assert tokens.shape == (2, 7) and tokens[1, 5:].tolist() == [0, 0] and bool((tokens[0] != 0).all())
    expected = greedy_search(model, src, bos_id=1, eos_id=-1, pad_id=0, extra_length=3).tokens
    assert tokens.tolist() == expected.tolist()

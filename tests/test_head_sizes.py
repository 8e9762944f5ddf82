"""Head sizes other than d_model / h (Table 3, row B): the reference passes every clause there, the bugs that only
such sizes show are caught, and an implementation that cannot build them is refused in one line.

The models of ``tests/head_size_models.py`` compute the reference's function wherever d_k = d_v = d_model / h.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from reference_audit import reference_audit

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.implementations.declarations import validated
from aiayn_conformance.reference.decoding import decode_step, init_cache
from aiayn_conformance.reference.model import build
from aiayn_conformance.spec.config import TINY

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tests/head_size_models.py"
ROW_B = "d_k=4,d_v=12"  # over TINY (d_model 32, h 4): d_k = 8 there
ROW_B_CONFIG = TINY.replace(d_k=4, d_v=12)


def run_suite(tmp: Path, impls: str, *extra: str) -> dict[tuple[str, str], set[str]]:
    """(implementation, clause) -> the outcomes of its checks in one suite run."""
    out = tmp / "results.json"
    subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
                    "--hypothesis-profile=smoke", f"--plugin={PLUGIN}", f"--impl={impls}", f"--results-json={out}",
                    *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), f"the suite wrote no results for {impls} {extra}"
    outcomes: dict[tuple[str, str], set[str]] = defaultdict(set)
    for record in json.loads(out.read_text())["tests"]:
        outcomes[(record["subject"].removeprefix("impl:"), record["clause"])].add(record["outcome"])
    return outcomes


def test_the_registry_refuses_head_sizes_an_implementation_does_not_declare():
    plain = validated(Implementation(name="plain", build=build))
    with pytest.raises(ValueError, match=r"^plain cannot build d_k=4, d_v=12 with d_model=32, h=4: it builds "
                                         r"d_k = d_v = d_model / h only \(its registration does not set "
                                         r"free_head_dims\)$"):
        plain.build(ROW_B_CONFIG)
    assert plain.build(TINY.replace(d_k=8, d_v=8)).config == TINY  # given, but the paper's sizes: built
    free = validated(Implementation(name="free", build=build, free_head_dims=True))
    assert free.build(ROW_B_CONFIG).encoder[0].self_attn.v.weight.shape == (48, 32)
    with pytest.raises(ValueError, match="free_head_dims must be a bool"):
        validated(Implementation(name="odd", build=build, free_head_dims="yes"))  # type: ignore[arg-type]


def test_the_reference_decodes_with_its_cache_at_row_b_sizes():
    """The key/value cache holds d_k-wide keys and d_v-wide values; stepping equals the full forward."""
    torch.manual_seed(0)
    model = build(ROW_B_CONFIG.replace(dropout=0.0)).eval()
    src, tgt = torch.randint(1, 37, (2, 6)), torch.randint(1, 37, (2, 5))
    cache = init_cache(model, src)
    assert (cache.layers[0].cross_k.size(-1), cache.layers[0].cross_v.size(-1)) == (4, 12)
    steps = []
    with torch.no_grad():
        for t in range(tgt.size(1)):
            logits, cache = decode_step(model, cache, tgt[:, t])
            steps.append(logits)
        torch.testing.assert_close(torch.stack(steps, 1), model(src, tgt), rtol=1e-5, atol=1e-5)


def test_bugs_only_row_b_shows_are_caught_by_their_clauses(tmp_path):
    """At d_k 4, d_v 8: a scale of 1/sqrt(d_v) fails attention.scale; a model that builds d_model / h heads
    whatever it is asked fails config.parameters; a registration without free_head_dims is refused, every check an
    error naming the sizes (not judged, no finding)."""
    seen = run_suite(tmp_path, "heads-scale-sqrt-d-v,heads-ignore-d-k,heads-undeclared", "--config=d_k=4,d_v=8",
                     "--clause=attention.scale,config.parameters")
    assert "failed" in seen[("heads-scale-sqrt-d-v", "attention.scale")], dict(seen)
    assert seen[("heads-scale-sqrt-d-v", "config.parameters")] == {"passed"}, dict(seen)
    assert "failed" in seen[("heads-ignore-d-k", "config.parameters")], dict(seen)
    undeclared = {o for (impl, _), outcomes in seen.items() if impl == "heads-undeclared" for o in outcomes}
    assert "failed" not in undeclared and "error" in undeclared, dict(seen)


def test_at_the_papers_head_sizes_the_same_bugs_are_invisible():
    """The control: at TINY (d_k = d_v = d_model / h = 8) both models compute the reference's function exactly, so
    only sizes apart from d_model / h can show their bugs."""
    spec = importlib.util.spec_from_file_location("_head_size_models", ROOT / PLUGIN)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    config = TINY.replace(dropout=0.0)
    torch.manual_seed(0)
    reference = build(config).eval()
    src, tgt = torch.randint(1, 37, (2, 6)), torch.randint(1, 37, (2, 5))
    for make in (models.scale_sqrt_d_v, models.ignore_d_k):
        model = make(config).eval()
        model.load_state_dict(reference.state_dict())
        with torch.no_grad():
            assert torch.equal(model(src, tgt), reference(src, tgt)), make.__name__


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [ROW_B, "d_model=36,h=5,d_k=8,d_v=6,d_ff=72"])
def test_the_reference_is_judged_and_passes_every_clause_at_row_b_sizes(tmp_path, sizes):
    """Table 3's row B at the suite's sizes: d_k and d_v apart, and h not dividing d_model."""
    ref, off = reference_audit(tmp_path, sizes, timeout=1800)
    assert not off, f"the reference at {sizes}: clauses not passed: {off}"
    assert ref["verdict"] == "conforming", ref["verdict"]


@pytest.mark.slow
def test_the_cached_onnx_decoder_takes_keys_and_values_of_their_own_sizes():
    """export/kv_cache.py's graphs at d_k 4, d_v 12: onnxruntime's steps equal the reference's."""
    from aiayn_conformance.export import onnxruntime_cached as plugin
    from aiayn_conformance.reference.model import reference_twin
    from aiayn_conformance.spec.tolerance import compare

    if plugin.unavailable():
        pytest.skip(plugin.unavailable())
    cfg = ROW_B_CONFIG.replace(n_layers=1, max_len=10)
    torch.manual_seed(0)
    model = plugin.build(cfg).eval()
    reference = reference_twin(cfg, model.state_dict())
    src = torch.tensor([[4, 9, 3, 0], [8, 8, 2, 6]])
    got, want = [], []
    with torch.no_grad():
        for decoder, out in ((model, got), (reference, want)):
            state = decoder.begin_decoding(src)
            for token in (1, 5, 7):
                logits, state = decoder.decode_step(state, torch.full((2,), token))
                out.append(logits)
    cmp = compare(torch.stack(got), torch.stack(want), dtype=torch.float32, scope="model")
    assert cmp.ok, cmp.describe()


def test_ctranslate2_refuses_head_sizes_it_cannot_hold():
    pytest.importorskip("ctranslate2")
    from aiayn_conformance.export import ExportError
    from aiayn_conformance.export.ctranslate2 import transformer_spec

    state = build(ROW_B_CONFIG).state_dict()
    with pytest.raises(ExportError, match=r"^CTranslate2's Transformer divides d_model among its heads \(d_k = d_v = "
                                          r"d_model / h = 8\); this model has d_k=4, d_v=12"):
        transformer_spec(state, ROW_B_CONFIG)

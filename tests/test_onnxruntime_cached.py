"""The ``onnxruntime-cached`` built-in decodes in onnxruntime, on the weights the model holds when decoding begins.

``conformance/test_decode.py --impl=onnxruntime-cached`` judges its decoder by the ``decode.*`` clauses; the
clauses load their weights before the first decoding, so they cannot see an export left stale by a later weight
change. This file can: scores after an in-place change must equal the reference's on the changed weights.
"""

from __future__ import annotations

import pytest
import torch

from aiayn_conformance.export import onnxruntime_cached as plugin
from aiayn_conformance.spec import TINY
from aiayn_conformance.spec.tolerance import compare

pytestmark = pytest.mark.skipif(bool(plugin.unavailable()), reason=plugin.unavailable() or "available")

CFG = TINY.replace(n_layers=1, max_len=10)
BOS = 1


def first_scores(decoder, src: torch.Tensor) -> torch.Tensor:
    """The next-token logits after the start symbol, then after one more token (two steps, a reorder between)."""
    with torch.no_grad():
        state = decoder.reorder_state(decoder.begin_decoding(src), torch.tensor([1, 0, 0]))
        first, state = decoder.decode_step(state, torch.full((3,), BOS))
        second, _ = decoder.decode_step(state, torch.tensor([5, 6, 7]))
    return torch.stack([first, second])


@pytest.mark.slow
def test_decodes_in_onnxruntime_exports_again_after_a_weight_change_and_refuses_long_sources():
    from aiayn_conformance.export import ExportError, OrtCachedDecoder
    from aiayn_conformance.export.kv_cache import OrtCache
    from aiayn_conformance.reference.model import Transformer

    torch.manual_seed(0)
    model = plugin.build(CFG)  # left in training mode: decoding runs the inference graphs and keeps the mode
    reference = Transformer(CFG).eval()
    reference.load_state_dict(model.state_dict())
    src = torch.tensor([[4, 9, 3, 0], [8, 8, 2, 6]])

    assert isinstance(model.begin_decoding(src), OrtCache)
    assert isinstance(model._ort[1], OrtCachedDecoder) and model.training
    before = first_scores(model, src)
    assert compare(before, first_scores(reference, src), dtype=torch.float32, scope="model").ok

    with torch.no_grad():  # in place, as load_state_dict copies: the same storage, a new version
        model.tgt_embed.weight.mul_(3.0)
        reference.tgt_embed.weight.mul_(3.0)
    after = first_scores(model, src)
    cmp = compare(after, first_scores(reference, src), dtype=torch.float32, scope="model")
    assert cmp.ok, f"decoding after an in-place weight change: {cmp.describe()} (an export left stale?)"
    assert not compare(after, before, dtype=torch.float32, scope="model").ok

    with pytest.raises(ExportError, match=r"^a source of 11 tokens is longer than the exported graphs accept "
                                          r"\(10, the model's max_len\)$"):
        model.begin_decoding(torch.full((1, CFG.max_len + 1), 5))


def test_unavailable_names_the_missing_package_and_the_onnx_extra(monkeypatch):
    real = plugin.unavailable_reason

    def without_onnxscript(module, distribution, **kw):
        return real("no_such_module_here" if module == "onnxscript" else module, distribution, **kw)

    monkeypatch.setattr(plugin, "unavailable_reason", without_onnxscript)
    assert plugin.unavailable() == ("onnxscript is not installed (needs onnxscript>=0.1,<1): "
                                    "pip install 'aiayn-conformance[onnx]'")

"""The own-weights trace (conformance/helpers/traces.py) reads what a forward computes, whatever computes it.

The broken models of tests/broken_models.py prove each own-weights probe against the suite; these tests pin the
trace's readings themselves, including the fused ``F.scaled_dot_product_attention`` path that none of the broken
models takes.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from aiayn_conformance.conformance.helpers import settings
from aiayn_conformance.conformance.helpers.harness import checking
from aiayn_conformance.conformance.helpers.traces import Trace, padded_keys, real_queries, trace_of
from aiayn_conformance.implementations import Implementation
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import TINY


def fused(q, k, v, mask, *, scale=None):
    """Eq. (1) through torch's fused kernel (True = may attend), at ``scale`` (default 1/sqrt(d_k))."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def traced(name: str, build) -> Trace:
    impl = Implementation(name=name, build=build, output="logits", summary="", source="tests/test_traces.py")
    with settings.using(settings.AuditSettings(config=TINY)), checking("attention.scale"):
        trace = trace_of(impl, TINY)
    assert isinstance(trace, Trace), trace
    return trace


def kinds(trace: Trace) -> list[str]:
    return sorted(a.kind for a in trace.attentions)


EXPECTED_KINDS = sorted(["encoder self-attention"] * 2 + ["decoder self-attention"] * 2 + ["cross-attention"] * 2)
D_K = TINY.d_model // TINY.n_heads


@pytest.mark.parametrize("attention", [None, fused], ids=["reference", "fused-sdpa"])
def test_the_paper_s_model_reads_as_the_paper(attention):
    trace = traced("trace-paper", lambda cfg: Transformer(cfg, attention=attention))
    assert kinds(trace) == EXPECTED_KINDS
    assert len(trace.scales) == 6 and all(s.value == pytest.approx(D_K ** -0.5, rel=1e-5) for s in trace.scales), \
        [(s.value, s.how) for s in trace.scales]
    for a in trace.attentions:  # no weight on padded keys, nor on the future in the decoder
        real = real_queries(a.lq)
        assert float((a.weights[:, :real] * padded_keys(a)[:real]).max()) == 0.0, a.kind
        if a.kind == "decoder self-attention":
            assert float(a.weights.triu(1).abs().max()) == 0.0
    assert [(lu.stack, round(lu.scale or 0.0, 4)) for lu in trace.lookups] == [
        ("encoder", round(math.sqrt(TINY.d_model), 4)), ("decoder", round(math.sqrt(TINY.d_model), 4))]
    assert all(lu.table is not None and lu.table.abs().max() > 0.5 for lu in trace.lookups)


def test_a_fused_kernel_s_scale_is_measured():
    trace = traced("trace-fused-d-model", lambda cfg: Transformer(cfg, attention=partial(fused,
                                                                                       scale=cfg.d_model ** -0.5)))
    assert all(s.value == pytest.approx(TINY.d_model ** -0.5, rel=1e-5) for s in trace.scales), \
        [(s.value, s.how) for s in trace.scales]
    assert all("_scaled_dot_product" in s.where for s in trace.scales)


def test_a_scale_applied_to_q_is_found_on_q():
    def pre_scaled(q, k, v, mask):
        q = q / math.sqrt(q.size(-1))  # fairseq's and OpenNMT-py's place for it
        scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v

    trace = traced("trace-q-scaled", lambda cfg: Transformer(cfg, attention=pre_scaled))
    assert all(s.value == pytest.approx(D_K ** -0.5, rel=1e-5) for s in trace.scales)
    assert all("q' = 0.353553" in s.how for s in trace.scales), [s.how for s in trace.scales]


def test_a_recording_failure_is_named_and_no_reading_is_used(monkeypatch):
    """Recording never changes the forward, but when it fails the trace is incomplete: every own-weights probe then
    skips naming the operation and the exception, rather than reading "nothing observed"."""
    from aiayn_conformance.conformance.helpers import traces

    original = traces._Recorder.record

    def failing(self, func, args, kwargs, out):
        if str(func) == "aten.embedding.default":
            raise ValueError("a recording bug")
        return original(self, func, args, kwargs, out)

    monkeypatch.setattr(traces._Recorder, "record", failing)
    impl = Implementation(name="recording-fails", build=Transformer, output="logits", summary="",
                          source="tests/test_traces.py")
    with settings.using(settings.AuditSettings(config=TINY)), checking("attention.scale"):
        reason = trace_of(impl, TINY)
    assert isinstance(reason, str), reason
    assert "aten.embedding.default: ValueError: a recording bug" in reason and "not a finding" in reason, reason

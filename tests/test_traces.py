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
from aiayn_conformance.conformance.test_attention import heads_departure
from aiayn_conformance.implementations import Implementation
from aiayn_conformance.reference.model import MultiHeadAttention, Transformer
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


class SequenceFirstMHA(MultiHeadAttention):
    """The paper's attention in fairseq's layout: time first, the heads folded into the batch, K and V projected
    together (one packed [2 d_model, d_model] weight)."""

    def __init__(self, d_model, h, attention):
        super().__init__(d_model, h, attention)
        self.kv = torch.nn.Linear(d_model, 2 * d_model, bias=False)

    def forward(self, query, key, value, mask=None):
        B, Lq, d = query.shape
        h, d_k = self.h, self.d_k

        def split(y):  # (L, B, d) -> (B * h, L, d_k), matrix n = b * h + j
            return y.reshape(y.size(0), B * h, d_k).transpose(0, 1)

        q = split(self.q(query.transpose(0, 1)))
        k, v = (split(y) for y in self.kv(key.transpose(0, 1)).chunk(2, dim=-1))
        heads = self.attention(*(x.reshape(B, h, -1, d_k) for x in (q, k, v)), mask)  # (B, h, Lq, d_v)
        concat = heads.reshape(B * h, Lq, d_k).transpose(0, 1).reshape(Lq, B, d)  # (Lq, B, h * d_v)
        return self.o(concat).transpose(0, 1)  # (B, Lq, d_model)


def sequence_first(cfg):
    model = Transformer(cfg)
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if type(child) is MultiHeadAttention:
                setattr(m, name, SequenceFirstMHA(cfg.d_model, cfg.n_heads, child.attention))
    return model


@pytest.mark.parametrize("build", [Transformer, lambda cfg: Transformer(cfg, attention=fused), sequence_first],
                         ids=["reference", "fused-sdpa", "sequence-first-packed-kv"])
def test_every_head_is_read_per_position(build):
    """attention.heads' reading: each attention's queries, keys, values and concatenation, h matrices per sequence
    of d_k features, row i of each from token i, in the layout the model uses (a packed projection included)."""
    trace = traced("trace-heads", build)
    parts = sorted((s.kind, s.part) for s in trace.splits)
    assert parts == sorted((k, p) for k in EXPECTED_KINDS for p in ("queries", "keys", "values", "concatenation"))
    layout = "sequence-first" if build is sequence_first else "batch-first"
    for s in trace.splits:
        assert (s.layout, s.heads, s.width, s.mixed, s.uncovered, s.unread) == \
            (layout, [TINY.n_heads] * 2, D_K, "", "", ""), s
        assert heads_departure(s, TINY) == "", s
        if s.part != "concatenation":
            assert s.proj_in == TINY.d_model, s

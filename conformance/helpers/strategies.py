"""Hypothesis strategies for the suite, and its profiles: every drawn input of a property check comes from here.

Inputs are drawn piece by piece (batch size, lengths, each row's padding, token values, mask bits, the
position or padding a metamorphic check changes), each labelled, so a failure shrinks to the smallest
witness and is reported with its parts named. The one exception is the float values of attention-kernel
inputs: hundreds of drawn floats would not shrink to anything more telling than the shapes and the mask, so
those are generated from a drawn (labelled) seed.

Shapes: the whole-model strategies draw only the batch sizes and lengths the implementation under test
accepts (its shape contract, ``conformance.helpers.shapes``, reported by model.shape), so hypothesis never shrinks a
crash the shape probe has already explained; a test whose strategy has no accepted shape to draw skips as
"blocked by model.shape". For a model that accepts every probed shape the draws are unchanged.

Profiles (select with ``--hypothesis-profile NAME`` or ``AIAYN_HYPOTHESIS_PROFILE``):
    ci        derandomized, 10 examples per test, no deadline: fast and repeatable (default)
    thorough  100 examples per test, random: for deep audits
    smoke     derandomized, 3 examples, no shrinking: the fixed witnesses do the catching (every
              check has one); used by the project's own tests that run the suite on many models
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import parameter_count

from . import shapes

settings.register_profile(
    "ci", max_examples=10, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "smoke", max_examples=3, derandomize=True, deadline=None, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(  # derandomize spelled out: an unset value is inherited from the profile loaded when this
    # module runs, and a second run (pytest.main in-process, as conformance/helpers/catalogue.py does) finds "ci" loaded
    "thorough", max_examples=100, derandomize=False, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("AIAYN_HYPOTHESIS_PROFILE", "ci"))

# Above this many parameters a forward takes tens of milliseconds or more (the base model: 63M), and a check's
# examples each run several: the explored checks draw at most LARGE_MODEL_EXAMPLES examples there (the fixed
# witnesses, which every check has, do the catching).
LARGE_MODEL_PARAMETERS = 5_000_000
LARGE_MODEL_EXAMPLES = 3


def length_cap(config: ModelConfig, batch: int, top: int) -> int:
    """The longest row an explored example of ``batch`` rows draws (at most ``top``). Above LARGE_MODEL_PARAMETERS a
    forward's cost is its tokens times the parameters, so an example holds at most one full-length row's tokens on
    each axis (batch x length <= max_len): a batch of one still reaches max_len, a batch of three a third of it
    (at big, the (3, 512, 378) example of model.reference-equivalence cost 8.9 s of its 11). The long rows a batch
    then misses are the shape checks' own witnesses (model.shape's max_len x max_len edge)."""
    if not _large(config):
        return top
    return max(1, min(top, config.max_len // max(1, batch)))


@functools.lru_cache(maxsize=16)
def _large(config: ModelConfig) -> bool:
    """Whether ``config``'s model has more than LARGE_MODEL_PARAMETERS (counted once per configuration, not per
    drawn example)."""
    return parameter_count(config) > LARGE_MODEL_PARAMETERS


def examples_for(parameters: int) -> int | None:
    """How many examples an explored check draws for a model of ``parameters`` parameters (None: the profile's)."""
    if parameters <= LARGE_MODEL_PARAMETERS:
        return None
    current = settings.default
    return LARGE_MODEL_EXAMPLES if current is None else min(current.max_examples, LARGE_MODEL_EXAMPLES)


def lengths(config: ModelConfig, *, min_value: int = 1, max_value: int | None = None) -> st.SearchStrategy[int]:
    """Sequence lengths from min_value to max_value (default max_len), with both edges favoured (the plain range
    comes first, so that a failure shrinks to the shortest length that shows it)."""
    top = config.max_len if max_value is None else max_value
    return st.one_of(st.integers(min_value=min_value, max_value=top), st.sampled_from(sorted({min_value, top})))


def real_tokens(config: ModelConfig, vocab: int) -> st.SearchStrategy[int]:
    """Token ids other than the pad id (shrinking towards the smallest)."""
    return st.sampled_from([t for t in range(vocab) if t != config.pad_id])


def token_batch(config: ModelConfig, *, vocab: int, batch: int, length: int, min_real: int = 1,
                padded: bool = True) -> st.SearchStrategy[torch.Tensor]:
    """A right-padded LongTensor [batch, length]: each row has between min_real and length real tokens
    (every token real when not ``padded``)."""

    @st.composite
    def build(draw: st.DrawFn) -> torch.Tensor:
        rows = []
        for b in range(batch):
            real = (draw(st.integers(min_value=min(min_real, length), max_value=length), label=f"real length {b}")
                    if padded else length)
            ids = draw(st.lists(real_tokens(config, vocab), min_size=real, max_size=real), label=f"tokens {b}")
            rows.append(ids + [config.pad_id] * (length - real))
        return torch.tensor(rows, dtype=torch.long)

    return build()


def _accepted(contract: shapes.ShapeContract, axis: shapes.Axis, low: int, high: int, *, room: int = 0,
              what: str) -> list[int]:
    """The values of ``axis`` from low to high that the model accepts (with ``room`` more, too); skips the test
    as blocked by model.shape when there are none."""
    found = [n for n in contract.values(axis, low, high) if contract.accepts_value(axis, n + room)]
    if not found:
        pytest.skip(contract.need(what, axis))
    return found


def _within(values: list[int], cap: int) -> list[int]:
    """The accepted ``values`` up to ``cap`` (length_cap), or the shortest where none is that short."""
    return [n for n in values if n <= cap] or values[:1]


@st.composite
def src_tgt(draw: st.DrawFn, config: ModelConfig, *, min_batch: int = 1, max_batch: int = 4,
            max_len: int | None = None, padded: bool = True, src_room: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(src [B, S], tgt [B, T]): batch size, lengths (1 to ``max_len``, default the config's; for a large model
    at most ``length_cap``), right padding per row (every row with at least one real token; none when not
    ``padded``) and token values, all drawn.

    Only shapes the implementation under test accepts are drawn (its shape contract, ``shapes``; with room for
    ``src_room`` more source tokens): where it accepts every probed shape, the draws are the plain ranges above;
    where it accepts none in range, the test skips as blocked by model.shape."""
    contract = shapes.current()
    top = config.max_len if max_len is None else max_len
    if contract is None or contract.complete:
        batch = draw(st.integers(min_value=min_batch, max_value=max_batch), label="batch")
        cap = length_cap(config, batch, top)
        s_len = draw(lengths(config, max_value=cap), label="S")
        t_len = draw(lengths(config, max_value=cap), label="T")
    else:
        need = "this property needs"
        batch = draw(st.sampled_from(_accepted(contract, "batch", min_batch, max_batch,
                                               what=f"{need} a batch size from {min_batch} to {max_batch}")),
                     label="batch")
        s_what = (shapes.room_needed("src", src_room, "this property") if src_room
                  else f"{need} a source length up to {top}")
        cap = length_cap(config, batch, top)
        s_len = draw(st.sampled_from(_within(_accepted(contract, "src", 1, top, room=src_room, what=s_what), cap)),
                     label="S")
        t_len = draw(st.sampled_from(_within(_accepted(contract, "tgt", 1, top,
                                                       what=f"{need} a target length up to {top}"), cap)), label="T")
    src = draw(token_batch(config, vocab=config.src_vocab, batch=batch, length=s_len, padded=padded), label="src")
    tgt = draw(token_batch(config, vocab=config.tgt_vocab, batch=batch, length=t_len, padded=padded), label="tgt")
    return src, tgt


@st.composite
def causal_case(draw: st.DrawFn, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(src [1, S], tgt [1, T], j): one unpadded sample and the target position j whose token is changed."""
    src, tgt = draw(src_tgt(config, max_batch=1, padded=False), label="sample")
    j = draw(st.integers(0, tgt.size(1) - 1), label="j (changed position)")
    return src, tgt, j


@st.composite
def source_padding_case(draw: st.DrawFn, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(src [1, S], tgt [1, T], extra): one unpadded sample (S < max_len) and how many pad tokens to append to
    its source (S + extra <= max_len)."""
    src, tgt = draw(src_tgt(config, max_batch=1, max_len=config.max_len - 1, padded=False, src_room=1),
                    label="sample")
    contract = shapes.current()
    if contract is None or contract.complete:
        extra = draw(st.integers(1, config.max_len - src.size(1)), label="extra source padding")
    else:  # only paddings to a source length the model accepts
        room = [e for e in range(1, config.max_len - src.size(1) + 1) if contract.accepts_value("src", src.size(1) + e)]
        extra = draw(st.sampled_from(room), label="extra source padding")
    return src, tgt, extra


def attention_mask(*, batch: int, lq: int, lk: int) -> st.SearchStrategy[torch.Tensor]:
    """A boolean mask [batch, 1, Lq, Lk] (True = may attend), any pattern, rows with no allowed key included."""
    return st.lists(st.booleans(), min_size=batch * lq * lk, max_size=batch * lq * lk).map(
        lambda bits: torch.tensor(bits, dtype=torch.bool).view(batch, 1, lq, lk))


@st.composite
def kernel_case(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [B, h, Lq, d], k [B, h, Lk, d], v [B, h, Lk, d], mask [B, 1, Lq, Lk]) for an attention kernel: sizes,
    dtype (float32 or float64) and mask bits drawn; the values from a drawn seed (see above)."""
    b = draw(st.integers(1, 3), label="B")
    h = draw(st.integers(1, 4), label="h")
    lq = draw(st.integers(1, 7), label="Lq")
    lk = draw(st.integers(1, 7), label="Lk")
    d = draw(st.sampled_from([1, 4, 8]), label="d_k")
    dtype = draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    mask = draw(attention_mask(batch=b, lq=lq, lk=lk), label="mask")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16), label="value seed"))
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (lq, lk, lk))
    return q, k, v, mask


@st.composite
def table_size(draw: st.DrawFn, *, max_length: int = 64, max_d_model: int = 96) -> tuple[int, int]:
    """(length, d_model) of a positional table: length 1..max_length, d_model even, 2..max_d_model."""
    length = draw(st.integers(1, max_length), label="length")
    d_model = 2 * draw(st.integers(1, max_d_model // 2), label="d_model / 2")
    return length, d_model

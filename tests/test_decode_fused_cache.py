"""The fused implementation's preallocated key/value cache decodes what the reference decoder decodes.

Same weights (the reference's canonical state loaded into ``fused``); the reference's own cached decoder
(``reference.decoding``) is the oracle. Tokens must be equal and scores within the tolerance policy
(``spec.tolerance``, scope "model"), through every path of the cache: beams sharing their source's
cross-attention keys, a reorder mixing sources unevenly (one cross-attention row per state row), buffers grown
past their first capacity, padded and fully padded sources. A cache written at the wrong position is caught.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from aiayn_conformance.implementations import get_registry
from aiayn_conformance.implementations.builtins import fused as module
from aiayn_conformance.reference.decoding import beam_search, greedy_search
from aiayn_conformance.spec import TINY
from aiayn_conformance.spec.tolerance import compare

CFG = TINY.replace(max_len=40)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    reference = get_registry().get("reference").build(CFG).eval()
    fused = get_registry().get("fused").build(CFG).eval()
    fused.load_reference_state(reference.state_dict())
    return reference, fused


def sources() -> torch.Tensor:
    src = torch.randint(3, CFG.src_vocab, (4, 6), generator=torch.Generator().manual_seed(3))
    src[1, 4:] = CFG.pad_id
    src[2, 1:] = CFG.pad_id
    return src


@contextlib.contextmanager
def threads(n: int):
    """torch's intra-op thread count set to ``n`` within the block (one row on one thread takes the W^T path)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def steps(decoder, src, tokens, reorders):
    """Log-probabilities of each step, feeding ``tokens`` [T, N] with ``reorders`` {step: indices} before a step."""
    out = []
    with torch.inference_mode():
        state = decoder.reorder_state(decoder.begin_decoding(src), reorders.pop("expand"))
        for t in range(tokens.size(0)):
            if t in reorders:
                state = decoder.reorder_state(state, reorders[t])
            scores, state = decoder.decode_step(state, tokens[t])
            out.append(torch.log_softmax(scores.float(), dim=-1))
    return torch.stack(out)


@pytest.mark.parametrize("expand, reorders", [
    (torch.arange(4).repeat_interleave(3), {5: torch.tensor([2, 2, 0, 5, 4, 3, 6, 6, 8, 11, 9, 10])}),  # beams
    (torch.arange(4).repeat_interleave(3), {5: torch.tensor([0, 1, 2, 9, 10, 11, 3, 4, 5, 6, 7, 8])}),  # swap
    (torch.arange(4).repeat_interleave(3), {5: torch.tensor([0, 3, 3, 7, 8, 1, 11, 2, 0, 5, 4, 6]),
                                            30: torch.arange(12).flip(0)}),  # uneven, then reversed
    (torch.tensor([3, 0, 0, 2, 1]), {}),  # uneven from the start, rows repeated
    (torch.tensor([1]), {}),  # one row: the products through W^T instead of oneDNN
])
def test_steps_equal_the_reference_cache_through_reorders_and_growth(pair, expand, reorders):
    reference, fused = pair
    src = sources()
    n = expand.numel()
    tokens = torch.randint(3, CFG.tgt_vocab, (70, n), generator=torch.Generator().manual_seed(5))  # 70 > S + 51
    with threads(1 if n == 1 else torch.get_num_threads()):
        got = steps(fused, src, tokens, {"expand": expand, **reorders})
    expected = steps(reference, src, tokens, {"expand": expand, **reorders})
    cmp = compare(got, expected, dtype=torch.float32, scope="model")
    assert cmp.ok, cmp.describe()
    assert (module._PACKED.get(fused) is not None) == module._onednn()  # the oneDNN path was the one compared
    if n == 1 and module._onednn():  # and with one row on one thread, the products through W^T
        assert module._PACKED[fused][1].generator._transposed is not None


@pytest.mark.parametrize("beam", [1, 4])
def test_searches_choose_the_reference_tokens_and_scores(pair, beam):
    reference, fused = pair
    src = sources()
    src[3, :] = CFG.pad_id  # a source of padding only attends to nothing
    kw = dict(bos_id=1, eos_id=5, pad_id=CFG.pad_id)
    for max_len in (None, 60):
        if beam == 1:
            got, expected = greedy_search(fused, src, max_len=max_len, **kw), \
                greedy_search(reference, src, max_len=max_len, **kw)
        else:
            got, expected = beam_search(fused, src, beam_size=beam, max_len=max_len, **kw), \
                beam_search(reference, src, beam_size=beam, max_len=max_len, **kw)
        assert torch.equal(got.tokens, expected.tokens)
        cmp = compare(got.scores, expected.scores, dtype=torch.float32, scope="model")
        assert cmp.ok, cmp.describe()


def test_a_cache_written_at_the_wrong_position_is_caught(pair, monkeypatch):
    reference, fused = pair
    src = sources()
    tokens = torch.randint(3, CFG.tgt_vocab, (8, 4), generator=torch.Generator().manual_seed(5))
    original = module._cached_layer

    def overwrite_first(layer, y, state, i):  # BUG: every step's keys/values land on position 0
        t = state.length
        state.length = 0
        try:
            out = original(layer, y, state, i)
        finally:
            state.length = t
        return out

    monkeypatch.setattr(module, "_cached_layer", overwrite_first)
    got = steps(fused, src, tokens, {"expand": torch.arange(4)})
    monkeypatch.undo()
    expected = steps(reference, src, tokens, {"expand": torch.arange(4)})
    assert not compare(got, expected, dtype=torch.float32, scope="model").ok
    assert compare(got[:1], expected[:1], dtype=torch.float32, scope="model").ok  # step 0 is still right


def test_packed_weights_follow_new_weights():
    """The oneDNN-packed copies are rebuilt when the model's weights change: another state loaded in place (a weight's
    version moves), into parameters given new storage (its address moves; a packed copy may alias the storage)."""
    fused = get_registry().get("fused").build(CFG).eval()
    src = sources()
    tokens = torch.randint(3, CFG.tgt_vocab, (6, 4), generator=torch.Generator().manual_seed(5))
    for seed in (1, 2, 3):  # 2: new storage, 3: loaded in place again
        torch.manual_seed(seed)
        reference = get_registry().get("reference").build(CFG).eval()
        with torch.no_grad():
            if seed == 2:
                for p in fused.parameters():
                    p.data = p.data.clone()
            fused.load_reference_state(reference.state_dict())
        for expand in (torch.arange(4), torch.tensor([1])):  # several rows (oneDNN), one row on one thread (W^T)
            with threads(1):
                got = steps(fused, src, tokens[:, :expand.numel()], {"expand": expand})
            expected = steps(reference, src, tokens[:, :expand.numel()], {"expand": expand})
            cmp = compare(got, expected, dtype=torch.float32, scope="model")
            assert cmp.ok, f"seed {seed}, {expand.numel()} rows: {cmp.describe()}"

"""The decoding methods of the Hugging Face plugins (``hf-marian``, ``hf-fsmt``, ``hf-bart``): the library's own.

Decoding in transformers is not the model's code but the library's, shared by every encoder-decoder
(``GenerationMixin.generate`` and the ``Cache`` classes), so the three plugins share this file as the library
shares that code. ``HFDecoding`` gives an adapter the contract's optional decoding methods (``spec.contract``):

- step level, through the model's own key/value cache: ``begin_decoding`` runs the encoder once,
  ``decode_step`` calls the model on one new decoder token with ``encoder_outputs`` and the cache
  (``use_cache=True``), as ``generate`` does, and ``reorder_state`` reorders the cache with
  ``EncoderDecoderCache.reorder_cache``, the method ``generate``'s beam search calls;
- whole search: ``generate`` calls the model's ``generate`` with every option set as near to §6.1 as it goes:
  greedy (``num_beams=1, do_sample=False``) or beam search (``num_beams=K``, ``length_penalty=alpha``,
  ``early_stopping="never"``, the setting that bounds the live hypotheses by the maximum length as
  tensor2tensor does), the start symbol as ``decoder_start_token_id``, the padding id suppressed
  (``suppress_tokens``; the contract never generates it, and the OPUS-MT configurations ban it too, with
  ``bad_words_ids``),
  no forced or repeated-n-gram rules, and the returned start symbol dropped.

What ``generate`` cannot be told: the length penalty is |Y|^alpha, not GNMT's ((5 + |Y|) / 6)^alpha, and the
length limit is one ``max_length`` for the whole batch, so ``max_len=None`` (§6.1: each source's real
length + 50) becomes the longest real source length + 50 for every row. The plugins declare what the suite
observes of these, citing ``transformers/generation/utils.py`` (``HF_CITED``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["HFDecoding", "HFState", "HF_CITED", "G", "STOP", "BEAM", "MAX_LENGTH", "DECODING_NOTE"]

G = "transformers/generation/utils.py"
STOP = "transformers/generation/stopping_criteria.py"

# The lines of transformers 5.24.0's generation code that the reasons below cite (each plugin's CITED includes
# them; tests/test_library_plugins.py checks them against the installed release).
HF_CITED: dict[str, str] = {
    f"{G}:3548": "did_top_num_beams_just_finished = next_token_hits_stopping_criteria & top_num_beam_mask[None, :]",
    f"{G}:3552": "topk_log_probs = topk_log_probs / ((cur_len + 1 - decoder_prompt_len) ** length_penalty)",
    f"{G}:3680": "output_fill_value = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1",
    f"{STOP}:79": "is_done = cur_len >= self.max_length",
    f"{STOP}:86": "return torch.full((input_ids.shape[0],), is_done, device=input_ids.device, dtype=torch.bool)",
}

# The declared decoding deviations shared by the three plugins (each plugin's DEVIATIONS names them).
BEAM = (
    f"generate's beam search lets only the K best of a step's 2K candidates finish ({G}:3548; tensor2tensor keeps "
    "every finished candidate aside): on the suite's witnesses its outputs are those of a search whose finished "
    "hypotheses compete for the K beam slots, so one pushed out by live hypotheses is lost; it also divides a "
    f"finished hypothesis's summed log-probabilities by |Y|^alpha ({G}:3552), not GNMT's ((5 + |Y|) / 6)^alpha"
)
MAX_LENGTH = (
    f"generate stops every row of a batch at one length (MaxLengthCriteria, {STOP}:79, :86): there is no limit per "
    "source, so max_len=None is passed as the longest real source length + 50 and the shorter sources get the "
    "longest one's limit"
)
DECODING_NOTE = (
    "Decoding is the library's own: `begin_decoding`/`decode_step`/`reorder_state` drive the model's key/value "
    "cache (`EncoderDecoderCache`, reordered with `reorder_cache`) one token at a time as `generate` does, and "
    "`generate` calls the model's `generate` configured toward §6.1 (greedy, or beams with `length_penalty=alpha` "
    "and `early_stopping='never'`; the padding id suppressed; implementations/builtins/hf_decoding.py). "
    f"A library bug after the end symbol, not a §6.1 departure: with pad id 0, `generate` fills the positions after "
    f"a finished hypothesis's end symbol with the end symbol instead of padding ({G}:3680: `pad_token_id or "
    "eos_token_id[0]` takes a pad id of 0 for a missing one); the suite reads outputs up to the end symbol, so this "
    "is recorded here and under no clause."
)


@dataclass
class HFState:
    """The decoder state between steps: the encoder output and source mask per row, and the library's cache
    (None before the first step)."""

    memory: Tensor  # (N, S, d_model)
    keep: Tensor  # (N, S) 1 = a real source token
    cache: Any  # transformers' EncoderDecoderCache, or None


class HFDecoding:
    """Mixin for an adapter holding a transformers encoder-decoder in ``self.model`` and a ``ModelConfig`` in
    ``self.config``, with ``encode(src)``: the library's own cached decoding and ``generate``."""

    model: Any
    config: Any

    def _cache_keyword(self) -> str:
        """The name of the cache argument: ``cache`` (transformers 5.24 renamed it; ``past_key_values`` is
        accepted, with a warning, until 5.40) or ``past_key_values`` in earlier 5.x releases."""
        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    # -- step level --------------------------------------------------------------------------------------
    def begin_decoding(self, src: Tensor) -> HFState:
        """Encode ``src`` (B, S) once; the cache is created by the first step."""
        memory = self.encode(src)  # type: ignore[attr-defined]  # the adapter's (B, S, d_model)
        return HFState(memory, (src != self.config.pad_id).long(), None)

    def decode_step(self, state: HFState, tokens: Tensor) -> tuple[Tensor, HFState]:
        """One decoder token per row (N,) -> next-token logits (N, tgt_vocab) and the state with the cache grown."""
        key = self._cache_keyword()
        out = self.model(encoder_outputs=(state.memory,), attention_mask=state.keep,
                         decoder_input_ids=tokens[:, None], use_cache=True, **{key: state.cache})
        return out.logits[:, -1], HFState(state.memory, state.keep, getattr(out, key))

    def reorder_state(self, state: HFState, indices: Tensor) -> HFState:
        """Row i continues row ``indices[i]``: the library reorders its cache (in place), the adapter the rest."""
        if state.cache is not None:
            state.cache.reorder_cache(indices)
        return HFState(state.memory.index_select(0, indices), state.keep.index_select(0, indices), state.cache)

    # -- whole search ------------------------------------------------------------------------------------
    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                 max_len: int | None = None) -> Tensor:
        """The library's ``generate`` configured toward §6.1; tokens (B, L) without the start symbol, right-padded.

        ``max_len=None``: one limit for the batch, the longest real source length + 50 (``generate`` takes
        one ``max_length``)."""
        pad = self.config.pad_id
        keep = (src != pad).long()
        limit = max_len if max_len is not None else int(keep.sum(dim=1).max()) + 50
        search: dict[str, Any] = (dict(num_beams=1) if beam_size == 1 else
                                  dict(num_beams=beam_size, length_penalty=alpha, early_stopping="never"))
        # max_length counts the start symbol (max_new_tokens would warn against the config's max_length).
        with torch.no_grad():
            out = self.model.generate(
                input_ids=src, attention_mask=keep, decoder_start_token_id=bos_id, bos_token_id=bos_id,
                eos_token_id=eos_id, pad_token_id=pad, max_length=limit + 1, min_length=0, do_sample=False,
                num_return_sequences=1, suppress_tokens=[pad], forced_bos_token_id=None, forced_eos_token_id=None,
                no_repeat_ngram_size=0, repetition_penalty=1.0, use_cache=True, **search)
        return out[:, 1:]  # (B, L): the start symbol dropped

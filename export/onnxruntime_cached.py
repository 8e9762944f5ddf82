"""Built-in plugin ``onnxruntime-cached``: the reference model decoding through its cached graphs in onnxruntime.

A built-in that lives beside the export code it wraps, not in ``implementations/builtins/``: it needs the export
layer, which builds on the registry. It registers through the project's own ``aiayn`` entry point, which the
registry loads with the built-ins, so imports still flow one way (tests/test_imports.py). The graphs' code is
imported when a model first decodes, never at registration: where the onnx extra is missing the implementation
registers as unavailable with the reason.

The fastest conforming CPU decoder of this project (``benchmarks/decode_interleaved.py`` times it against
CTranslate2) is not a PyTorch module but ``export.kv_cache``'s two graphs driven by ``export.OrtCachedDecoder``.
This plugin puts that decoder behind the adapter contract, so the ``decode.*`` clauses judge it like any
implementation's decoder.

The adapter is the reference ``Transformer``: ``forward``, ``encode``, ``positional_encoding`` and
``load_reference_state`` are the reference's, in PyTorch (the graphs hold no full forward). ``begin_decoding``,
``decode_step`` and ``reorder_state`` run in onnxruntime, and ``generate`` runs ``reference/decoding.py``'s greedy
and beam searches over them (the reference's ``generate``, inherited). The graphs are exported from the model's
own weights when it first decodes, and again whenever a parameter or buffer has been replaced or changed in place
since (``_fingerprint``), so decoding always computes with the weights the model holds. Exporting takes seconds
(``torch.onnx.export(dynamo=True)``); the sessions use torch's thread count at that moment.

Decoding runs the inference graphs, without dropout, in training mode too; the scores come back on the device of
the tokens fed. Sources longer than the model's ``max_len`` are refused with a one-line error (the exported
graphs' source axis stops there), and so are prefixes beyond ``max_len + 50`` positions (the step's position
table, which covers §6.1's limit for every source the model accepts).
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import torch
from torch import Tensor

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.implementations.availability import unavailable_reason
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig

__all__ = ["OrtCachedTransformer", "build"]

ONNX_INSTALL = "pip install 'aiayn-conformance[onnx]'"
NEEDS = (("onnxruntime", "onnxruntime", "1.18", "2"), ("onnx", "onnx", "1.16", "2"),
         ("onnxscript", "onnxscript", "0.1", "1"))
"""(module, distribution, at least, below): what exporting and running the graphs need (the onnx extra)."""


def unavailable() -> str:
    """'' when the onnx extra is installed; otherwise the first missing piece, with the install command."""
    for module, distribution, at_least, below in NEEDS:
        reason = unavailable_reason(module, distribution, at_least=at_least, below=below, install=ONNX_INSTALL)
        if reason:
            return reason
    return ""


class OrtCachedTransformer(Transformer):
    """The reference Transformer whose step-level decoding runs in onnxruntime on graphs exported from itself."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self._ort: tuple[tuple[Any, ...], Any] | None = None  # (fingerprint of the exported weights, decoder)

    def _fingerprint(self) -> tuple[Any, ...]:
        """Changes when a parameter or buffer is replaced (storage, shape) or modified in place (its version
        counter, which every in-place op and ``load_state_dict``'s copy increments)."""
        return tuple((name, t.data_ptr(), tuple(t.shape), t._version)
                     for name, t in [*self.named_parameters(), *self.named_buffers()])

    def _decoder(self) -> Any:
        """The onnxruntime step decoder on this model's current weights (exported again when they changed)."""
        key = self._fingerprint()
        if self._ort is None or self._ort[0] != key:
            from .kv_cache import OrtCachedDecoder, export_cached_generation

            source = self if self.pe.device.type == "cpu" else copy.deepcopy(self).cpu()
            was_training = source.training
            try:
                with tempfile.TemporaryDirectory(prefix="aiayn-ort-cached-") as folder:
                    export_cached_generation(source, folder, self.config)  # the graphs are read when loaded
                    decoder = OrtCachedDecoder.load(folder, threads=torch.get_num_threads())
            finally:
                source.train(was_training)
            self._ort = (key, decoder)
        return self._ort[1]

    # -- decoding (§6.1), adapter contract: the reference's searches (inherited generate) drive these ----------
    # The weights are looked at when a decoding begins; its steps and reorders run on the graphs it began with.
    def begin_decoding(self, src: Tensor) -> Any:
        """Encode src (B, S) in onnxruntime; the preallocated key/value buffers for an empty prefix."""
        return self._decoder().begin_decoding(src)

    def _begun(self) -> Any:
        """The decoder the current decoding began with (made now if none began)."""
        return self._ort[1] if self._ort else self._decoder()

    def decode_step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        """Feed tokens (N,) at the next position: next-token logits (N, V) on the tokens' device."""
        logits, state = self._begun().decode_step(state, tokens)
        return logits.to(tokens.device), state

    def reorder_state(self, state: Any, indices: Tensor) -> Any:
        """Row i of the new state continues row indices[i] (beams), gathered by index into spare buffers."""
        return self._begun().reorder_state(state, indices)


def build(config: ModelConfig) -> OrtCachedTransformer:
    return OrtCachedTransformer(config)


NOTES = (
    "The reference model whose decoding runs in onnxruntime, on the cached graphs `aiayn export --generation` "
    "writes (`export/kv_cache.py`: a time-major key/value past read where it lies, only the new position's keys "
    "and values returned and written in place by `OrtCachedDecoder`, beams reordered by index): the fastest CPU "
    "decoder of this project (BENCHMARKS.md). The forward, the encoder and the weights are the "
    "reference's in PyTorch; `begin_decoding`, `decode_step` and `reorder_state` export the graphs from the "
    "model's current weights (again after any change) and run them, and `generate` runs `reference/decoding.py`'s "
    "greedy and beam searches over them, so every `decode.*` clause judges the onnxruntime decoder. It declares "
    "no deviation and must pass every clause. Needs the onnx extra (`pip install 'aiayn-conformance[onnx]'`)."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="onnxruntime-cached",
        build=build,
        summary="The reference model decoding in onnxruntime on its exported cached graphs (the fastest CPU "
                "decoder); conforming",
        source="aiayn-conformance export/onnxruntime_cached.py, export/kv_cache.py",
        output="logits",
        free_head_dims=True,  # the reference's weights in export/kv_cache.py's graphs, d_k and d_v apart
        notes=NOTES,
        unavailable=unavailable(), install=ONNX_INSTALL,
    ))

"""ONNX export of incremental decoding with a key/value cache, verified by decoding in onnxruntime.

Two graphs and a manifest (``export_cached_generation``), for L decoder layers,
h heads, d_k = d_model / h, N rows (sources, or sources x beams):

``encoder_kv.onnx``
    ``src`` [N, S] int64 -> ``cross_key.{i}``, ``cross_value.{i}`` [N, h, S, d_k]
    for i < L: the encoder runs once per source and every decoder layer's
    cross-attention keys and values of its output are computed there (§3.2.3).
``decoder_step.onnx``
    ``tokens`` [N] int64, ``src`` [N, S] int64 (for the source padding mask),
    ``past_key.{i}`` / ``past_value.{i}`` [N, h, t, d_k] (the self-attention
    cache of the t tokens fed so far; t = 0 at the first step),
    ``cross_key.{i}`` / ``cross_value.{i}`` [N, h, S, d_k]
    -> ``logits`` [N, V] (the next token's), ``present_key.{i}`` /
    ``present_value.{i}`` [N, h, t + 1, d_k]. The new token sits at position t,
    read from the past's length, so positions continue (§3.5).
``generation.json``
    The layout above as data, the token ids and ``max_positions``: the position
    table in the step graph covers ``max_len + extra_length`` positions, so the
    §6.1 limit (a source's length + 50) holds for every source the model accepts.

The step graph is ``reference.decoding.decode_step`` traced on the reference
model's own modules; the encoder graph is ``reference.decoding.init_cache``.
N, S and t are symbolic (exported at N = 2, S = 5, t = 3, and asserted
symbolic in the saved file); the session is asserted to run on the CPU provider.

``OrtCachedDecoder`` (these graphs) and ``OrtPrefixDecoder`` (the full-prefix
graphs of ``export.onnx.export_generation``) are step decoders, so the
reference's ``greedy_search`` and ``beam_search`` run the whole §6.1 search
around onnxruntime sessions with the reference's rules.
``verify_cached_generation`` decodes greedily (with and without an end symbol)
and with beam search in onnxruntime and in PyTorch, compares the tokens and,
step by step, the next-token log-probabilities.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import (
    Hypotheses,
    KVCache,
    LayerCache,
    beam_search,
    decode_step,
    greedy_search,
    init_cache,
)
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.decoding import TRANSLATION, DecodeConfig

from .common import (
    NEVER,
    OPSET,
    DecodeCheck,
    ExportError,
    example_inputs,
    example_sources,
    export_graph,
    is_reference,
    pick_eos,
    session,
    short_error,
)
from .decoders import Lockstep, torch_step_decoder

__all__ = ["ENCODER_FILE", "STEP_FILE", "MANIFEST_FILE", "CachedGeneration", "CachedStep", "EncoderKV",
           "export_cached_generation", "export_encoder_kv", "export_cached_step",
           "OrtCachedDecoder", "OrtPrefixDecoder", "verify_cached_generation"]

ENCODER_FILE = "encoder_kv.onnx"
STEP_FILE = "decoder_step.onnx"
MANIFEST_FILE = "generation.json"
MAX_ROWS = 8192  # the largest N the graphs are exported for (batch x beam)


# -- the graphs -------------------------------------------------------------------------------------------
class EncoderKV(nn.Module):
    """src (N, S) -> (cross_key.0, cross_value.0, ..., cross_key.{L-1}, cross_value.{L-1}), each (N, h, S, d_k)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        cache = init_cache(self.model, src)
        return tuple(x for layer in cache.layers for x in (layer.cross_k, layer.cross_v))


class CachedStep(nn.Module):
    """One decoder step over the key/value cache: ``reference.decoding.decode_step`` with tensors in and out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model

    def forward(self, tokens: Tensor, src: Tensor, past_keys: list[Tensor], past_values: list[Tensor],
                cross_keys: list[Tensor], cross_values: list[Tensor]):
        src_mask = (src != self.model.config.pad_id)[:, None, None, :]  # (N, 1, 1, S)
        layers = tuple(LayerCache(*x) for x in zip(past_keys, past_values, cross_keys, cross_values))
        logits, cache = decode_step(self.model, KVCache(layers, src_mask), tokens)
        return logits, [c.self_k for c in cache.layers], [c.self_v for c in cache.layers]


@contextlib.contextmanager
def _position_table(model: nn.Module, positions: int) -> Iterator[None]:
    """Within the block, the model's position table covers ``positions`` rows (§3.5 extends beyond max_len)."""
    saved = model.pe
    table = model.positional_encoding(positions).detach().to(saved.dtype)  # type: ignore[operator]
    model.pe = table
    try:
        yield
    finally:
        model.pe = saved


def _names(L: int) -> dict[str, list[str]]:
    return {kind: [f"{kind}.{i}" for i in range(L)] for kind in
            ("past_key", "past_value", "cross_key", "cross_value", "present_key", "present_value")}


@dataclass(frozen=True)
class CachedGeneration:
    """What ``export_cached_generation`` wrote."""

    encoder: Path
    step: Path
    manifest: Path

    def describe(self) -> str:
        return f"{self.encoder}, {self.step} and {self.manifest}"


def _check_model(model: nn.Module) -> None:
    if not is_reference(model):
        raise ExportError(f"the cached export traces the reference's decoding on a reference Transformer; got "
                          f"{type(model).__name__} (export.reference_for() gives one with the same weights)")


def export_encoder_kv(model: nn.Module, path: str | Path, config: ModelConfig, *,
                      progress: Callable[[str], None] = lambda _: None) -> Path:
    """Export ``EncoderKV``: src [N, S] -> each decoder layer's cross-attention keys and values."""
    _check_model(model)
    model = model.eval()
    names = _names(config.n_layers)
    src, _ = example_inputs(config)  # N = 2, S = 5
    N = torch.export.Dim("rows", min=1, max=MAX_ROWS)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    outputs = [n for pair in zip(names["cross_key"], names["cross_value"]) for n in pair]
    symbolic = {"src": (0, 1), **{n: (0, 2) for n in outputs}}
    return export_graph(EncoderKV(model), (src,), ({0: N, 1: S},), (["src"], outputs), Path(path), progress, symbolic)


def export_cached_step(model: nn.Module, path: str | Path, config: ModelConfig, *, positions: int | None = None,
                       progress: Callable[[str], None] = lambda _: None) -> Path:
    """Export ``CachedStep`` with dynamic rows, source length and past length (0 .. positions - 1)."""
    _check_model(model)
    model = model.eval()
    positions = positions or config.max_len + TRANSLATION.extra_length
    L, names = config.n_layers, _names(config.n_layers)
    src, _ = example_inputs(config)  # N = 2, S = 5
    with torch.no_grad():  # a real cache of t = 3 tokens as the example
        cache = init_cache(model, src)
        for token in (1, 4, 5):
            _, cache = decode_step(model, cache, torch.full((2,), token % config.tgt_vocab))
    tokens = torch.tensor([3, 4]) % config.tgt_vocab
    args = (tokens, src, [c.self_k for c in cache.layers], [c.self_v for c in cache.layers],
            [c.cross_k for c in cache.layers], [c.cross_v for c in cache.layers])
    N = torch.export.Dim("rows", min=1, max=MAX_ROWS)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("past_len", min=0, max=positions - 1)
    past, cross = [{0: N, 2: T}] * L, [{0: N, 2: S}] * L
    inputs = ["tokens", "src", *names["past_key"], *names["past_value"], *names["cross_key"], *names["cross_value"]]
    outputs = ["logits", *names["present_key"], *names["present_value"]]
    symbolic = {"tokens": (0,), "src": (0, 1), "logits": (0,),
                **{n: (0, 2) for n in inputs[2:] + outputs[1:]}}
    with _position_table(model, positions):
        return export_graph(CachedStep(model), args, ({0: N}, {0: N, 1: S}, past, past, cross, cross),
                            (inputs, outputs), Path(path), progress, symbolic)


def export_cached_generation(model: nn.Module, out_dir: str | Path, config: ModelConfig, *,
                             decode: DecodeConfig = TRANSLATION,
                             progress: Callable[[str], None] = lambda _: None) -> CachedGeneration:
    """Write ``encoder_kv.onnx``, ``decoder_step.onnx`` and ``generation.json`` into ``out_dir``.

    ``model`` is a reference ``Transformer`` (``export.reference_for`` makes one for a conforming
    implementation). The step's position table covers ``config.max_len + decode.extra_length``
    positions; ``decode`` also gives the start and end symbols recorded in the manifest.
    """
    out = Path(out_dir)
    positions = config.max_len + decode.extra_length
    enc = export_encoder_kv(model, out / ENCODER_FILE, config, progress=progress)
    step = export_cached_step(model, out / STEP_FILE, config, positions=positions, progress=progress)
    names = _names(config.n_layers)
    manifest = {
        "format": "aiayn-conformance cached decoding",
        "opset": OPSET,
        "encoder": {"file": ENCODER_FILE, "inputs": ["src"],
                    "outputs": [n for pair in zip(names["cross_key"], names["cross_value"]) for n in pair]},
        "step": {"file": STEP_FILE,
                 "inputs": ["tokens", "src", *names["past_key"], *names["past_value"], *names["cross_key"],
                            *names["cross_value"]],
                 "outputs": ["logits", *names["present_key"], *names["present_value"]]},
        "shapes": {"tokens": "[N]", "src": "[N, S]", "past": "[N, h, t, d_k]", "present": "[N, h, t + 1, d_k]",
                   "cross": "[N, h, S, d_k]", "logits": "[N, V]"},
        "n_layers": config.n_layers, "n_heads": config.n_heads, "d_k": config.d_model // config.n_heads,
        "tgt_vocab": config.tgt_vocab, "pad_id": config.pad_id, "bos_id": decode.bos_id, "eos_id": decode.eos_id,
        "max_positions": positions, "max_source_length": config.max_len,
        "decoding": {"beam_size": decode.beam_size, "alpha": decode.alpha, "extra_length": decode.extra_length,
                     "length_penalty": "((5 + |Y|) / 6) ** alpha"},
    }
    path = out / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return CachedGeneration(enc, step, path)


# -- onnxruntime step decoders --------------------------------------------------------------------------------
OrtState = dict[str, np.ndarray]


class OrtCachedDecoder:
    """The cached graphs in onnxruntime as a step decoder: the state is the step graph's inputs (numpy).

    ``max_positions`` (from the manifest) bounds the decoded length; a longer decoding raises an
    ExportError instead of reading past the position table.
    """

    def __init__(self, encoder: str | Path, step: str | Path, *, pad_id: int, max_positions: int | None = None,
                 threads: int | None = None):
        self.encoder, self.step = session(encoder, threads=threads), session(step, threads=threads)
        self.pad_id, self.max_positions = pad_id, max_positions
        self.enc_outputs = [o.name for o in self.encoder.get_outputs()]
        self.step_outputs = [o.name for o in self.step.get_outputs()]
        past = [i for i in self.step.get_inputs() if i.name.startswith("past_key.")]
        if not past or len(self.enc_outputs) != 2 * len(past):
            raise ExportError(f"{step} and {encoder} are not a cached-decoding pair (step inputs "
                              f"{[i.name for i in self.step.get_inputs()]}, encoder outputs {self.enc_outputs})")
        self.L = len(past)
        self.h, self.d_k = past[0].shape[1], past[0].shape[3]

    @classmethod
    def load(cls, out_dir: str | Path, *, threads: int | None = None) -> OrtCachedDecoder:
        """The decoder for a folder written by ``export_cached_generation``."""
        out = Path(out_dir)
        try:
            manifest = json.loads((out / MANIFEST_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ExportError(f"cannot read {out / MANIFEST_FILE}: {exc}") from exc
        return cls(out / manifest["encoder"]["file"], out / manifest["step"]["file"], pad_id=manifest["pad_id"],
                   max_positions=manifest["max_positions"], threads=threads)

    def begin_decoding(self, src: Tensor) -> OrtState:
        src_np = np.ascontiguousarray(src.cpu().numpy().astype(np.int64))
        cross = self.encoder.run(self.enc_outputs, {"src": src_np})
        empty = np.zeros((src_np.shape[0], self.h, 0, self.d_k), dtype=np.float32)
        state: OrtState = {"src": src_np}
        for i in range(self.L):
            state[f"past_key.{i}"], state[f"past_value.{i}"] = empty, empty
            state[f"cross_key.{i}"], state[f"cross_value.{i}"] = cross[2 * i], cross[2 * i + 1]
        return state

    def decode_step(self, state: OrtState, tokens: Tensor) -> tuple[Tensor, OrtState]:
        t = state["past_key.0"].shape[2]
        if self.max_positions is not None and t >= self.max_positions:
            raise ExportError(f"position {t} is beyond the exported position table ({self.max_positions} positions)")
        outs = self.step.run(self.step_outputs, {**state, "tokens": tokens.cpu().numpy().astype(np.int64)})
        new = dict(state)
        for i in range(self.L):
            new[f"past_key.{i}"], new[f"past_value.{i}"] = outs[1 + i], outs[1 + self.L + i]
        return torch.from_numpy(outs[0]), new

    def reorder_state(self, state: OrtState, indices: Tensor) -> OrtState:
        """Row i of the new state is row ``indices[i]``. The cross-attention keys and values are a function
        of the source row alone, so when every row keeps its source (beams reordered within a source, as in
        beam search) they are kept as they are instead of copied."""
        idx = indices.cpu().numpy()
        src = state["src"]
        same_sources = idx.shape[0] == src.shape[0] and np.array_equal(src.take(idx, axis=0), src)
        return {name: value if same_sources and name.startswith(("src", "cross_")) else value.take(idx, axis=0)
                for name, value in state.items()}


class OrtPrefixDecoder:
    """The full-prefix graphs of ``export.onnx.export_generation`` (``encoder.onnx``: src -> memory,
    ``decoder.onnx``: memory, src, ys -> next logits) as a step decoder: the decoder reruns over the prefix."""

    def __init__(self, encoder: str | Path, decoder: str | Path, *, threads: int | None = None):
        self.encoder, self.decoder = session(encoder, threads=threads), session(decoder, threads=threads)

    def begin_decoding(self, src: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src_np = np.ascontiguousarray(src.cpu().numpy().astype(np.int64))
        memory = self.encoder.run(None, {"src": src_np})[0]
        return memory, src_np, np.zeros((src_np.shape[0], 0), dtype=np.int64)

    def decode_step(self, state, tokens: Tensor):
        memory, src_np, ys = state
        ys = np.concatenate([ys, tokens.cpu().numpy().astype(np.int64)[:, None]], axis=1)
        logits = self.decoder.run(None, {"memory": memory, "src": src_np, "ys": ys})[0]
        return torch.from_numpy(logits), (memory, src_np, ys)

    def reorder_state(self, state, indices: Tensor):
        idx = indices.cpu().numpy()
        return tuple(x.take(idx, axis=0) for x in state)


# -- verification ---------------------------------------------------------------------------------------------
def verify_cached_generation(out_dir: str | Path, model: nn.Module, config: ModelConfig, *,
                             output_kind: str = "logits", decode: DecodeConfig = TRANSLATION, sources: int = 3,
                             src_len: int = 8, seed: int = 0, atol: float = 1e-4,
                             threads: int | None = 1) -> list[DecodeCheck]:
    """Decode in onnxruntime with the graphs in ``out_dir`` and in PyTorch with ``model``; one check per search.

    On ``sources`` right-padded sources of ``src_len`` tokens (other shapes than the export
    example), with the §6.1 limit (each source's real length + ``decode.extra_length``):

    1. greedy search with no end symbol, to the limit (past lengths 0 .. limit - 1);
    2. greedy search with an end symbol the model emits, so sources stop at different steps;
    3. beam search (``decode.beam_size``, ``decode.alpha``) with that end symbol.

    onnxruntime drives each search (``Lockstep``): PyTorch is fed the same tokens and every step's
    next-token log-probabilities are compared (worst absolute difference, ``atol``); the tokens must
    equal those of the same search run on PyTorch alone (``model``'s own step decoding, else its
    forward over the prefix), and beam scores must agree within ``atol`` per step. onnxruntime
    runs on ``threads`` intra-op threads (1: verification is about values, not speed).
    """
    model = model.eval()
    ort = OrtCachedDecoder.load(out_dir, threads=threads)
    torch_decoder = torch_step_decoder(model, output_kind)
    src, lengths = example_sources(config, sources, src_len, seed=seed)
    limit = f"limit = source length + {decode.extra_length}"
    kw = dict(bos_id=decode.bos_id, pad_id=config.pad_id, extra_length=decode.extra_length)

    def run(search: Callable[..., Hypotheses], eos: int, **extra: Any) -> tuple[Hypotheses, Hypotheses, Lockstep]:
        pair = Lockstep(ort, torch_decoder, follow_kind=output_kind)
        try:
            with torch.inference_mode():
                got = search(pair, src, eos_id=eos, **kw, **extra)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"onnxruntime failed while decoding: {short_error(exc)}") from exc
        try:
            with torch.inference_mode():
                expected = search(torch_decoder, src, eos_id=eos, **kw, **extra)
        except Exception as exc:
            raise ExportError(f"PyTorch decoding with {type(model).__name__} failed: {short_error(exc)}") from exc
        return got, expected, pair

    def outcome(h: Hypotheses, steps: int) -> str:
        ends = [str(int(n)) if bool(f) else "-" for n, f in zip(h.lengths, h.finished)]
        return f"outputs of lengths {', '.join(ends)} ('-' = no EOS within the limit), stopped after step {steps}"

    checks = []
    got, expected, pair = run(greedy_search, NEVER)
    equal = got.tokens.tolist() == expected.tokens.tolist()
    checks.append(DecodeCheck("greedy search", f"{sources} sources of lengths {lengths}, no EOS, {limit}",
                              equal and pair.worst <= atol, equal, pair.worst, pair.worst_at, pair.steps, sources,
                              "every source ran to its limit"))
    eos = pick_eos(expected.tokens, config.pad_id)
    got, expected, pair = run(greedy_search, eos)
    equal = got.tokens.tolist() == expected.tokens.tolist()
    checks.append(DecodeCheck("greedy search", f"same sources, EOS = {eos}, {limit}", equal and pair.worst <= atol,
                              equal, pair.worst, pair.worst_at, pair.steps, sources, outcome(expected, pair.steps)))
    got, expected, pair = run(beam_search, eos, beam_size=decode.beam_size, alpha=decode.alpha)
    equal = got.tokens.tolist() == expected.tokens.tolist()
    score_diff = (got.scores.double() - expected.scores.double()).abs().nan_to_num(float("inf")).max().item()
    score_ok = score_diff <= atol * max(pair.steps, 1)
    checks.append(DecodeCheck(f"beam search (K = {decode.beam_size}, α = {decode.alpha})",
                              f"same sources, EOS = {eos}, {limit}", equal and pair.worst <= atol and score_ok, equal,
                              pair.worst, pair.worst_at, pair.steps, sources * decode.beam_size,
                              outcome(expected, pair.steps), score_diff))
    return checks

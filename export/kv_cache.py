"""ONNX export of incremental decoding with a key/value cache, verified by decoding in onnxruntime.

``export_cached_generation`` writes ``encoder_kv.onnx`` (``reference.decoding.init_cache``: the encoder and
every layer's cross-attention keys and values, once per source), ``decoder_step.onnx`` (``CachedStep``: one
step that reads the time-major past where it lies and returns only the new position's keys and values, so no
graph copies the cache) and ``generation.json`` (the layout as data). N, S and t are symbolic; the session runs
on the CPU provider. ``OrtCachedDecoder`` (these graphs) and ``OrtPrefixDecoder`` (the full-prefix graphs of
``export.onnx.export_generation``) are step decoders, so the reference's ``greedy_search`` and ``beam_search``
run the whole §6.1 search around onnxruntime sessions. ``verify_cached_generation`` compares tokens and
per-step log-probabilities with PyTorch. docs/export.md gives the inputs, outputs and shapes of each graph.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import (
    Hypotheses,
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

__all__ = ["ENCODER_FILE", "STEP_FILE", "MANIFEST_FILE", "CachedGeneration", "CachedStep", "EncoderKV", "OrtCache",
           "export_cached_generation", "export_encoder_kv", "export_cached_step",
           "OrtCachedDecoder", "OrtPrefixDecoder", "verify_cached_generation"]

ENCODER_FILE = "encoder_kv.onnx"
STEP_FILE = "decoder_step.onnx"
MANIFEST_FILE = "generation.json"
MAX_ROWS = 8192  # the largest N the graphs are exported for (batch x beam)
UNFUSED = ("SkipLayerNormFusion",)  # onnxruntime optimizers OrtCachedDecoder's sessions do without


# -- the graphs -------------------------------------------------------------------------------------------
class EncoderKV(nn.Module):
    """src (N, S) -> (cross_key.0, cross_value.0, ..., cross_key.{L-1}, cross_value.{L-1}): (N, h, S, d_k) keys,
    (N, h, S, d_v) values."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        cache = init_cache(self.model, src)
        return tuple(x for layer in cache.layers for x in (layer.cross_k, layer.cross_v))


class CachedStep(nn.Module):
    """One decoder step over a time-major key/value cache: the new position only, computed from the reference's
    weights (§3.2.2, §3.3, §3.4) and arranged for a CPU runtime.

    ``past_keys[i]`` (t, N, h, d_k) / ``past_values[i]`` (t, N, h, d_v) hold positions 0..t-1 of layer i,
    time-major so that the runtime can pass the filled prefix of preallocated buffers; the step returns the
    logits and only the new position's keys (N, h, d_k) and values (N, h, d_v), which the caller writes at
    position t. The same float32
    function as ``reference.decoding.decode_step`` in another order: 1/sqrt(d_k) folded into W^Q (exact when
    it is a power of two, as at d_k = 64), Q|K|V from one product, self-attention as elementwise products and
    sums over the cached positions, cross-attention as batched products.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model
        for i, layer in enumerate(model.decoder):  # type: ignore[arg-type]
            sa, xa = layer.self_attn, layer.cross_attn
            scale = 1.0 / math.sqrt(sa.d_k)
            # W^Q / sqrt(d_k) | W^K | W^V of layer i as one (h (2 d_k + d_v), d_model) matrix, and W^Q / sqrt(d_k)
            # of its cross-attention
            self.register_buffer(f"qkv_{i}", torch.cat([sa.q.weight * scale, sa.k.weight, sa.v.weight]).detach(),
                                 persistent=False)
            self.register_buffer(f"cross_q_{i}", (xa.q.weight * scale).detach(), persistent=False)

    def forward(self, tokens: Tensor, src: Tensor, past_keys: list[Tensor], past_values: list[Tensor],
                cross_keys: list[Tensor], cross_values: list[Tensor]):
        model = self.model
        t = past_keys[0].shape[0]
        keep = src != model.config.pad_id  # (N, S), True = may attend
        any_key = keep.any(dim=1)  # (N,) False for a fully padded source: it attends to nothing
        bias = torch.zeros(keep.shape, dtype=torch.float32).masked_fill(~(keep | ~any_key[:, None]),
                                                                         float("-inf"))[:, None, None, :]  # (N,1,1,S)
        gate = any_key.to(torch.float32)[:, None, None]  # (N, 1, 1)
        y = model.embed(tokens[:, None], model.tgt_embed, start=t)[:, 0]  # (N, d_model), position t
        new_keys, new_values = [], []
        for i, layer in enumerate(model.decoder):
            sa, xa = layer.self_attn, layer.cross_attn
            N, h, d_k, d_v = y.shape[0], sa.h, sa.d_k, sa.d_v
            q, k, v = F.linear(y, getattr(self, f"qkv_{i}")).split([h * d_k, h * d_k, h * d_v], dim=-1)
            q, k, v = q.view(N, h, d_k), k.view(N, h, d_k), v.view(N, h, d_v)  # (N, h, d_k) x 2, (N, h, d_v)
            past = (past_keys[i] * q).sum(-1)  # (t, N, h): q . k_j / sqrt(d_k) for j < t
            now = (k * q).sum(-1)[None]  # (1, N, h): the new position's own key
            scores = torch.cat([past, now])  # (t + 1, N, h): positions 0..t
            e = torch.exp(scores - scores.amax(0, keepdim=True))  # the softmax over positions, written out:
            w = e / e.sum(0, keepdim=True)  # onnxruntime's Softmax transposes for an axis other than the last
            heads = (w[:t, :, :, None] * past_values[i]).sum(0) + w[t, :, :, None] * v  # (N, h, d_v)
            y = layer.norm1(y + sa.o(heads.reshape(N, h * d_v)))  # (N, d_model)
            cq = F.linear(y, getattr(self, f"cross_q_{i}")).view(N, h, 1, d_k)  # (N, h, 1, d_k)
            scores = cq @ cross_keys[i].transpose(-1, -2) + bias  # (N, h, 1, S)
            heads = (torch.softmax(scores, dim=-1) @ cross_values[i])[:, :, 0] * gate  # (N, h, d_v)
            y = layer.norm2(y + xa.o(heads.reshape(N, h * d_v)))  # (N, d_model)
            y = layer.norm3(y + layer.ffn(y))
            new_keys.append(k)
            new_values.append(v)
        return model.generator(y), new_keys, new_values  # (N, V), L x (N, h, d_k), L x (N, h, d_v)


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
            ("past_key", "past_value", "cross_key", "cross_value", "new_key", "new_value")}


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
    with torch.no_grad():  # a real cache of t = 3 tokens as the example, time-major
        cache = init_cache(model, src)
        for token in (1, 4, 5):
            _, cache = decode_step(model, cache, torch.full((2,), token % config.tgt_vocab))
    tokens = torch.tensor([3, 4]) % config.tgt_vocab

    def time_major(x: Tensor) -> Tensor:
        return x.permute(2, 0, 1, 3).contiguous()  # (N, h, t, d) -> (t, N, h, d), d = d_k or d_v

    args = (tokens, src, [time_major(c.self_k) for c in cache.layers], [time_major(c.self_v) for c in cache.layers],
            [c.cross_k for c in cache.layers], [c.cross_v for c in cache.layers])
    N = torch.export.Dim("rows", min=1, max=MAX_ROWS)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("past_len", min=0, max=positions - 1)
    past, cross = [{0: T, 1: N}] * L, [{0: N, 2: S}] * L
    inputs = ["tokens", "src", *names["past_key"], *names["past_value"], *names["cross_key"], *names["cross_value"]]
    outputs = ["logits", *names["new_key"], *names["new_value"]]
    symbolic = {"tokens": (0,), "src": (0, 1), "logits": (0,),
                **{n: (0, 1) for n in names["past_key"] + names["past_value"]},
                **{n: (0, 2) for n in names["cross_key"] + names["cross_value"]},
                **{n: (0,) for n in outputs[1:]}}
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
                 "outputs": ["logits", *names["new_key"], *names["new_value"]]},
        "shapes": {"tokens": "[N]", "src": "[N, S]", "past_key": "[t, N, h, d_k]", "past_value": "[t, N, h, d_v]",
                   "new_key": "[N, h, d_k]", "new_value": "[N, h, d_v]", "cross_key": "[N, h, S, d_k]",
                   "cross_value": "[N, h, S, d_v]", "logits": "[N, V]"},
        "n_layers": config.n_layers, "n_heads": config.n_heads, "d_k": config.d_k, "d_v": config.d_v,
        "tgt_vocab": config.tgt_vocab, "pad_id": config.pad_id, "bos_id": decode.bos_id, "eos_id": decode.eos_id,
        "max_positions": positions, "max_source_length": config.max_len,
        "decoding": {"beam_size": decode.beam_size, "alpha": decode.alpha, "extra_length": decode.extra_length,
                     "length_penalty": "((5 + |Y|) / 6) ** alpha"},
    }
    path = out / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return CachedGeneration(enc, step, path)


# -- onnxruntime step decoders --------------------------------------------------------------------------------
@dataclass
class OrtCache:
    """The state of ``OrtCachedDecoder``: preallocated time-major buffers, filled up to ``length``.

    ``keys[i]`` / ``values[i]`` (capacity, N, h, d_k) hold layer i's self-attention keys/values of positions
    0..length-1; the step graph reads ``keys[i][:length]`` (a contiguous slice, no copy) and the decoder writes
    the new position in place. ``spare_keys`` / ``spare_values`` are as large: a beam reorder gathers the chosen
    rows into them and the two swap roles. ``cross`` holds the step graph's cross-attention inputs and ``src``.
    A step or a reorder consumes the state it is given (its buffers are reused).
    """

    src: np.ndarray  # (N, S) int64
    cross: dict[str, np.ndarray]  # cross_key.{i} / cross_value.{i}: (N, h, S, d_k)
    keys: list[np.ndarray]
    values: list[np.ndarray]
    spare_keys: list[np.ndarray]
    spare_values: list[np.ndarray]
    length: int

    @property
    def rows(self) -> int:
        return self.src.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[0]


class OrtCachedDecoder:
    """The cached graphs in onnxruntime as a step decoder over preallocated time-major buffers (``OrtCache``).

    ``max_positions`` (from the manifest) bounds the decoded length; a longer decoding raises an
    ExportError instead of reading past the position table. ``max_source_length`` (the manifest's, the model's
    max_len) bounds the source axis the graphs were exported for; a longer source raises an ExportError.
    """

    def __init__(self, encoder: str | Path, step: str | Path, *, pad_id: int, max_positions: int | None = None,
                 max_source_length: int | None = None, threads: int | None = None):
        # SkipLayerNormalization (Add + LayerNorm fused) ran 2.5x slower than the two ops it replaces on the
        # encoder's [B * S, d_model] rows (onnxruntime 1.32, 1 thread, AMD EPYC; BENCHMARKS.md)
        self.encoder = session(encoder, threads=threads, disabled_optimizers=UNFUSED)
        self.step = session(step, threads=threads, disabled_optimizers=UNFUSED)
        self.pad_id, self.max_positions, self.max_source_length = pad_id, max_positions, max_source_length
        self.enc_outputs = [o.name for o in self.encoder.get_outputs()]
        self.step_outputs = [o.name for o in self.step.get_outputs()]
        past = [i for i in self.step.get_inputs() if i.name.startswith("past_key.")]
        if (not past or len(self.enc_outputs) != 2 * len(past)
                or self.step_outputs[1:] != [f"new_{kind}.{i}" for kind in ("key", "value") for i in range(len(past))]):
            raise ExportError(f"{step} and {encoder} are not a cached-decoding pair of this version (step inputs "
                              f"{[i.name for i in self.step.get_inputs()]}, outputs {self.step_outputs}; encoder "
                              f"outputs {self.enc_outputs}); export them again with aiayn export --generation")
        self.L = len(past)
        values = {i.name: i.shape for i in self.step.get_inputs() if i.name.startswith("past_value.")}
        self.h, self.d_k = past[0].shape[2], past[0].shape[3]
        self.d_v = values.get("past_value.0", past[0].shape)[3]

    @classmethod
    def load(cls, out_dir: str | Path, *, threads: int | None = None) -> OrtCachedDecoder:
        """The decoder for a folder written by ``export_cached_generation``."""
        out = Path(out_dir)
        try:
            manifest = json.loads((out / MANIFEST_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ExportError(f"cannot read {out / MANIFEST_FILE}: {exc}") from exc
        return cls(out / manifest["encoder"]["file"], out / manifest["step"]["file"], pad_id=manifest["pad_id"],
                   max_positions=manifest["max_positions"], max_source_length=manifest.get("max_source_length"),
                   threads=threads)

    def _buffers(self, capacity: int, rows: int, width: int) -> list[np.ndarray]:
        """One (capacity, rows, h, width) buffer per layer: width d_k for keys, d_v for values."""
        return [np.zeros((capacity, rows, self.h, width), dtype=np.float32) for _ in range(self.L)]

    def _pair(self, capacity: int, rows: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Key and value buffers."""
        return self._buffers(capacity, rows, self.d_k), self._buffers(capacity, rows, self.d_v)

    def begin_decoding(self, src: Tensor) -> OrtCache:
        src_np = np.ascontiguousarray(src.cpu().numpy().astype(np.int64))
        if self.max_source_length is not None and src_np.shape[1] > self.max_source_length:
            raise ExportError(f"a source of {src_np.shape[1]} tokens is longer than the exported graphs accept "
                              f"({self.max_source_length}, the model's max_len)")
        outs = self.encoder.run(self.enc_outputs, {"src": src_np})
        N, capacity = src_np.shape[0], src_np.shape[1] + TRANSLATION.extra_length + 1
        if self.max_positions is not None:
            capacity = min(capacity, self.max_positions)
        return OrtCache(src_np, dict(zip(self.enc_outputs, outs)), *self._pair(capacity, N), *self._pair(capacity, N),
                        0)

    def decode_step(self, state: OrtCache, tokens: Tensor) -> tuple[Tensor, OrtCache]:
        t = state.length
        if self.max_positions is not None and t >= self.max_positions:
            raise ExportError(f"position {t} is beyond the exported position table ({self.max_positions} positions)")
        if t == state.capacity:
            state = self._grown(state)
        feed = {"tokens": tokens.cpu().numpy().astype(np.int64), "src": state.src, **state.cross}
        for i in range(self.L):
            feed[f"past_key.{i}"], feed[f"past_value.{i}"] = state.keys[i][:t], state.values[i][:t]
        outs = self.step.run(self.step_outputs, feed)
        for i in range(self.L):  # position t, in place
            state.keys[i][t] = outs[1 + i]
            state.values[i][t] = outs[1 + self.L + i]
        state.length = t + 1
        return torch.from_numpy(outs[0]), state

    def _grown(self, state: OrtCache) -> OrtCache:
        """Twice the capacity (at most ``max_positions``), positions 0..t-1 copied."""
        t, N = state.length, state.rows
        capacity = 2 * state.capacity if self.max_positions is None else min(2 * state.capacity, self.max_positions)

        def grow(buffers: list[np.ndarray], width: int) -> list[np.ndarray]:
            new = self._buffers(capacity, N, width)
            for old, b in zip(buffers, new):
                b[:t] = old[:t]
            return new

        return OrtCache(state.src, state.cross, grow(state.keys, self.d_k), grow(state.values, self.d_v),
                        *self._pair(capacity, N), t)

    def reorder_state(self, state: OrtCache, indices: Tensor) -> OrtCache:
        """Row i of the new state is row ``indices[i]``: the filled positions of the chosen rows are gathered
        into the spare buffers (``torch.index_select`` into views of them; new buffers only when the row count
        changes, as when sources become beams). The cross-attention inputs are a function of the source row
        alone, so when every row keeps its source they are kept as they are instead of copied."""
        rows = indices.cpu().long()  # index_select refuses an index outside the state's rows
        idx, t, n = rows.numpy(), state.length, rows.numel()
        if n == state.rows:
            keys, values = state.spare_keys, state.spare_values
            spare_keys, spare_values = state.keys, state.values
        else:
            keys, values = self._pair(state.capacity, n)
            spare_keys, spare_values = self._pair(state.capacity, n)
        for old, new in zip([*state.keys, *state.values], [*keys, *values]):  # torch views of the numpy buffers
            torch.index_select(torch.from_numpy(old[:t]), 1, rows, out=torch.from_numpy(new[:t]))
        src = state.src
        same_sources = n == src.shape[0] and np.array_equal(src.take(idx, axis=0), src)
        cross = state.cross if same_sources else {k: v.take(idx, axis=0) for k, v in state.cross.items()}
        return OrtCache(src if same_sources else src.take(idx, axis=0), cross, keys, values, spare_keys,
                        spare_values, t)


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

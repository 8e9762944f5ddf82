"""ONNX export with equivalence proven by onnxruntime.

``export_onnx`` writes a model meeting the adapter contract to ONNX with the
dynamo exporter (``torch.onnx.export(..., dynamo=True)``), dynamic batch,
source and target lengths, opset ``OPSET``; the file is checked with
``onnx.checker`` and its inputs must carry symbolic dimensions.
``verify`` runs it in onnxruntime (CPU provider, asserted) on shapes other
than the export example, with padding, and returns the worst difference.
``export_generation`` / ``ort_greedy_decode`` export the encoder and a
full-prefix decoder step as two graphs and decode greedily in onnxruntime.

Opset 18: the first opset whose LayerNormalization, ReduceMean-with-axes-input
and Split forms the dynamo exporter emits for these models are all available
in onnxruntime >= 1.16, so the files run on every onnxruntime this project
supports.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability

__all__ = ["OPSET", "ExportError", "Verification", "GenerationCheck", "export_onnx", "verify",
           "export_generation", "verify_generation",
           "ort_greedy_decode", "torch_greedy_decode", "resolve_model"]

OPSET = 18


class ExportError(RuntimeError):
    """The exporter, the checker or onnxruntime refused the model; the message is one line."""


def _short(exc: BaseException, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(("#", "File"))]
    first = lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {first}"[:limit]


def resolve_model(impl_or_model: Any, config: ModelConfig, *, seed: int = 0) -> tuple[nn.Module, str]:
    """A registered implementation's name (built with ``config``) or a module; returns (module, output kind)."""
    if isinstance(impl_or_model, nn.Module):
        return impl_or_model.eval(), getattr(impl_or_model, "output_kind", "logits")
    from aiayn_conformance.implementations import get_registry

    impl = get_registry().get(impl_or_model) if isinstance(impl_or_model, str) else impl_or_model
    torch.manual_seed(seed)
    return impl.build(config).eval(), impl.output


def _example(config: ModelConfig, batch: int = 2, s_len: int = 5, t_len: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, config.src_vocab, (batch, s_len), generator=g)
    tgt = torch.randint(1, config.tgt_vocab, (batch, t_len), generator=g)
    src[src == config.pad_id] = (config.pad_id + 1) % config.src_vocab
    tgt[tgt == config.pad_id] = (config.pad_id + 1) % config.tgt_vocab
    return src, tgt


# The exporter logs one warning per torchvision operator it cannot register when torchvision is absent
# (it is not a dependency: a Transformer uses none of them). Kept quiet during our exports only.
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _export(module: nn.Module, args: tuple, dynamic: tuple, names: tuple[list[str], list[str]], path: Path,
            progress: Callable[[str], None], symbolic: Mapping[str, Sequence[int]] | None = None) -> Path:
    """Export ``module`` on ``args``, save it as one file, check it; ``symbolic`` maps graph input and
    output names to the axes that must have stayed symbolic (default: axes 0 and 1 of every input)."""
    import onnx

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb"):
            pass
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    progress(f"exporting {type(module).__name__} with torch.onnx.export(dynamo=True, opset {OPSET}) ...")
    started = time.perf_counter()
    try:
        with warnings.catch_warnings(), _quiet_logger(_REGISTRATION_LOGGER):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic, opset_version=OPSET,
                                        input_names=names[0], output_names=names[1], verbose=False)
        if program is None:  # only the legacy exporter (dynamo=False) returns None
            raise ExportError("torch.onnx.export returned no program")
        program.save(str(path), external_data=False)
    except Exception as exc:
        raise ExportError(f"export failed: {_short(exc)}") from exc
    progress(f"exported in {time.perf_counter() - started:.1f} s; checking ...")
    model = onnx.load(str(path))
    try:
        onnx.checker.check_model(model)
        onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise ExportError(f"onnx.checker rejected the exported model: {_short(exc)}") from exc
    # Batch and length axes must stay symbolic: an example dimension of size 0 or 1, or a guard the
    # exporter could not prove, specializes them silently.
    values = {v.name: v for v in [*model.graph.input, *model.graph.output]}
    expected = symbolic if symbolic is not None else {i.name: (0, 1) for i in model.graph.input}
    for name, axes in expected.items():
        if name not in values:
            raise ExportError(f"the exported graph has no input or output named {name!r}")
        dims = [d.dim_param or d.dim_value for d in values[name].type.tensor_type.shape.dim]
        if not all(a < len(dims) and isinstance(dims[a], str) and dims[a] for a in axes):
            raise ExportError(f"{name} was exported with static dimensions {dims} (axes {list(axes)} must be symbolic)")
    return path


def export_onnx(impl_or_model: Any, path: str | Path, config: ModelConfig, *,
                progress: Callable[[str], None] = lambda _: None) -> Path:
    """Export ``forward(src, tgt)`` with dynamic batch, source and target lengths; returns the path."""
    model, _ = resolve_model(impl_or_model, config)
    src, tgt = _example(config)
    B = torch.export.Dim("batch", min=1, max=1024)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("tgt_len", min=1, max=config.max_len)
    return _export(model, (src, tgt), ({0: B, 1: S}, {0: B, 1: T}), (["src", "tgt"], ["scores"]), Path(path),
                   progress)


def session(path: str | Path, *, threads: int | None = None):
    """An onnxruntime session on the CPU provider (asserted); ``threads`` sets its intra-op thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        sess = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # InvalidGraph, NotImplemented, Fail: the exported graph is what is wrong
        raise ExportError(f"onnxruntime rejected the exported graph: {_short(exc)}") from exc
    if sess.get_providers()[0] != "CPUExecutionProvider":  # ORT falls back silently otherwise
        raise ExportError(f"onnxruntime chose {sess.get_providers()} instead of the CPU provider")
    return sess


@dataclass(frozen=True)
class Verification:
    ok: bool
    max_abs: float
    shape: tuple[int, int, int]
    index: tuple[int, ...]
    shapes_checked: int

    def describe(self) -> str:
        return (f"worst |onnxruntime - torch| = {self.max_abs:.3g} at index {list(self.index)} for (batch, S, T) = "
                f"{self.shape}, over {self.shapes_checked} shapes")


DEFAULT_SHAPES = ((1, 1, 1), (3, 7, 2), (4, 11, 9), (1, 9, 12))


def verify(path: str | Path, impl_or_model: Any, config: ModelConfig, *, shapes=DEFAULT_SHAPES,
           atol: float = 1e-4, rtol: float = 1e-4) -> Verification:
    """Compare onnxruntime with PyTorch on shapes other than the export example, right-padded, real positions."""
    model, _ = resolve_model(impl_or_model, config)
    sess = session(path)
    worst: tuple[float, tuple[int, int, int], tuple[int, ...]] = (0.0, (0, 0, 0), ())
    ok = True
    for n, (b, s, t) in enumerate(shapes):
        s, t = min(s, config.max_len), min(t, config.max_len)
        src, tgt = _example(config, b, s, t, seed=100 + n)
        if s > 1:
            src[0, s // 2:] = config.pad_id  # padding in the first row
        if t > 1:
            tgt[-1, t - 1:] = config.pad_id
        with torch.no_grad():
            expected = model(src, tgt).double()
        try:
            got = torch.from_numpy(sess.run(None, {"src": src.numpy(), "tgt": tgt.numpy()})[0]).double()
        except Exception as exc:
            raise ExportError(f"onnxruntime failed on (batch, S, T) = {(b, s, t)}: {_short(exc)}") from exc
        real = (tgt != config.pad_id)[..., None].expand_as(expected)
        diff = torch.where(real, (got - expected).abs(), torch.zeros_like(expected)).nan_to_num(float("inf"))
        bad = diff > atol + rtol * expected.abs()
        ok = ok and not bool(bad.any())
        m = diff.max().item()
        if m >= worst[0]:
            idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
            worst = (m, (b, s, t), idx)
    return Verification(ok, worst[0], worst[1], worst[2], len(shapes))


# -- generation ------------------------------------------------------------------
class _Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src):
        return self.model.encode(src)


class _DecoderStep(nn.Module):
    """Next-token logits at the last position of the prefix ``ys``, given the encoder output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, memory, src, ys):
        from aiayn_conformance.reference.model import padding_mask

        hidden = self.model.decode(memory, padding_mask(src, self.model.config.pad_id), ys)
        return self.model.generator(hidden[:, -1])


def export_generation(model, out_dir: str | Path, config: ModelConfig, *,
                      progress: Callable[[str], None] = lambda _: None) -> tuple[Path, Path]:
    """Export ``encoder.onnx`` (src -> memory) and ``decoder.onnx`` (memory, src, ys -> next logits).

    Needs a model with the reference's ``encode``, ``decode`` and ``generator``."""
    # encode is the contract's optional method; decode and generator are the reference's own parts.
    present = {"encode": has_capability(model, "encode"), "decode": hasattr(model, "decode"),
               "generator": hasattr(model, "generator")}
    lacks = [part for part, ok in present.items() if not ok]
    if lacks:
        raise ExportError(f"generation export needs encode(), decode() and generator; the model lacks {lacks[0]}")
    model = model.eval()
    out = Path(out_dir)
    src, tgt = _example(config)
    B = torch.export.Dim("batch", min=1, max=1024)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("prefix_len", min=1, max=config.max_len)
    enc = _export(_Encoder(model), (src,), ({0: B, 1: S},), (["src"], ["memory"]), out / "encoder.onnx", progress)
    with torch.no_grad():
        memory = model.encode(src)
    dec = _export(_DecoderStep(model), (memory, src, tgt), ({0: B, 1: S}, {0: B, 1: S}, {0: B, 1: T}),
                  (["memory", "src", "ys"], ["next_logits"]), out / "decoder.onnx", progress)
    return enc, dec


def ort_greedy_decode(encoder: str | Path, decoder: str | Path, src: torch.Tensor, *, bos_id: int, eos_id: int,
                      pad_id: int, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding entirely in onnxruntime; same stopping rule as the reference's greedy_decode."""
    return _ort_greedy(session(encoder), session(decoder), src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                       max_new_tokens=max_new_tokens)


def _ort_greedy(enc, dec, src: torch.Tensor, *, bos_id: int, eos_id: int, pad_id: int,
                max_new_tokens: int) -> torch.Tensor:
    import numpy as np

    src_np = src.numpy()
    memory = enc.run(None, {"src": src_np})[0]
    ys = np.full((src_np.shape[0], 1), bos_id, dtype=np.int64)
    done = np.zeros(src_np.shape[0], dtype=bool)
    for _ in range(max_new_tokens):
        logits = dec.run(None, {"memory": memory, "src": src_np, "ys": ys})[0]
        logits[:, pad_id] = -np.inf  # padding is never generated (reference.decoding)
        nxt = np.where(done, pad_id, logits.argmax(-1))
        ys = np.concatenate([ys, nxt[:, None]], axis=1)
        done |= nxt == eos_id
        if done.all():
            break
    return torch.from_numpy(ys)


def torch_greedy_decode(model, src: torch.Tensor, *, bos_id: int, eos_id: int, max_new_tokens: int) -> torch.Tensor:
    return model.greedy_decode(src, bos_id=bos_id, eos_id=eos_id, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class GenerationCheck:
    """What ``verify_generation`` compared and found."""

    ok: bool
    sources: int
    steps: int
    max_logit_diff: float  # worst |onnxruntime - torch| next-token logit, teacher-forced on the torch tokens
    worst_step: tuple[int, int]  # (source, step) of that worst difference
    tokens_equal: bool  # greedy decoding without EOS, every step
    eos_tokens_equal: bool  # greedy decoding stopping at an EOS that one source emits
    eos_finished_early: bool  # that run had a source finish while another went on (padding path exercised)

    def describe(self) -> str:
        verdict = "equals" if self.ok else "DIFFERS FROM"
        eos = "with a source finishing early" if self.eos_finished_early else "all sources finishing together"
        return (f"greedy decoding in onnxruntime {verdict} PyTorch ({self.steps} steps x {self.sources} sources; "
                f"again with an EOS, {eos}); worst next-token logit |onnxruntime - torch| = "
                f"{self.max_logit_diff:.3g} at (source, step) {self.worst_step}")


def verify_generation(encoder: str | Path, decoder: str | Path, model, config: ModelConfig, *, sources: int = 3,
                      src_len: int = 8, max_new_tokens: int = 12, bos_id: int = 1, seed: int = 0,
                      atol: float = 1e-4, rtol: float = 1e-4) -> GenerationCheck:
    """Prove the exported encoder and decoder step generate what ``model.greedy_decode`` generates.

    Three comparisons on right-padded sources: the decoder step's next-token logits at every step of the
    PyTorch trajectory (teacher-forced, so a difference is seen even where argmax hides it: untrained
    models with tied embeddings tend to repeat one token); greedy decoding for ``max_new_tokens`` with no
    EOS; and greedy decoding with an EOS taken from the first source's output, so a finished source is
    padded while the others go on.
    """
    model = model.eval()
    src_len = min(src_len, config.max_len)
    steps = min(max_new_tokens, config.max_len - 1)
    src, _ = _example(config, sources, src_len, 1, seed=seed)
    if sources > 1 and src_len > 2:
        src[1, src_len // 2:] = config.pad_id
    never = -1  # no token id: decoding runs every step
    pt = torch_greedy_decode(model, src, bos_id=bos_id, eos_id=never, max_new_tokens=steps)
    enc, dec = session(encoder), session(decoder)
    try:
        memory = enc.run(None, {"src": src.numpy()})[0]
        worst, worst_at, close = 0.0, (0, 0), True
        step_model = _DecoderStep(model)
        for t in range(1, pt.size(1)):
            prefix = pt[:, :t]
            got = torch.from_numpy(dec.run(None, {"memory": memory, "src": src.numpy(), "ys": prefix.numpy()})[0])
            with torch.no_grad():
                expected = step_model(torch.from_numpy(memory), src, prefix)
            diff = (got.double() - expected.double()).abs().nan_to_num(float("inf"))
            close = close and not bool((diff > atol + rtol * expected.double().abs()).any())
            step_worst = diff.max().item()
            if step_worst >= worst:
                worst, worst_at = step_worst, (int(diff.amax(-1).argmax()), t - 1)
        eos = int(pt[0, 1])
        pt_eos = torch_greedy_decode(model, src, bos_id=bos_id, eos_id=eos, max_new_tokens=steps)
        ort = _ort_greedy(enc, dec, src, bos_id=bos_id, eos_id=never, pad_id=config.pad_id, max_new_tokens=steps)
        ort_eos = _ort_greedy(enc, dec, src, bos_id=bos_id, eos_id=eos, pad_id=config.pad_id, max_new_tokens=steps)
    except Exception as exc:
        raise ExportError(f"onnxruntime failed while decoding: {_short(exc)}") from exc
    hit = pt_eos[:, 1:] == eos  # (sources, generated)
    finish = [int(row.nonzero()[0]) if bool(row.any()) else None for row in hit]  # step of each source's EOS
    early = len(set(finish)) > 1  # some source was padded while another still decoded
    tokens_equal = ort.tolist() == pt.tolist()
    eos_equal = ort_eos.tolist() == pt_eos.tolist()
    return GenerationCheck(close and tokens_equal and eos_equal, sources, steps, worst, worst_at, tokens_equal,
                           eos_equal, early)

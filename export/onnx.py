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

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability

from .common import (
    NEVER,
    OPSET,
    Check,
    ExportError,
    Progress,
    Target,
    example_inputs,
    example_sources,
    export_graph,
    installed,
    reference_for,
    resolve_model,
    session,
    short_error,
)

__all__ = ["OPSET", "ExportError", "Verification", "GenerationCheck", "export_onnx", "verify",
           "export_generation", "verify_generation",
           "ort_greedy_decode", "torch_greedy_decode", "resolve_model", "TARGET"]

def export_onnx(impl_or_model: Any, path: str | Path, config: ModelConfig, *,
                progress: Callable[[str], None] = lambda _: None) -> Path:
    """Export ``forward(src, tgt)`` with dynamic batch, source and target lengths; returns the path."""
    model, _ = resolve_model(impl_or_model, config)
    src, tgt = example_inputs(config)
    B = torch.export.Dim("batch", min=1, max=1024)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("tgt_len", min=1, max=config.max_len)
    return export_graph(model, (src, tgt), ({0: B, 1: S}, {0: B, 1: T}), (["src", "tgt"], ["scores"]), Path(path),
                        progress)

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"  # export_generation's graphs (full prefix)


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
        src, tgt = example_inputs(config, b, s, t, seed=100 + n)
        if s > 1:
            src[0, s // 2:] = config.pad_id  # padding in the first row
        if t > 1:
            tgt[-1, t - 1:] = config.pad_id
        with torch.no_grad():
            expected = model(src, tgt).double()
        try:
            got = torch.from_numpy(sess.run(None, {"src": src.numpy(), "tgt": tgt.numpy()})[0]).double()
        except Exception as exc:
            raise ExportError(f"onnxruntime failed on (batch, S, T) = {(b, s, t)}: {short_error(exc)}") from exc
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
    src, tgt = example_inputs(config)
    B = torch.export.Dim("batch", min=1, max=1024)
    S = torch.export.Dim("src_len", min=1, max=config.max_len)
    T = torch.export.Dim("prefix_len", min=1, max=config.max_len)
    enc = export_graph(_Encoder(model), (src,), ({0: B, 1: S},), (["src"], ["memory"]), out / ENCODER_FILE, progress)
    with torch.no_grad():
        memory = model.encode(src)
    dec = export_graph(_DecoderStep(model), (memory, src, tgt), ({0: B, 1: S}, {0: B, 1: S}, {0: B, 1: T}),
                       (["memory", "src", "ys"], ["next_logits"]), out / DECODER_FILE, progress)
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


def early_end_symbol(generated: torch.Tensor) -> int:
    """An end symbol for the EOS run of ``verify_generation``: of the tokens the first source generates ([sources,
    steps], no EOS), in order, the first that would end the sources at different steps (greedy decoding with an end
    symbol follows the trajectory without one up to its first occurrence), so that one source is padded while
    another still decodes; the first source's first token where none does (every source then ends together)."""
    first_at = [{int(t): i for i, t in reversed(list(enumerate(row.tolist())))} for row in generated]
    for token in dict.fromkeys(generated[0].tolist()):
        if len({at.get(token) for at in first_at}) > 1:
            return int(token)
    return int(generated[0, 0])


def verify_generation(encoder: str | Path, decoder: str | Path, model, config: ModelConfig, *, sources: int = 3,
                      src_len: int = 8, max_new_tokens: int = 12, bos_id: int = 1, seed: int = 0,
                      atol: float = 1e-4, rtol: float = 1e-4) -> GenerationCheck:
    """Prove the exported encoder and decoder step generate what ``model.greedy_decode`` generates.

    Three comparisons on right-padded sources: the decoder step's next-token logits at every step of the
    PyTorch trajectory (teacher-forced, so a difference is seen even where argmax hides it: untrained
    models with tied embeddings tend to repeat one token); greedy decoding for ``max_new_tokens`` with no
    EOS; and greedy decoding with an EOS taken from the first source's output (``early_end_symbol``), so a
    finished source is padded while the others go on.
    """
    model = model.eval()
    steps = min(max_new_tokens, config.max_len - 1)
    src, _ = example_sources(config, sources, src_len, seed=seed)
    never = NEVER  # no token id: decoding runs every step
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
        eos = early_end_symbol(pt[:, 1:])
        pt_eos = torch_greedy_decode(model, src, bos_id=bos_id, eos_id=eos, max_new_tokens=steps)
        ort = _ort_greedy(enc, dec, src, bos_id=bos_id, eos_id=never, pad_id=config.pad_id, max_new_tokens=steps)
        ort_eos = _ort_greedy(enc, dec, src, bos_id=bos_id, eos_id=eos, pad_id=config.pad_id, max_new_tokens=steps)
    except Exception as exc:
        raise ExportError(f"onnxruntime failed while decoding: {short_error(exc)}") from exc
    hit = pt_eos[:, 1:] == eos  # (sources, generated)
    finish = [int(row.nonzero()[0]) if bool(row.any()) else None for row in hit]  # step of each source's EOS
    early = len(set(finish)) > 1  # some source was padded while another still decoded
    tokens_equal = ort.tolist() == pt.tolist()
    eos_equal = ort_eos.tolist() == pt_eos.tolist()
    return GenerationCheck(close and tokens_equal and eos_equal, sources, steps, worst, worst_at, tokens_equal,
                           eos_equal, early)


# -- the target ``onnx`` of ``aiayn export`` (export.TARGETS) ---------------------------------------------------
# One target, three forms: the forward graph (--out), and for decoding (--generation --out-dir) the key/value-cache
# step (export.kv_cache, the default --cache) or the full-prefix step (--no-cache). They share the runtime that
# verifies them (onnxruntime), the extra that installs it, and the graph plumbing (export.common.export_graph).
def _add_options(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--out", default=None, help="output .onnx file (forward(src, tgt) -> scores)")
    parser.add_argument("--generation", action="store_true",
                        help="export graphs for decoding instead of forward (needs --out-dir): by default an encoder "
                             "computing the cross-attention keys/values and a decoder step with the key/value cache "
                             "as inputs and outputs")
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                        help="with --generation: the key/value-cache step (encoder_kv.onnx, decoder_step.onnx, "
                             "generation.json; default) or, with --no-cache, the full-prefix step (encoder.onnx, "
                             "decoder.onnx), which reruns the decoder over the whole prefix at every step")


def _usage(args: argparse.Namespace) -> str:
    if args.generation and not args.out_dir:
        return "--generation needs --out-dir DIR (it writes the encoder and decoder-step graphs)"
    if not args.generation and not args.out:
        return "--out PATH is required (or --generation --out-dir DIR)"
    return ""


def _missing() -> str:
    if installed("onnx", "onnxruntime", "onnxscript"):
        return ""
    return "the onnx extra is not installed (onnx, onnxruntime, onnxscript); pip install 'aiayn-conformance[onnx]'"


def _export_target(model: nn.Module, output: str, config: ModelConfig, args: argparse.Namespace,
            progress: Progress) -> str:
    if args.generation and args.cache:
        from .kv_cache import export_cached_generation

        twin = reference_for(model, config)
        if twin is not model:
            progress(f"{args.impl} is not the reference: the graphs hold the reference's computation with "
                     f"{args.impl}'s weights (canonical state), verified against {args.impl}'s own decoding")
        return export_cached_generation(twin, args.out_dir, config, progress=progress).describe()
    if args.generation:
        encoder, decoder = export_generation(model, args.out_dir, config, progress=progress)
        return f"{encoder} and {decoder}"
    return str(export_onnx(model, args.out, config, progress=progress))


def _verify_target(model: nn.Module, output: str, config: ModelConfig, args: argparse.Namespace,
            progress: Progress) -> Sequence[Check]:
    if args.generation and args.cache:
        from .kv_cache import verify_cached_generation

        progress("verifying greedy and beam decoding in onnxruntime against PyTorch ...")
        return verify_cached_generation(args.out_dir, model, config, output_kind=output)
    if args.generation:
        progress("verifying greedy decoding in onnxruntime against PyTorch ...")
        out = Path(args.out_dir)
        return [verify_generation(out / ENCODER_FILE, out / DECODER_FILE, model, config)]
    progress("verifying with onnxruntime on other shapes ...")
    return [verify(args.out, model, config)]


TARGET = Target(
    name="onnx",
    description="ONNX graphs verified in onnxruntime: forward(src, tgt) (--out), or the decoding graphs "
                "(--generation --out-dir, with the key/value cache or, --no-cache, the full prefix)",
    missing=_missing, export=_export_target, verify=_verify_target, add_options=_add_options, usage=_usage,
)

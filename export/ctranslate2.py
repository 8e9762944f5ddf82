"""Conversion of a conforming model to CTranslate2 (a ``TransformerSpec``), verified by greedy decoding.

CTranslate2's Transformer holds the paper's model exactly (post-norm, ReLU, scaled embeddings, no attention
biases); the position table is given as weights, because its built-in sinusoids concatenate the sin and cos
halves instead of interleaving them (§3.5). CTranslate2 works in token strings: ``CT2Decoder`` maps ids to
names (``t{i}``, ``<blank>``, ``<s>``, ``</s>``) and back, so callers stay in ids, and passes the §6.1
settings it can (per-source limits, ``min_decoding_length=0``, the padding token suppressed, the end token
returned). Greedy search is the verified form: CTranslate2's beam search departs from §6.1 in its length
penalty, early stop and length limits. docs/export.md has the mapping table and the departures with sources.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import greedy_search, output_limits
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import as_log_probs
from aiayn_conformance.spec.decoding import TRANSLATION, DecodeConfig

from .common import (
    NEVER,
    Check,
    DecodeCheck,
    ExportError,
    Progress,
    Target,
    example_sources,
    is_reference,
    pick_eos,
    reference_for,
    short_error,
)
from .decoders import torch_step_decoder

__all__ = ["available", "is_reference", "token_names", "transformer_spec", "export_ctranslate2", "CT2Decoder",
           "verify_ctranslate2", "METADATA_FILE", "TARGET"]

METADATA_FILE = "aiayn.json"
PAD, BOS, EOS = "<blank>", "<s>", "</s>"


def available() -> bool:
    """True when the ``ctranslate2`` package can be imported."""
    return importlib.util.find_spec("ctranslate2") is not None


def _require() -> Any:
    try:
        import ctranslate2
    except ImportError as exc:
        raise ExportError(f"the ctranslate2 package is not installed ({exc}); "
                          "pip install 'aiayn-conformance[ctranslate2]'") from exc
    return ctranslate2


def token_names(vocab: int, *, pad_id: int, decode: DecodeConfig = TRANSLATION) -> list[str]:
    """The string CTranslate2 sees for each token id: ``t{i}``, with the special symbols named."""
    names = [f"t{i}" for i in range(vocab)]
    names[pad_id] = PAD
    names[decode.bos_id] = BOS
    names[decode.eos_id] = EOS
    if len(set(names)) != vocab:
        raise ExportError(f"the padding, start and end ids must differ for CTranslate2 (pad {pad_id}, "
                          f"bos {decode.bos_id}, eos {decode.eos_id})")
    return names


def transformer_spec(state: Mapping[str, Tensor], config: ModelConfig, *, decode: DecodeConfig = TRANSLATION,
                     positions: int | None = None) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding the canonical ``state`` (``spec.parameter_schema`` names)."""
    _require()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    from aiayn_conformance.reference.model import sinusoid_table

    decode.check_for(config)
    if not config.paper_heads:
        raise ExportError(f"CTranslate2's Transformer divides d_model among its heads (d_k = d_v = d_model / h = "
                          f"{config.d_model / config.n_heads:g}); this model has "
                          f"d_k={config.d_k}, d_v={config.d_v} (the ONNX export takes it)")
    st = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in state.items()}
    missing = [k for k in ("src_embed.weight", "tgt_embed.weight", "generator.weight") if k not in st]
    if missing:
        raise ExportError(f"the canonical state lacks {', '.join(missing)}")

    def get(name: str) -> np.ndarray:
        if name not in st:
            raise ExportError(f"the canonical state has no {name} (spec.parameter_schema lists the names)")
        return st[name]

    def norm(spec: Any, name: str) -> None:
        spec.gamma, spec.beta = get(f"{name}.weight"), get(f"{name}.bias")

    def ffn(spec: Any, name: str, norm_name: str) -> None:
        spec.linear_0.weight, spec.linear_0.bias = get(f"{name}.w1.weight"), get(f"{name}.w1.bias")
        spec.linear_1.weight, spec.linear_1.bias = get(f"{name}.w2.weight"), get(f"{name}.w2.bias")
        norm(spec.layer_norm, norm_name)

    def fused(name: str, parts: str) -> np.ndarray:
        return np.concatenate([get(f"{name}.{p}.weight") for p in parts])  # [len(parts) * d_model, d_model]

    relu = common_spec.Activation.RELU
    encoder = ts.TransformerEncoderSpec(config.n_layers, config.n_heads, pre_norm=False, activation=relu)
    decoder = ts.TransformerDecoderSpec(config.n_layers, config.n_heads, pre_norm=False, activation=relu)
    table = sinusoid_table(positions or config.max_len + decode.extra_length, config.d_model).numpy()
    encoder.embeddings[0].weight = get("src_embed.weight")
    encoder.position_encodings.encodings = table
    decoder.embeddings.weight = get("tgt_embed.weight")
    decoder.position_encodings.encodings = table
    decoder.projection.weight = get("generator.weight")
    for i, layer in enumerate(encoder.layer):
        p = f"encoder.{i}"
        layer.self_attention.linear[0].weight = fused(f"{p}.self_attn", "qkv")
        layer.self_attention.linear[1].weight = get(f"{p}.self_attn.o.weight")
        norm(layer.self_attention.layer_norm, f"{p}.norm1")
        ffn(layer.ffn, f"{p}.ffn", f"{p}.norm2")
    for i, layer in enumerate(decoder.layer):
        p = f"decoder.{i}"
        layer.self_attention.linear[0].weight = fused(f"{p}.self_attn", "qkv")
        layer.self_attention.linear[1].weight = get(f"{p}.self_attn.o.weight")
        norm(layer.self_attention.layer_norm, f"{p}.norm1")
        layer.attention.linear[0].weight = get(f"{p}.cross_attn.q.weight")
        layer.attention.linear[1].weight = fused(f"{p}.cross_attn", "kv")
        layer.attention.linear[2].weight = get(f"{p}.cross_attn.o.weight")
        norm(layer.attention.layer_norm, f"{p}.norm2")
        ffn(layer.ffn, f"{p}.ffn", f"{p}.norm3")
    spec = ts.TransformerSpec(encoder, decoder)
    spec.register_source_vocabulary(token_names(config.src_vocab, pad_id=config.pad_id, decode=decode))
    spec.register_target_vocabulary(token_names(config.tgt_vocab, pad_id=config.pad_id, decode=decode))
    spec.config.layer_norm_epsilon = config.norm_eps
    spec.config.unk_token = PAD  # the model has no unknown token; CTranslate2 needs one in the vocabulary
    return spec


def export_ctranslate2(model: nn.Module, out_dir: str | Path, config: ModelConfig, *,
                       decode: DecodeConfig = TRANSLATION, quantization: str | None = None, seed: int = 0,
                       progress: Callable[[str], None] = lambda _: None) -> Path:
    """Convert ``model`` and write a CTranslate2 model folder (replaced if it exists); returns its path.

    ``model`` is a reference ``Transformer`` or an implementation with ``load_reference_state``
    (``export.reference_for``: a seeded reference's canonical state is loaded into it, and
    that state is converted). ``quantization`` is CTranslate2's (None keeps float32).
    """
    _require()
    twin = reference_for(model, config, seed=seed)
    positions = config.max_len + decode.extra_length
    progress(f"building a CTranslate2 TransformerSpec ({config.n_layers} layers, {positions} positions) ...")
    spec = transformer_spec(twin.state_dict(), config, decode=decode, positions=positions)
    out = Path(out_dir)
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        spec.save(str(out))
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    except Exception as exc:
        raise ExportError(f"CTranslate2 rejected the spec: {short_error(exc)}") from exc
    meta = {"pad_id": config.pad_id, "bos_id": decode.bos_id, "eos_id": decode.eos_id, "max_positions": positions,
            "max_source_length": config.max_len, "tgt_vocab": config.tgt_vocab, "src_vocab": config.src_vocab,
            "token_names": "t{id}, with pad <blank>, bos <s>, eos </s>"}
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out


class CT2Decoder:
    """A converted model in ``ctranslate2.Translator``, in token ids, with the §6.1 settings it can take."""

    def __init__(self, out_dir: str | Path, *, threads: int = 1, compute_type: str = "float32"):
        ctranslate2 = _require()
        out = Path(out_dir)
        try:
            meta = json.loads((out / METADATA_FILE).read_text())
            self.translator = ctranslate2.Translator(str(out), device="cpu", compute_type=compute_type,
                                                     inter_threads=1, intra_threads=threads)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ExportError(f"cannot load the CTranslate2 model in {out}: {short_error(exc)}") from exc
        self.pad_id, self.max_positions = meta["pad_id"], meta["max_positions"]
        decode = DecodeConfig(bos_id=meta["bos_id"], eos_id=meta["eos_id"])
        self.names = token_names(meta["src_vocab"], pad_id=self.pad_id, decode=decode)
        self.tgt_names = token_names(meta["tgt_vocab"], pad_id=self.pad_id, decode=decode)
        self.ids = {name: i for i, name in enumerate(self.tgt_names)}

    def search(self, src: Tensor, *, eos_id: int, beam_size: int = 1, length_penalty: float = 0.0,
               max_len: int | Tensor | None = None, extra_length: int = TRANSLATION.extra_length,
               return_logits: bool = False) -> tuple[Tensor, list[list[np.ndarray]] | None]:
        """Decode ``src`` [B, S] (right-padded): output tokens [B, L] as ``reference.decoding`` returns them
        (end symbol included, right-padded), and with ``return_logits`` each source's per-step logits.

        ``eos_id`` = -1 never ends (the padding token, suppressed, is made the end token); the limit is
        each source's real length + ``extra_length`` unless ``max_len`` gives it.
        """
        limits = output_limits(src, self.pad_id, max_len=max_len, extra_length=extra_length)
        if int(limits.max()) > self.max_positions:
            raise ExportError(f"a limit of {int(limits.max())} tokens exceeds the model's {self.max_positions} "
                              "positions")
        rows = [[self.names[t] for t in row if t != self.pad_id] for row in src.tolist()]
        end = PAD if eos_id == NEVER else self.tgt_names[eos_id]
        out: list[list[int]] = [[] for _ in rows]
        logits: list[list[np.ndarray]] = [[] for _ in rows]
        for limit in sorted(set(limits.tolist())):
            index = [b for b, n in enumerate(limits.tolist()) if n == limit]
            if limit <= 0:
                continue
            results = self.translator.translate_batch(
                [rows[b] for b in index], beam_size=beam_size, length_penalty=length_penalty,
                max_decoding_length=limit, min_decoding_length=0, end_token=end, return_end_token=True,
                suppress_sequences=[[PAD]], return_scores=False, return_logits_vocab=return_logits,
                max_input_length=0)
            for b, result in zip(index, results):
                out[b] = [self.ids[t] for t in result.hypotheses[0]]
                if return_logits:
                    logits[b] = [np.asarray(x) for x in result.logits[0]]
        width = max((len(r) for r in out), default=0)
        tokens = torch.full((len(out), width), self.pad_id, dtype=torch.long)
        for b, r in enumerate(out):
            tokens[b, :len(r)] = torch.tensor(r, dtype=torch.long)
        return tokens, logits if return_logits else None


def _teacher_forced(decoder: Any, kind: str, src: Tensor, tokens: Tensor, bos_id: int) -> Tensor:
    """PyTorch's next-token log-probabilities (B, L, V) along ``tokens`` (B, L), fed after ``bos_id``."""
    state = decoder.begin_decoding(src)
    feed = torch.full((src.size(0),), bos_id, dtype=torch.long)
    out = []
    for t in range(tokens.size(1)):
        scores, state = decoder.decode_step(state, feed)
        out.append(as_log_probs(scores, kind, dtype=torch.float32, renormalize=True))
        feed = tokens[:, t]
    return torch.stack(out, dim=1) if out else torch.zeros(src.size(0), 0, 0)


def _without_pad(logp: Tensor, pad_id: int) -> Tensor:
    """Log-probabilities renormalized over every token but the padding (CTranslate2 suppresses it)."""
    logp = logp.double().clone()
    logp[..., pad_id] = float("-inf")
    return torch.log_softmax(logp, dim=-1)


def verify_ctranslate2(out_dir: str | Path, model: nn.Module, config: ModelConfig, *, output_kind: str = "logits",
                       decode: DecodeConfig = TRANSLATION, sources: int = 3, src_len: int = 8, seed: int = 0,
                       atol: float = 1e-4, threads: int = 1) -> list[DecodeCheck]:
    """Greedy decoding in CTranslate2 against ``reference.decoding.greedy_search`` on ``model``.

    On ``sources`` right-padded sources with the §6.1 limit: once with no end symbol (to the
    limit), once with an end symbol the model emits. Tokens must be equal; at every step the
    next-token log-probabilities of CTranslate2 (its logits, padding suppressed) and of PyTorch
    teacher-forced on CTranslate2's tokens (both renormalized without the padding token) must agree
    within ``atol``.
    """
    model = model.eval()
    ct2 = CT2Decoder(out_dir, threads=threads)
    torch_decoder = torch_step_decoder(model, output_kind)
    src, lengths = example_sources(config, sources, src_len, seed=seed)
    limit = f"limit = source length + {decode.extra_length}"
    checks = []
    eos = NEVER
    for setting in (f"{sources} sources of lengths {lengths}, no EOS, {limit}", "same sources, EOS = {eos}, " + limit):
        try:
            with torch.inference_mode():
                expected = greedy_search(torch_decoder, src, bos_id=decode.bos_id, eos_id=eos, pad_id=config.pad_id,
                                         extra_length=decode.extra_length)
        except Exception as exc:
            raise ExportError(f"PyTorch decoding with {type(model).__name__} failed: {short_error(exc)}") from exc
        try:
            got, logits = ct2.search(src, eos_id=eos, extra_length=decode.extra_length, return_logits=True)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"CTranslate2 failed while decoding: {short_error(exc)}") from exc
        assert logits is not None
        equal = got.tolist() == expected.tokens.tolist()
        with torch.inference_mode():
            ours = _without_pad(_teacher_forced(torch_decoder, output_kind, src, got, decode.bos_id), config.pad_id)
        worst, worst_at = 0.0, (0, 0)
        for b, steps in enumerate(logits):
            for t, row in enumerate(steps):
                theirs = _without_pad(torch.from_numpy(np.array(row, dtype=np.float64)).reshape(-1), config.pad_id)
                diff = (theirs - ours[b, t]).abs().nan_to_num(0.0)  # -inf - -inf at the padding: no difference
                diff[torch.isinf(theirs) != torch.isinf(ours[b, t])] = float("inf")
                if diff.max().item() > worst:
                    worst, worst_at = diff.max().item(), (b, t)
        outcome = ("every source ran to its limit" if eos == NEVER else
                   "outputs of lengths " + ", ".join(str(int(n)) if bool((r == eos).any()) else "-"
                                                    for n, r in zip(expected.lengths, expected.tokens))
                   + " ('-' = no EOS within the limit)")
        checks.append(DecodeCheck("greedy search", setting.format(eos=eos), equal and worst <= atol, equal, worst,
                                  worst_at, got.size(1), sources, outcome, runtime="CTranslate2"))
        if eos == NEVER:
            eos = pick_eos(expected.tokens, config.pad_id)
    return checks


# -- the target ``ctranslate2`` of ``aiayn export`` (export.TARGETS) --------------------------------------------
def _usage(args: argparse.Namespace) -> str:
    return "" if args.out_dir else "--format ctranslate2 needs --out-dir DIR (it writes a CTranslate2 model folder)"


def _missing() -> str:
    if available():
        return ""
    return "the ctranslate2 package is not installed; pip install 'aiayn-conformance[ctranslate2]'"


def _export_target(model: nn.Module, output: str, config: ModelConfig, args: argparse.Namespace,
                   progress: Progress) -> str:
    if not is_reference(model):
        progress(f"{args.impl} is not the reference: its canonical state is converted (load_reference_state), "
                 f"verified against {args.impl}'s own decoding")
    return str(export_ctranslate2(model, args.out_dir, config, progress=progress))


def _verify_target(model: nn.Module, output: str, config: ModelConfig, args: argparse.Namespace,
                   progress: Progress) -> Sequence[Check]:
    progress("verifying greedy decoding in CTranslate2 against PyTorch ...")
    return verify_ctranslate2(args.out_dir, model, config, output_kind=output)


TARGET = Target(
    name="ctranslate2",
    description="a CTranslate2 TransformerSpec model folder (--out-dir), verified by greedy decoding in CTranslate2",
    missing=_missing, export=_export_target, verify=_verify_target, usage=_usage,
)

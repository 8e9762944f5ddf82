"""Built-in plugins ``sockeye`` and ``sockeye-defaults``: Sockeye's Transformer, built by its own model code.

Source: the installed ``sockeye`` package; the reasons below cite ``sockeye 3.1.34`` (``WRITTEN_FOR``) as
``sockeye/<file>.py:N`` (a line of that file in that release, under ``site-packages``).
tests/test_toolkit_sockeye.py checks every cited line against the installed file.

Construction, as ``sockeye-train`` does it: the options are parsed by Sockeye's own parser (its
``arguments.add_model_parameters``, ``add_training_args`` and ``add_device_args``; every option not named keeps
the parser's default), ``sockeye.train.create_model_config`` turns them into a ``sockeye.model.ModelConfig`` (its
encoder, decoder and embedding configs), ``sockeye.model.SockeyeModel`` builds the model and
``sockeye.model.initialize_parameters`` initialises it, as ``sockeye.train.train`` does. The data statistics a
ModelConfig carries come from the training data; a model built without data gets placeholders (the maximum
lengths ``max_len + 1``, the room Sockeye keeps for </s>, and a length ratio of 1.0 +- 0). ``OPTIONS`` of each
registration: ``paper_options`` and ``default_options``.

Token ids: Sockeye's specials are fixed ids (``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3) that its search and
its loss use as constants; the model itself reads lengths, not ids. The adapter keeps the audit's ids in the model
and relabels where Sockeye's constants matter: ``generate`` runs the search on a copy of the model whose vocabulary
rows are permuted so that the audit's padding, start and end symbols are Sockeye's (``sockeye_ids``), and maps the
output back; the criterion sees the padding id as Sockeye's 0.

The calling convention, as Sockeye's batches call the model: a trailing factor axis (``[B, L, 1]``), source lengths
``[B, 2]`` (the real length, and 0 prepended tokens) counted from the padding as ``data_io`` counts them, then
``SockeyeModel.forward(source, source_length, target, target_length)`` returns its logits.

Sockeye keeps the key/value projection weights of every attention in two layouts: separate (keys then values) in
training, interleaved per head in inference, rewritten in place by each ``train()``/``eval()``
(``layers.MultiHeadSelfAttention.train``); it saves the interleaved one. The adapter's state dict is always the
saved (interleaved) layout, and loading one restores the layout of the current mode, as
``SockeyeModel.load_parameters`` does.

Decoding is the toolkit's: the step methods run ``_DecodeStep``'s three lines (target embedding, the decoder with
its own autoregressive key/value states, the output layer) on the decoder's state list; ``generate`` builds
``sockeye.inference.Translator`` (its ``BeamSearch``, also for a beam of 1, as ``sockeye-translate -b 1`` does, its
``CandidateScorer`` and its output-length rule) on an inference-only copy of the model, as ``sockeye-translate``
loads one. The recipe is the toolkit's: ``optimizers.get_optimizer``, ``lr_scheduler.get_lr_scheduler`` stepped as
its trainer steps it, ``train.create_losses``' ``CrossEntropyLoss``, and the target shift of its batches.

``read_checkpoint`` reads a model directory as ``sockeye-train`` writes it (``params.best`` or a ``params.NNNNN``
file, with ``config``, ``vocab.src.0.json`` and ``vocab.trg.0.json`` beside it): the sizes and every model option
from its ``config`` (the ModelConfig it was trained with), the recipe from its ``args.yaml``; it decodes with the
``sockeye`` registration's translation options.
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical
from aiayn_conformance.spec.training import TrainConfig

from ..availability import unavailable_reason
from ..declarations import Checkpoint, Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited

__all__ = ["SockeyeAdapter", "build", "build_paper", "build_defaults", "read_checkpoint", "DEVIATIONS", "NOTES",
           "CITED", "LINES", "SOURCE", "WRITTEN_FOR", "INSTALL", "sockeye_unavailable", "paper_options",
           "default_options", "sockeye_ids"]

WRITTEN_FOR = "sockeye 3.1.34"
# sockeye's own requirements pin nothing that replaces torch, but --no-deps keeps pip from touching it; numpy and
# pyyaml are imported by its model code (sockeye/config.py, sockeye/utils.py), sacrebleu by its trainer's
# checkpoint decoder (sockeye/evaluate.py), which sockeye.train imports.
INSTALL = "pip install --no-deps sockeye==3.1.34 && pip install numpy pyyaml sacrebleu"
PAD, UNK, BOS, EOS = 0, 1, 2, 3  # sockeye.constants: VOCAB_SYMBOLS = [<pad>, <unk>, <s>, </s>]


def sockeye_unavailable() -> str:
    """"" when sockeye 3.1.x is installed; otherwise one line with the install command."""
    return unavailable_reason("sockeye", "sockeye", at_least="3.1", below="3.2", install=INSTALL)


def sockeye_ids(size: int, pad_id: int, bos_id: int | None = None, eos_id: int | None = None) -> Tensor:
    """The audit's id -> Sockeye's: the audit's padding (and the start and end symbols, when given) go to Sockeye's
    <pad> 0 (<s> 2, </s> 3); every other id keeps its order over the ids left."""
    wanted = {pad_id: PAD}
    if bos_id is not None:
        wanted[bos_id] = BOS
    if eos_id is not None:
        wanted[eos_id] = EOS
    ids = torch.empty(size, dtype=torch.long)
    ids[list(wanted)] = torch.tensor(list(wanted.values()))
    rest = [i for i in range(size) if i not in wanted]
    ids[rest] = torch.tensor([j for j in range(size) if j not in wanted.values()][:len(rest)])
    return ids


# -- the options of each registration ---------------------------------------------------------------------------
def _pair(value: object) -> str:
    return f"{value}:{value}"


def _sizes(config: ModelConfig) -> list[str]:
    """The options every registration takes from the ModelConfig: the sizes and P_drop."""
    return ["--encoder", "transformer", "--decoder", "transformer", "--num-layers", _pair(config.n_layers),
            "--transformer-model-size", _pair(config.d_model), "--transformer-attention-heads", _pair(config.n_heads),
            "--transformer-feed-forward-num-hidden", _pair(config.d_ff),
            "--transformer-dropout-prepost", _pair(config.dropout)]


def paper_options(config: ModelConfig, train: TrainConfig | None = None) -> list[str]:
    """The options nearest the paper: post-norm (no preprocessing, dropout-residual-norm after each sub-layer), no
    attention or activation dropout, ReLU, fixed sinusoids, three-way tying when the configuration ties, Adam (0.9,
    0.98, 1e-9), Eq. (3) as inv-sqrt-decay with base rate d_model^-0.5, label smoothing 0.1."""
    tc = train or TrainConfig()
    tying = "src_trg_softmax" if config.share_embeddings else "none"
    return [*_sizes(config), "--transformer-preprocess", ":", "--transformer-postprocess", "drn:drn",
            "--transformer-dropout-attention", "0:0", "--transformer-dropout-act", "0:0",
            "--transformer-activation-type", "relu:relu", "--transformer-positional-embedding-type", "fixed",
            "--embed-dropout", "0:0", "--weight-tying-type", tying,
            "--optimizer", "adam", "--optimizer-betas", f"{tc.beta1}:{tc.beta2}", "--optimizer-eps", str(tc.adam_eps),
            "--weight-decay", str(tc.weight_decay),
            "--initial-learning-rate", repr(config.d_model ** -0.5), "--learning-rate-scheduler-type",
            "inv-sqrt-decay", "--learning-rate-warmup", str(tc.warmup_steps),
            "--label-smoothing", str(tc.label_smoothing), "--gradient-clipping-type", "none"]


def default_options(config: ModelConfig, train: TrainConfig | None = None) -> list[str]:
    """The parser's defaults: only the architecture, its sizes and P_drop (the sub-layer dropout) are given. Sockeye's
    default ties source, target and output embeddings over one joint vocabulary; a configuration with two vocabulary
    sizes cannot have one, so it gets trg_softmax (the one tying Sockeye allows with two vocabularies)."""
    tying = [] if config.src_vocab == config.tgt_vocab else ["--weight-tying-type", "trg_softmax"]
    return [*_sizes(config), *tying]


PAPER_TRANSLATE = ("--length-penalty-beta", "5")  # ((5 + |Y|) / 6) ** alpha (sockeye/beam_search.py LengthPenalty)


def parse_train_options(args: Sequence[str]) -> argparse.Namespace:
    """``args`` parsed by Sockeye's training parser (the model, training and device groups of ``sockeye-train``;
    the data options are left out: nothing is read)."""
    from sockeye import arguments

    parser = arguments.ConfigArgumentParser(description="sockeye-train")
    arguments.add_model_parameters(parser)
    arguments.add_training_args(parser)
    arguments.add_device_args(parser)
    opt, unknown = parser.parse_known_args(list(args))
    if unknown:
        raise ValueError(f"Sockeye's training parser does not know {' '.join(unknown)}")
    return opt


def parse_translate_options(args: Sequence[str]) -> argparse.Namespace:
    """``args`` parsed by Sockeye's translation parser (``sockeye-translate``'s inference group)."""
    from sockeye import arguments

    parser = arguments.ConfigArgumentParser(description="sockeye-translate")
    arguments.add_inference_args(parser)
    opt, unknown = parser.parse_known_args(["--models", "unused", *args])
    if unknown:
        raise ValueError(f"Sockeye's translation parser does not know {' '.join(unknown)}")
    return opt


def model_config(config: ModelConfig, opt: argparse.Namespace) -> Any:
    """``sockeye.train.create_model_config`` for ``opt`` at the config's vocabulary sizes, with the data statistics
    a model without data gets (maximum lengths max_len + 1, length ratio 1.0 +- 0)."""
    from sockeye import data_io
    from sockeye import train as sockeye_train

    longest = config.max_len + 1  # sockeye.train adds C.SPACE_FOR_XOS to --max-seq-len
    stats = data_io.DataStatistics(num_sents=0, num_discarded=0, num_tokens_source=0, num_tokens_target=0,
                                   num_unks_source=0, num_unks_target=0, max_observed_len_source=longest,
                                   max_observed_len_target=longest, size_vocab_source=config.src_vocab,
                                   size_vocab_target=config.tgt_vocab, length_ratio_mean=1.0, length_ratio_std=0.0,
                                   buckets=[], num_sents_per_bucket=[], average_len_target_per_bucket=[])
    data = data_io.DataConfig(data_statistics=stats, max_seq_len_source=longest, max_seq_len_target=longest,
                              num_source_factors=1, num_target_factors=1)
    return sockeye_train.create_model_config(opt, [config.src_vocab], [config.tgt_vocab], longest, longest, data)


# -- the key/value layouts ----------------------------------------------------------------------------------------
def _attentions(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from sockeye import layers

    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, (layers.MultiHeadSelfAttention, layers.MultiHeadAttention))]


def _interleaved(module: nn.Module, weight: Tensor) -> Tensor:
    """A copy of ``weight`` (ff_in or ff_kv, keys then values) in the interleaved layout ``interleave_kv`` writes:
    per head, its key rows then its value rows."""
    depth, heads = int(getattr(module, "depth")), int(getattr(module, "heads"))  # noqa: B009 (a Module's attributes)
    kv = weight[-2 * depth:]
    k, v = kv[:depth].reshape(heads, -1, weight.size(1)), kv[depth:].reshape(heads, -1, weight.size(1))
    return torch.cat([weight[:-2 * depth], torch.cat([k, v], dim=1).reshape(2 * depth, weight.size(1))])


def _kv_name(module: nn.Module) -> str:
    return "ff_in" if hasattr(module, "ff_in") else "ff_kv"


# -- the adapter ------------------------------------------------------------------------------------------------
@dataclass
class SockeyeState:
    """Between decoding steps: the decoder's state list (``state_structure``: step, encoder output, source mask,
    then each layer's autoregressive keys and values)."""

    states: list[Tensor]


class SockeyeAdapter(nn.Module):
    """A ``sockeye.model.SockeyeModel`` behind the adapter contract; returns logits."""

    _options_fn: Callable[..., list[str]] | None = None  # a registration's option function, for the recipe

    def __init__(self, config: ModelConfig, options: Callable[..., list[str]] | argparse.Namespace,
                 translate_options: Sequence[str] = (), sockeye_config: Any = None):
        super().__init__()
        from sockeye.model import SockeyeModel, initialize_parameters

        self.config = config
        self.opt = options if isinstance(options, argparse.Namespace) else parse_train_options(options(config))
        self.translate_options = list(translate_options)
        self.sockeye_config = sockeye_config if sockeye_config is not None else model_config(config, self.opt)
        self.model = SockeyeModel(self.sockeye_config)
        self.model.apply(initialize_parameters)
        self.model.register_state_dict_post_hook(_saved_layout)
        self.model.register_load_state_dict_pre_hook(_before_loading)
        self.model.register_load_state_dict_post_hook(_after_loading)

    # -- the calling convention ------------------------------------------------------------------------------
    def _lengths(self, src: Tensor) -> Tensor:
        """(B, 2): the real source lengths (counted from the padding, as data_io counts them) and 0 prepended."""
        real = (src != self.config.pad_id).sum(dim=1)
        return torch.stack([real, torch.zeros_like(real)], dim=1)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab)."""
        from sockeye import constants

        out = self.model(src[:, :, None], self._lengths(src), tgt[:, :, None],
                         (tgt != self.config.pad_id).sum(dim=1))
        return out[constants.LOGITS_NAME]

    def encode(self, src: Tensor) -> Tensor:
        """The encoder's output (after its final process block): (B, S, d_model)."""
        memory, _, _ = self.model.encoder(self.model.embedding_source(src[:, :, None]), self._lengths(src))
        return memory

    def positional_encoding(self, length: int) -> Tensor:
        """The encoder's ``PositionalEmbeddings`` table (max_len + 1 rows); zeros without one."""
        pos = self.model.encoder.pos_embedding
        if pos.weight_type != "fixed":
            raise ValueError(f"the positional embeddings are {pos.weight_type!r}, not a fixed table")
        if length > pos.weight.size(0):
            raise ValueError(f"the table holds {pos.weight.size(0)} positions; {length} requested")
        return pos.weight[:length].detach().clone()

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical state: each ``normK`` at the K-th sub-layer's norm (in its post-process block when the
        layers are post-norm, in its pre-process block when pre-norm), the stacks' final norms (when built) neutral,
        the output layer's bias 0; q, k, v into the fused projections in the training (separate) layout."""
        from sockeye import layers

        model = self.model
        training = model.training
        model.apply(layers.separate_kv)
        params = dict(model.named_parameters())
        used: set[str] = set()
        mapping: dict[CanonicalKey, Target] = {}
        prenorm = "n" in self.sockeye_config.config_encoder.preprocess_sequence

        def put(canonical: CanonicalKey, name: str) -> None:
            mapping[canonical] = params[name]
            used.add(name)

        put("src_embed.weight", "embedding_source.embedding.weight")
        mapping["tgt_embed.weight"] = model.embedding_target.embedding.weight
        mapping["generator.weight"] = model.output_layer.weight
        used |= {"embedding_target.embedding.weight", "output_layer.weight"}
        block = "pre" if prenorm else "post"
        for i in range(self.config.n_layers):
            enc, dec = f"encoder.layers.{i}", f"decoder.layers.{i}"
            put(tuple(f"encoder.{i}.self_attn.{x}.weight" for x in "qkv"), f"{enc}.self_attention.ff_in.weight")
            put(f"encoder.{i}.self_attn.o.weight", f"{enc}.self_attention.ff_out.weight")
            put(tuple(f"decoder.{i}.self_attn.{x}.weight" for x in "qkv"), f"{dec}.autoregr_layer.ff_in.weight")
            put(f"decoder.{i}.self_attn.o.weight", f"{dec}.autoregr_layer.ff_out.weight")
            put(f"decoder.{i}.cross_attn.q.weight", f"{dec}.enc_attention.ff_q.weight")
            put(tuple(f"decoder.{i}.cross_attn.{x}.weight" for x in "kv"), f"{dec}.enc_attention.ff_kv.weight")
            put(f"decoder.{i}.cross_attn.o.weight", f"{dec}.enc_attention.ff_out.weight")
            norms = {"encoder": (enc, ("self_attention", "ff")),
                     "decoder": (dec, ("autoregr_layer", "enc_attention", "ff"))}
            for stack, (theirs, subs) in norms.items():
                for p in ("weight", "bias"):
                    put(f"{stack}.{i}.ffn.w1.{p}", f"{theirs}.ff.ff1.{p}")
                    put(f"{stack}.{i}.ffn.w2.{p}", f"{theirs}.ff.ff2.{p}")
                    for k, sub in enumerate(subs, start=1):
                        put(f"{stack}.{i}.norm{k}.{p}", f"{theirs}.{block}_{sub}.layer_norm.{p}")
        taken = {id(t) for t in mapping.values() if isinstance(t, Tensor)}
        rest = {n: p for n, p in params.items() if n not in used and p.requires_grad and id(p) not in taken}
        one = [p for n, p in rest.items() if n.endswith("layer_norm.weight")]
        zero = [p for n, p in rest.items() if n.endswith(("layer_norm.bias", "output_layer.bias"))]
        left = sorted(set(rest) - {n for n, p in rest.items() if any(p is q for q in one + zero)})
        if left:
            raise ValueError(f"the canonical schema has no place for {', '.join(left)}")
        with torch.no_grad():
            load_canonical(state, mapping, zero=zero, one=one)
        if not training:
            model.apply(layers.interleave_kv)

    # -- decoding: the decoder's own step and states ------------------------------------------------------------
    def begin_decoding(self, src: Tensor) -> SockeyeState:
        """Encode and ``decoder.init_state_from_encoder`` (the step counter, the encoder output, the source mask and
        empty autoregressive states), as ``SockeyeModel.encode_and_initialize`` does."""
        lengths = self._lengths(src)
        memory = self.encode(src)
        return SockeyeState(list(self.model.decoder.init_state_from_encoder(memory, lengths)))

    def decode_step(self, state: SockeyeState, tokens: Tensor) -> tuple[Tensor, SockeyeState]:
        """One token per row (N,) -> logits (N, tgt_vocab): ``_DecodeStep.forward``'s embedding, decoder and output
        layer, the decoder appending this step's keys and values to its states."""
        embedded = self.model.embedding_target(tokens[:, None, None])
        out, states = self.model.decoder(embedded, state.states)
        return self.model.output_layer(out.squeeze(1), None), SockeyeState(list(states))

    def reorder_state(self, state: SockeyeState, indices: Tensor) -> SockeyeState:
        """Row i continues row ``indices[i]``: every state along its batch axis (axis 0 for the step counter and the
        mask, 1 for the time-major encoder output and layer states: ``beam_search.RepeatStates``)."""
        from sockeye import constants

        structure = self.model.decoder.state_structure()
        first = (constants.STEP_STATE, constants.MASK_STATE)
        out = [s.index_select(0 if kind in first else 1, indices) for s, kind in zip(state.states, structure)]
        return SockeyeState(out)

    def translator(self, *, beam_size: int, alpha: float, max_len: int | None, bos_id: int, eos_id: int,
                   batch_size: int) -> tuple[Any, Tensor]:
        """A ``sockeye.inference.Translator`` as ``sockeye-translate`` builds one from its options, on an
        inference-only copy of the model whose vocabulary rows are relabelled to Sockeye's specials; and the
        relabelling (audit id -> Sockeye id)."""
        from sockeye import inference
        from sockeye.beam_search import CandidateScorer
        from sockeye.model import SockeyeModel

        # --max-output-length counts the words before </s> (inference.get_max_input_output_length adds
        # C.SPACE_FOR_XOS for it): the contract's max_len counts the end symbol too
        limits = [] if max_len is None else ["--max-output-length", str(max(max_len - 1, 0))]
        opt = parse_translate_options(["--beam-size", str(beam_size), "--length-penalty-alpha", str(alpha),
                                       "--batch-size", str(batch_size), *self.translate_options, *limits])
        twin = SockeyeModel(self.sockeye_config, inference_only=True)
        twin.eval()
        ids = sockeye_ids(self.config.tgt_vocab, self.config.pad_id, bos_id, eos_id)
        src_ids = sockeye_ids(self.config.src_vocab, self.config.pad_id, bos_id, eos_id)
        state = self.model.state_dict()
        rows = {"embedding_target.embedding.weight": ids, "output_layer.weight": ids, "output_layer.bias": ids,
                "embedding_source.embedding.weight": src_ids}
        moved = {}
        for name, order in rows.items():
            value = state[name]
            moved[name] = torch.empty_like(value).index_copy_(0, order.to(value.device), value)
        if self.sockeye_config.weight_tying_type == "src_trg_softmax":
            moved["embedding_source.embedding.weight"] = moved["embedding_target.embedding.weight"]
        twin.load_state_dict({**state, **moved}, strict=True)
        twin.to(next(self.model.parameters()).device)
        vocab = {f"w{i}": i for i in range(max(self.config.src_vocab, self.config.tgt_vocab))}
        scorer = CandidateScorer(opt.length_penalty_alpha, opt.length_penalty_beta, 0.0)
        translator = inference.Translator(
            device=next(self.model.parameters()).device, ensemble_mode=opt.ensemble_mode, scorer=scorer,
            batch_size=opt.batch_size, beam_search_stop=opt.beam_search_stop, models=[twin], source_vocabs=[vocab],
            target_vocabs=[vocab], beam_size=opt.beam_size, nbest_size=opt.nbest_size,
            max_output_length_num_stds=opt.max_output_length_num_stds, max_output_length=opt.max_output_length,
            greedy=opt.greedy)
        return translator, ids

    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                 max_len: int | None = None) -> Tensor:
        """``Translator._translate_np`` (its BeamSearch, also for a beam of 1) on ``src`` with the limit its
        ``_get_inference_input`` computes per source; each output cut after its first stop symbol (</s> or <pad>,
        ``Translator.stop_ids``), right-padded, in the audit's ids."""
        translator, ids = self.translator(beam_size=beam_size, alpha=alpha, max_len=max_len, bos_id=bos_id,
                                          eos_id=eos_id, batch_size=src.size(0))
        src_ids = sockeye_ids(self.config.src_vocab, self.config.pad_id, bos_id, eos_id).to(src.device)
        lengths = self._lengths(src)
        width = max(1, int(lengths[:, 0].max())) if src.size(0) else 1
        source = src_ids[src[:, :width]][:, :, None].int()
        limits = torch.tensor([translator._get_max_output_length(int(n)) for n in lengths[:, 0]],
                              dtype=torch.int32, device=src.device)
        with torch.no_grad(), warnings.catch_warnings():
            # Sockeye traces its encoder and decode step on first use (model.encode, model.decode_step); torch warns
            # that a traced list output must keep its structure, which Sockeye's states do
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            results = translator._translate_np(source, lengths.int(), None, limits)
        back = ids.argsort()  # Sockeye id -> the audit's
        rows = []
        for result in results:
            row = []
            for token in result.target_ids:
                word = int(token[0]) if isinstance(token, (list, tuple)) else int(token)
                if word == PAD:
                    break
                row.append(int(back[word]))
                if word == EOS:
                    break
            rows.append(row)
        out = torch.full((len(rows), max([len(r) for r in rows] + [1])), self.config.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        return out.to(src.device)

    # -- the recipe: the toolkit's optimizer, scheduler, loss and batches ------------------------------------------
    def _recipe_options(self, train_config: TrainConfig | None) -> argparse.Namespace:
        if train_config is None or self._options_fn is None:
            return self.opt
        cache = self.__dict__.setdefault("_parsed", {})
        if train_config not in cache:
            cache[train_config] = parse_train_options(self._options_fn(self.config, train_config))
        return cache[train_config]

    def make_optimizer(self, params: Iterable[nn.Parameter], train_config: TrainConfig | None = None
                       ) -> torch.optim.Optimizer:
        """``optimizers.get_optimizer(create_optimizer_config(args))``'s class and arguments over ``params``, as
        ``sockeye.train.train`` creates its optimizer."""
        from sockeye import optimizers
        from sockeye import train as sockeye_train

        config = sockeye_train.create_optimizer_config(self._recipe_options(train_config))
        config.running_on_gpu = False  # Apex's fused optimizers are not audited (not installed beside torch here)
        cls, kwargs, _ = optimizers.get_optimizer(config)
        return cls(list(params), **kwargs)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig | None = None) -> Any:
        """``lr_scheduler.get_lr_scheduler``'s scheduler on ``optimizer``, stepped as the trainer steps it: before
        each update (sockeye/training.py), so the rate read before update k is its rate at step k."""
        from sockeye import lr_scheduler

        opt = self._recipe_options(train_config)
        cls, kwargs = lr_scheduler.get_lr_scheduler(opt.learning_rate_scheduler_type, opt.initial_learning_rate,
                                                    opt.learning_rate_reduce_factor,
                                                    opt.learning_rate_reduce_num_not_improved,
                                                    opt.learning_rate_warmup, opt.max_updates)
        return TrainerSteps(cls(optimizer, **kwargs) if cls is not None else None)

    def make_criterion(self, train_config: TrainConfig | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """``train.create_losses``' cross-entropy (label smoothing as its default 'mxnet' implementation spreads it;
        the mean over the real target tokens), its padding id being Sockeye's 0."""
        from sockeye import constants
        from sockeye import train as sockeye_train

        opt = self._recipe_options(train_config)
        loss = sockeye_train.create_losses(opt, [self.config.tgt_vocab])[0]
        ids = sockeye_ids(self.config.tgt_vocab, self.config.pad_id)

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:
            order = ids.to(scores.device)
            value, _ = loss({constants.LOGITS_NAME: scores.index_select(-1, order.argsort())},
                            {constants.TARGET_LABEL_NAME: order[labels]})
            return value

        return criterion

    def make_batch(self, target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        """Sockeye's parallel batches: the decoder reads ``<s> target[:-1]`` and the labels are ``target``
        (data_io's time-shifted label)."""
        tgt = torch.cat([torch.full_like(target[:, :1], bos_id), target], dim=1)
        return tgt[:, :-1], tgt[:, 1:]


def _saved_layout(module: nn.Module, state: dict[str, Tensor], prefix: str, local_metadata: Any) -> None:
    """state_dict hook: every key/value projection in the layout Sockeye saves (interleaved), whatever the mode."""
    for name, att in _attentions(module):
        if not att.kv_interleaved:
            key = f"{prefix}{name}.{_kv_name(att)}.weight"
            state[key] = _interleaved(att, state[key].detach())


def _before_loading(module: nn.Module, state: Any, prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: the incoming weights are in the saved (interleaved) layout; so is the model now."""
    from sockeye import layers

    module.apply(layers.interleave_kv)


def _after_loading(module: nn.Module, incompatible: Any) -> None:
    """load_state_dict post-hook: back to the training layout in training mode (``load_parameters`` does this)."""
    from sockeye import layers

    if module.training:
        module.apply(layers.separate_kv)


class TrainerSteps:
    """Sockeye's trainer around its scheduler: ``lr_scheduler.step()`` before each ``optimizer.step()``
    (sockeye/training.py), so the first step is taken here, before update 1, and each ``step()`` (after an update)
    sets the rate of the next one; no scheduler: the initial rate throughout."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        if scheduler is not None:
            scheduler.step()

    def step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()


class _Registration(SockeyeAdapter):
    """An adapter built from one registration's option function (kept for the recipe's TrainConfig)."""

    def __init__(self, config: ModelConfig, options: Callable[..., list[str]], translate_options: Sequence[str]):
        super().__init__(config, options, translate_options)
        self._options_fn = options


def build_paper(config: ModelConfig) -> SockeyeAdapter:
    return _Registration(config, paper_options, PAPER_TRANSLATE)


def build_defaults(config: ModelConfig) -> SockeyeAdapter:
    return _Registration(config, default_options, ())


# -- checkpoints as sockeye-train saves them --------------------------------------------------------------------
ACCEPTED = ("accepted: a params.best or params.NNNNN file saved by sockeye-train 3.x, in its model directory with "
            "the config, vocab.src.0.json and vocab.trg.0.json it writes there (or that directory)")


def read_checkpoint(path: str) -> Checkpoint:
    """A Sockeye model directory (or a params file in one): its ModelConfig, vocabularies and parameters."""
    given = Path(path)
    folder = given if given.is_dir() else given.resolve().parent
    params = folder / "params.best" if given.is_dir() else given
    try:
        saved = torch.load(str(params), map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise ValueError(f"not a Sockeye checkpoint (torch.load failed: {type(exc).__name__}: {text}); "
                         f"{ACCEPTED}") from None
    if not isinstance(saved, dict) or "output_layer.bias" not in saved:
        found = f"a dict with keys {sorted(saved)[:6]}" if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"not a Sockeye checkpoint (found {found}); {ACCEPTED}")
    missing = [n for n in ("config", "vocab.src.0.json", "vocab.trg.0.json") if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"a Sockeye checkpoint without {', '.join(missing)} beside it in {folder}; {ACCEPTED}")
    from sockeye.model import SockeyeModel

    cfg = SockeyeModel.load_config(str(folder / "config"))
    src_vocab = json.loads((folder / "vocab.src.0.json").read_text())
    trg_vocab = json.loads((folder / "vocab.trg.0.json").read_text())
    enc, dec = cfg.config_encoder, cfg.config_decoder
    if enc.num_layers != dec.num_layers:
        raise ValueError(f"a Sockeye checkpoint with {enc.num_layers} encoder and {dec.num_layers} decoder layers: "
                         "ModelConfig has one N for both stacks")
    if (enc.model_size, enc.attention_heads, enc.feed_forward_num_hidden) != \
            (dec.model_size, dec.attention_heads, dec.feed_forward_num_hidden):
        raise ValueError("a Sockeye checkpoint whose encoder and decoder differ in model size, heads or "
                         "feed-forward width: ModelConfig has one of each")
    if src_vocab.get("<pad>") != PAD or trg_vocab.get("<pad>") != PAD:
        raise ValueError(f"a Sockeye checkpoint whose vocabularies do not hold <pad> at id {PAD}")
    tied = cfg.weight_tying_type == "src_trg_softmax"
    config = ModelConfig(src_vocab=cfg.vocab_source_size, tgt_vocab=cfg.vocab_target_size, d_model=enc.model_size,
                         n_heads=enc.attention_heads, d_ff=enc.feed_forward_num_hidden, n_layers=enc.num_layers,
                         dropout=float(enc.dropout_prepost), max_len=int(enc.max_seq_len_source) - 1, pad_id=PAD,
                         share_embeddings=tied, norm_eps=1e-6)
    state = {f"model.{k}": v for k, v in saved.items()}
    if (folder / "args.yaml").is_file():  # the options sockeye-train ran with (arguments.save_args): the recipe's
        from sockeye import arguments

        opt = arguments.load_args(str(folder / "args.yaml"))
    else:
        opt = parse_train_options([])

    def build(cfg_: ModelConfig) -> SockeyeAdapter:
        sized = copy.deepcopy(cfg)
        for side in (sized.config_encoder, sized.config_decoder):
            side.model_size = side.depth_key_value = cfg_.d_model
            side.attention_heads, side.feed_forward_num_hidden = cfg_.n_heads, cfg_.d_ff
            side.num_layers, side.dropout_prepost = cfg_.n_layers, cfg_.dropout
            side.max_seq_len_source = side.max_seq_len_target = cfg_.max_len + 1
        sized.config_embed_source.num_embed = sized.config_embed_target.num_embed = cfg_.d_model
        sized.vocab_source_size = sized.config_embed_source.vocab_size = cfg_.src_vocab
        sized.vocab_target_size = sized.config_embed_target.vocab_size = cfg_.tgt_vocab
        if not cfg_.share_embeddings and tied:
            sized.weight_tying_type = "none"
        return SockeyeAdapter(cfg_, opt, PAPER_TRANSLATE, sockeye_config=sized)

    number = params.resolve().name[len("params."):]  # params.best links to params.NNNNN
    which = f", checkpoint {int(number)}" if number.isdigit() else ""
    return Checkpoint(config=config, state=state, build=build,
                      describes=f"Sockeye checkpoint{which} ({params.name}; {config.n_layers} layers, "
                                f"d_model {config.d_model}, vocabularies {config.src_vocab}/{config.tgt_vocab})")


# -- declarations -----------------------------------------------------------------------------------------------
LA, TF, BS, INF = "sockeye/layers.py", "sockeye/transformer.py", "sockeye/beam_search.py", "sockeye/inference.py"
CO, AR, EN, DE = "sockeye/constants.py", "sockeye/arguments.py", "sockeye/encoder.py", "sockeye/decoder.py"
MO, TR, LR, LO = "sockeye/model.py", "sockeye/training.py", "sockeye/lr_scheduler.py", "sockeye/loss.py"

# Every file:line the reasons and notes cite, with a fragment of that line (tests/test_toolkit_sockeye.py reads them).
LINES: dict[str, str] = {
    f"{LA}:84": "self.bias = pt.nn.Parameter(pt.empty(vocab_size, dtype=dtype))",
    f"{LA}:311": "logits = logits.masked_fill(mask, -C.LARGE_VALUES[logits.dtype])",
    f"{LA}:315": "probs = self.dropout(probs) if self.dropout is not None else probs",
    f"{LA}:691": "scaled_positions = positions / pt.pow(10000, (2 * channels) / depth)",
    f"{LA}:697": "encodings = pt.hstack([sin, cos])",
    f"{LA}:735": "self.weight = pt.nn.Parameter(weight, requires_grad=False)",
    f"{LA}:764": "data = data * (self.num_embed ** 0.5)",
    f"{TF}:276": "self.layer_norm = pt.nn.LayerNorm(num_hidden, eps=1e-06, dtype=dtype)",
    f"{TF}:344": "h = self.drop(h)",
    f"{CO}:283": "DEFAULT_NUM_STD_MAX_OUTPUT_LENGTH = 2",
    f"{CO}:292": "LARGE_VALUES = {",
    f"{BS}:258": "pad_dist = scores_accumulated + pad_dist",
    f"{BS}:265": "scores = pt.where(pt.logical_or(below_max_length, finished).unsqueeze(1), scores, eos_dist + scores)",
    f"{BS}:286": "self.denominator = (self.beta + 1.) ** self.alpha",
    f"{BS}:295": "numerator = self.beta + lengths if self.beta != 0.0 else lengths",
    f"{BS}:389": "all_finished = pt.logical_or(best_word_indices == self.pad_id, best_word_indices == self.eos_id)",
    f"{BS}:391": "scores_accumulated = pt.where(newly_finished,",
    f"{BS}:1091": "return finished.sum().item() == batch_size * self.beam_size",
    f"{INF}:95": "factor = length_ratio_mean + (length_ratio_std * num_stds)",
    f"{INF}:108": "return int(np.ceil(factor * input_length))",
    f"{INF}:240": "tokens=self.tokens + [C.EOS_SYMBOL],",
    f"{INF}:784": "self.stop_ids = {C.EOS_ID, C.PAD_ID}",
    f"{AR}:703": "default=('n', 'n'),",
    f"{AR}:713": "default=('dr', 'dr'),",
    f"{AR}:780": "default=C.WEIGHT_TYING_SRC_TRG_SOFTMAX,",
    f"{AR}:874": "default='mxnet',",
    f"{AR}:973": "default=(0.1, 0.1),",
    f"{AR}:978": "default=(0.1, 0.1),",
    f"{AR}:993": "default=(0.9, 0.999),",
    f"{AR}:997": "default=1e-08,",
    f"{AR}:1009": "default=0.0002,",
    f"{AR}:1030": "default=C.LR_SCHEDULER_PLATEAU_REDUCE,",
    f"{AR}:1416": "default=0.0,",
    f"{EN}:196": "self.final_process = transformer.TransformerProcessBlock(sequence=config.preprocess_sequence,",
    f"{DE}:166": "self.final_process = transformer.TransformerProcessBlock(sequence=config.preprocess_sequence,",
    f"{MO}:553": "output_weight = target_embedding.weight",
    f"{TR}:423": "self.lr_scheduler.step()",
    f"{TR}:429": "self.optimizer.step()",
    f"{LR}:137": "lr = warm_lr / sqrt(max(self._t, warmup_steps))",
    f"{LR}:233": "lr = self._warmup(self._t) if self.warmup > 0 and self._t <= self.warmup else self.lr",
    f"{LO}:176": "nll = (1 - self._alpha) * nll - self._alpha / logits.size(-1) * all_scores",
}

POSITION = (
    f"get_positional_embeddings puts all the sines first, then all the cosines (pt.hstack([sin, cos]), {LA}:697), "
    f"instead of interleaving them: the frequencies are §3.5's ({LA}:691), their places are not; Sockeye has no "
    "option for another layout"
)
OUTPUT_BIAS = (
    f"the output layer always has a [tgt_vocab] bias ({LA}:84, OutputLayer): tied to the target embedding "
    "(--weight-tying-type src_trg_softmax) it still adds a trained bias to the logits, which §3.4's shared "
    "pre-softmax transformation has not"
)
PARAMETERS = (
    f"beyond the schema: the output layer's bias ({LA}:84; tgt_vocab) and each stack's fixed sinusoid table, kept as "
    f"an nn.Parameter with requires_grad=False ({LA}:735; (max_len + 1) x d_model, not trained); the q, k, v "
    "projections are fused ([3 d_model, d_model] in self-attention, [2 d_model, d_model] for cross-attention's keys "
    "and values), as many numbers as the schema's"
)
PORTABLE = (
    f"the attention scores are masked with -C.LARGE_VALUES[logits.dtype] ({LA}:311), a table of float16, bfloat16 "
    f"and float32 only ({CO}:292): after model.double() the forward raises KeyError: torch.float64"
)
SEARCH = (
    f"Sockeye's BeamSearch keeps finished hypotheses in the K slots (a finished row's only continuation is <pad> at "
    f"its accumulated score, {BS}:258), where they compete with the live ones with their scores divided by the "
    f"length penalty when they finish ({BS}:391) and the live ones' not, and it stops a source only when all K slots "
    f"have finished ({BS}:1091), not when no live hypothesis can beat the finished ones; <pad> is not excluded and "
    f"ends a hypothesis as </s> does ({BS}:389; the translator strips both, {INF}:784), so an output can be empty "
    f"(measured: rows that chose <pad> first came back empty); at the output limit </s> is forced ({BS}:265)"
)
BEAM = SEARCH + (
    f"; the penalty with --length-penalty-beta 5 is (5 + |Y|)^alpha / 6^alpha ({BS}:286, :295), GNMT's"
)
GREEDY = (
    f"a beam of 1 is Sockeye's BeamSearch of width 1 (sockeye-translate -b 1), which forces </s> in the last place "
    f"an output may take ({BS}:265): where the argmax trajectory runs to the limit it ends with </s> instead of its "
    "argmax token"
)
MAX_LENGTH = (
    f"without --max-output-length the limit of each source is ceil((mean + 2 std) x its length) with the length "
    f"ratio's mean and deviation measured on the training data ({INF}:95, :108; --max-output-length-num-stds "
    f"defaults to 2, {CO}:283), not its length + 50: a model built without data has the placeholder ratio 1.0 +- 0, "
    f"so no output is longer than its source, and </s> is forced there ({BS}:265). The suite's witness: rows ended "
    f"by an end symbol the model's own scores rule out (greedy and beam), at the source's own length"
)
REFERENCE = (
    "loaded with the canonical weights it computes another function than the paper's through its positional table "
    f"alone (all sines, then all cosines: {LA}:697); with §3.5's interleaved table written into both stacks it "
    "computes the reference's outputs (tests/test_toolkit_sockeye.py proves it by value)"
)

DEVIATIONS: dict[str, str] = {
    "model.reference-equivalence": REFERENCE,
    "position.formula": POSITION,
    "embedding.shared-weights": OUTPUT_BIAS,
    "config.parameters": PARAMETERS,
    "device.portable": PORTABLE,
    "decode.greedy": GREEDY,
    "decode.beam": BEAM,
    "decode.max-length": MAX_LENGTH,
}

NOTES = (
    "Built by Sockeye's own `SockeyeModel` (sockeye/model.py) from the ModelConfig `sockeye.train.create_model_config` "
    "makes of options parsed by its own training parser, as `sockeye-train` would from: `--num-layers N:N "
    "--transformer-model-size d_model:d_model --transformer-attention-heads h:h --transformer-feed-forward-num-hidden "
    "d_ff:d_ff --transformer-dropout-prepost P_drop:P_drop --transformer-preprocess : --transformer-postprocess "
    "drn:drn --transformer-dropout-attention 0:0 --transformer-dropout-act 0:0 --transformer-activation-type "
    "relu:relu --transformer-positional-embedding-type fixed --embed-dropout 0:0 --weight-tying-type src_trg_softmax "
    "--optimizer adam --optimizer-betas 0.9:0.98 --optimizer-eps 1e-9 --initial-learning-rate d_model^-0.5 "
    "--learning-rate-scheduler-type inv-sqrt-decay --learning-rate-warmup 4000 --label-smoothing 0.1 "
    "--gradient-clipping-type none` (`--weight-tying-type none` when the configuration does not tie). Decoding: "
    "`sockeye-translate --beam-size K --length-penalty-alpha alpha --length-penalty-beta 5` (a beam of 1 is its "
    "BeamSearch of width 1, as without --greedy), `--max-output-length max_len-1` when a limit of max_len tokens, "
    "</s> included, is given (Sockeye's limit counts the words before </s>); each call runs Sockeye's Translator on an "
    "inference-only copy of the model, as sockeye-translate loads one. "
    "Not deviations: post-norm with no final norm (`--transformer-preprocess ''` leaves each stack's final process "
    f"block empty, {EN}:196, {DE}:166), the sqrt(d_model) scale ({LA}:764), §3.5's frequencies, bias-free attention "
    f"projections, ReLU, the layer-norm epsilon 1e-6 written in the code ({TF}:276, the audit's default norm_eps: "
    "another epsilon cannot be built), finite masks, three-way tying as an option. Eq. (3) is inv-sqrt-decay with "
    f"base rate d_model^-0.5: min(1, t/warmup) x base / sqrt(max(t, warmup)) ({LR}:137), stepped before each update "
    f"({TR}:423, :429), so update k runs at step k. Label smoothing is the default 'mxnet' form ({AR}:874): eps/V on "
    f"every class ({LO}:176), the loss averaged over the real target tokens. "
    "Token ids: Sockeye's specials are fixed (<pad> 0, <unk> 1, <s> 2, </s> 3) and its search and loss use them as "
    "constants; the adapter relabels the audit's padding, start and end symbols to them where they matter (the "
    "search's copy of the model, the criterion). Its translator appends </s> to each source before encoding it "
    f"({INF}:240); the audit's sources are given as they are, as the forward reads them. "
    "Reproduce: `aiayn audit --impl sockeye`; a model directory as `sockeye-train` saved it: "
    "`pytest conformance/ --impl=sockeye --weights MODEL_DIR/params.best` (config and vocabularies beside it). "
    f"Install beside this project's torch: `{INSTALL}`. Sockeye 3.1.34 declares torch<1.14.0 and numpy<2.0.0 as "
    "requirements, which --no-deps leaves unmet (pip reports them as a conflict): measured beside torch 2.13 and numpy "
    "2.4, in a fresh virtual environment and in tests/test_toolkit_sockeye.py, it builds, trains and saves (`python -m "
    "sockeye.train`), loads its model directories (`sockeye.model.load_model`) and translates."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "sockeye/")

build = build_paper

SOURCE = ("https://github.com/awslabs/sockeye/tree/3.1.34 (the installed sockeye: sockeye/model.py, "
          "sockeye/transformer.py, sockeye/layers.py, sockeye/beam_search.py, sockeye/inference.py)")


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="sockeye", build=build_paper, output="logits", deviations=DEVIATIONS, notes=NOTES,
        summary="Sockeye 3.1.34 Transformer built by sockeye.model.SockeyeModel toward the paper (post-norm 'drn', "
                "no final norms, fixed sinusoids, tied): its Translator's beam search",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=sockeye_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))


"""Built-in plugins ``fairseq`` and ``fairseq-defaults``: fairseq's Transformer, built by its own task and builder.

Source: the installed ``fairseq-fixed`` package (import name ``fairseq``, a maintained fork of fairseq 0.12 for
Python 3.11); the reasons below cite ``fairseq-fixed 0.12.3.1`` (``WRITTEN_FOR``) as ``fairseq/<file>.py:N`` (a
line of that file in that release, under ``site-packages``). tests/test_toolkit_fairseq.py checks every cited line
against the installed file.

Construction, as ``fairseq-train`` does it: the command line is parsed by fairseq's own training parser
(``options.get_training_parser`` and ``options.parse_args_and_arch``; every option not named keeps the parser's or
the architecture's default), a ``TranslationTask`` holds fairseq ``Dictionary`` objects of the config's sizes, and
the model comes from ``task.build_model`` (``TransformerModel.build_model``). ``OPTIONS`` of each registration:
``paper_options`` and ``default_options``.

Token ids: a fairseq ``Dictionary`` always starts with ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3; the adapter
relabels the audit's ids (``fairseq_ids``) so that the audit's padding, start and end symbols are fairseq's
``<pad>``, ``<s>`` and ``</s>``, on the way in and on the way out (as JoeyNMT's plugin does).

The calling convention, as fairseq's trainer and ``SequenceGenerator`` call the model:
``model(src_tokens, src_lengths, prev_output_tokens)`` with right-padded sources (the audit's; fairseq's own batches
pad sources on the left, which its encoder handles through the same padding mask and position numbers), the logits
from the decoder's output projection.

Decoding is the toolkit's: the step methods drive the decoder with its ``incremental_state`` (the key/value caches
of each attention), reordered by ``reorder_incremental_state_scripting`` and the encoder's ``reorder_encoder_out``;
``generate`` runs ``fairseq.sequence_generator.SequenceGenerator`` (its beam search, caches and length rules) with
the options ``fairseq-generate`` would parse. The recipe is the toolkit's: its ``build_optimizer`` (FairseqAdam),
``build_lr_scheduler`` stepped as its ``Trainer`` steps it, the task's criterion and ``LanguagePairDataset``'s
``collate`` for the decoder input.

``read_checkpoint`` reads a ``.pt`` as ``fairseq-train`` saves it (``{"cfg" or "args", "model", ...}``): the sizes
come from the weights, every model option from the saved configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target
from aiayn_conformance.spec.training import TrainConfig

from ..availability import unavailable_reason
from ..declarations import Checkpoint, Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited
from .tk_common import load_with_extra_norms, read_torch_checkpoint

__all__ = ["FairseqAdapter", "build", "build_paper", "build_defaults", "read_checkpoint", "DEVIATIONS", "NOTES",
           "CITED", "LINES", "SOURCE", "WRITTEN_FOR", "INSTALL", "fairseq_unavailable", "paper_options",
           "default_options", "fairseq_ids", "LIBRARY_MODULE"]

WRITTEN_FOR = "fairseq-fixed 0.12.3.1"
LIBRARY_MODULE = "fairseq"  # the import name (the distribution is fairseq-fixed)
# READTHEDOCS set: fairseq's setup.py builds no extension (fairseq's own switch for its documentation builds); what
# the model, SequenceGenerator and the recipe import is plain Python. The dependencies are those its import needs.
INSTALL = ("pip install omegaconf==2.3.0 hydra-core==1.3.2 bitarray sacrebleu scikit-learn numpy tqdm packaging "
           "setuptools wheel && READTHEDOCS=1 pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1")
BOS, PAD, EOS, UNK = 0, 1, 2, 3  # Dictionary's specials, in the order its __init__ adds them


def fairseq_unavailable() -> str:
    """"" when fairseq-fixed 0.12.x is installed; otherwise one line with the install command."""
    return unavailable_reason(LIBRARY_MODULE, "fairseq-fixed", at_least="0.12", below="0.13", install=INSTALL)


def fairseq_ids(size: int, pad_id: int) -> Tensor:
    """The audit's id -> fairseq's: the audit's start and end symbols (1, 2) and its padding are fairseq's ``<s>``,
    ``</s>`` and ``<pad>`` (0, 2, 1); every other id keeps its order over the ids left (the audit's 3 is ``<unk>``
    at pad_id 0)."""
    wanted = {1: BOS, 2: EOS}
    wanted = {k: v for k, v in wanted.items() if k != pad_id}
    wanted[pad_id] = PAD
    ids = torch.empty(size, dtype=torch.long)
    ids[list(wanted)] = torch.tensor(list(wanted.values()))
    ids[[i for i in range(size) if i not in wanted]] = torch.tensor(
        [j for j in range(size) if j not in wanted.values()])
    return ids


# -- the options of each registration ---------------------------------------------------------------------------
def _sizes(config: ModelConfig) -> list[str]:
    """The options every registration takes from the ModelConfig: its sizes, P_drop and the longest positions."""
    out = []
    for side in ("encoder", "decoder"):
        out += [f"--{side}-layers", str(config.n_layers), f"--{side}-embed-dim", str(config.d_model),
                f"--{side}-ffn-embed-dim", str(config.d_ff), f"--{side}-attention-heads", str(config.n_heads)]
    positions = str(max(config.max_len, 8))
    return [*out, "--dropout", str(config.dropout), "--max-source-positions", positions,
            "--max-target-positions", positions]


def paper_options(config: ModelConfig, train: TrainConfig | None = None) -> list[str]:
    """fairseq's own recipe for the paper's model (``transformer_vaswani_wmt_en_de_big`` at the config's sizes,
    post-norm, sinusoids, shared embeddings; Adam, inverse_sqrt, label smoothing)."""
    tc = train or TrainConfig()
    tied = ["--share-all-embeddings"] if config.share_embeddings else []
    peak = config.d_model ** -0.5 * tc.warmup_steps ** -0.5  # Eq. (3) at its peak, step = warmup
    return ["--arch", "transformer_vaswani_wmt_en_de_big", *_sizes(config), *tied,
            "--optimizer", "adam", "--adam-betas", f"({tc.beta1}, {tc.beta2})", "--adam-eps", str(tc.adam_eps),
            "--weight-decay", str(tc.weight_decay),
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(tc.warmup_steps), "--lr", repr(peak),
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(tc.label_smoothing)]


def default_options(config: ModelConfig, train: TrainConfig | None = None) -> list[str]:
    """``--arch transformer`` and the sizes; fairseq-train has no default optimizer, so ``--optimizer adam`` (at its
    own defaults) is named; everything else (fixed schedule, cross-entropy criterion) is the parser's default."""
    return ["--arch", "transformer", *_sizes(config), "--optimizer", "adam"]


@contextlib.contextmanager
def _quiet() -> Any:
    """fairseq logs at INFO on import and while building; the audit's output is not the place for it."""
    logger = logging.getLogger("fairseq")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def parse_train_options(args: Sequence[str]) -> argparse.Namespace:
    """``args`` parsed by fairseq's training parser as ``fairseq-train`` parses its command line (the translation
    task; the data directory is a placeholder, nothing is read)."""
    with _quiet():
        from fairseq import options

        parser = options.get_training_parser()
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                return options.parse_args_and_arch(parser, ["unused-data-dir", "--task", "translation", *args])
            except SystemExit:
                raise ValueError(f"fairseq's training parser refused {' '.join(args)}: "
                                 f"{err.getvalue().strip().splitlines()[-1:]}") from None


def make_dictionary(size: int) -> Any:
    """A fairseq ``Dictionary`` of ``size`` entries: its four specials, then placeholders."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(len(d), size):
        d.add_symbol(f"w{i}")
    if len(d) != size:
        raise ValueError(f"a fairseq Dictionary holds at least {len(d)} symbols; vocabulary of {size} requested")
    return d


def make_task(args: argparse.Namespace, src_size: int, tgt_size: int, shared: bool) -> Any:
    """A ``TranslationTask`` holding dictionaries of the sizes (one object for both sides when shared)."""
    from fairseq.tasks.translation import TranslationTask

    tgt = make_dictionary(tgt_size)
    src = tgt if shared else make_dictionary(src_size)
    return TranslationTask(args, src, tgt)


# -- the adapter ------------------------------------------------------------------------------------------------
@dataclass
class FairseqState:
    """Between decoding steps: the encoder's output dict, the prefix fed so far (fairseq ids; its positions count
    from it) and the decoder's ``incremental_state`` (each attention's saved keys and values)."""

    encoder_out: dict[str, list[Tensor]]
    prefix: Tensor  # (N, t)
    incremental: dict[str, dict[str, Tensor | None]]


def _copy_incremental(state: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A copy of an incremental state: the decoder replaces its tensors (never writes into them), so a copy of the
    dictionaries keeps an earlier state intact."""
    return {k: dict(v) for k, v in state.items()}


class FairseqAdapter(nn.Module):
    """A fairseq ``TransformerModel`` behind the adapter contract; returns logits (B, T, tgt_vocab) in the audit's
    ids."""

    src_ids: Tensor  # buffers: the audit's id -> fairseq's (fairseq_ids)
    tgt_ids: Tensor
    _options_fn: Callable[..., list[str]] | None = None  # a registration's option function, for the recipe

    def __init__(self, config: ModelConfig, options: Callable[..., list[str]] | argparse.Namespace,
                 generate_options: Sequence[str] = ()):
        super().__init__()
        self.config = config
        self.args = options if isinstance(options, argparse.Namespace) else parse_train_options(options(config))
        self.generate_options = list(generate_options)
        shared = bool(getattr(self.args, "share_all_embeddings", False))
        with _quiet():
            self.task = make_task(self.args, config.src_vocab, config.tgt_vocab, shared)
            self.model = self.task.build_model(self.args)
        for size, name in ((config.src_vocab, "src_ids"), (config.tgt_vocab, "tgt_ids")):
            self.register_buffer(name, fairseq_ids(size, config.pad_id), persistent=False)

    # -- ids ---------------------------------------------------------------------------------------------------
    def _src(self, src: Tensor) -> tuple[Tensor, Tensor]:
        tokens = self.src_ids[src]
        return tokens, tokens.ne(PAD).sum(dim=1)

    def _scores(self, logits: Tensor) -> Tensor:
        return logits.index_select(-1, self.tgt_ids)  # column i: the audit's token i

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab)."""
        tokens, lengths = self._src(src)
        logits, _ = self.model(tokens, lengths, self.tgt_ids[tgt])
        return self._scores(logits)

    def encode(self, src: Tensor) -> Tensor:
        """The encoder's output (B, S, d_model) (fairseq keeps it time-first)."""
        tokens, lengths = self._src(src)
        return self.model.encoder(tokens, src_lengths=lengths)["encoder_out"][0].transpose(0, 1)

    def positional_encoding(self, length: int) -> Tensor:
        """What the encoder's ``embed_positions`` adds at positions 0..length-1 of a sequence without padding (its
        rows from padding_idx + 1 on); zeros when the options build none."""
        table = self.model.encoder.embed_positions
        if table is None:
            return torch.zeros(length, self.config.d_model)
        tokens = torch.full((1, length), UNK, dtype=torch.long)
        with torch.no_grad():
            return table(tokens)[0].detach().clone()

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical state: embedding and output rows relabelled to fairseq's ids, each ``normK`` the norm
        after the K-th sub-layer (post-norm) or before it (pre-norm), any stack-final norm neutral, every attention
        projection bias 0; a learned position table cannot hold the canonical sinusoids and is refused."""
        model = self.model
        if self.model.encoder.embed_positions is not None and hasattr(self.model.encoder.embed_positions, "weight"):
            raise ValueError("learned positional embeddings: the canonical state has no place for them")
        params = dict(model.named_parameters())
        src_rows, tgt_rows = self.src_ids.argsort(), self.tgt_ids.argsort()  # fairseq row j <- audit row rows[j]

        def rows(param: Tensor, order: Tensor) -> Callable[[Tensor], object]:
            return lambda value: param.copy_(value.index_select(0, order))

        matrices = (model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight,
                    model.decoder.output_projection.weight)
        mapping: dict[CanonicalKey, Target] = {
            "src_embed.weight": rows(matrices[0], src_rows),
            "tgt_embed.weight": rows(matrices[1], tgt_rows),
            "generator.weight": rows(matrices[2], tgt_rows),
        }
        used = {n for n, p in params.items() if any(p is m for m in matrices)}
        zero: list[Tensor] = []
        projections = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj"))
        for i in range(self.config.n_layers):
            stacks = (("encoder", {"self_attn": "self_attn"}, ("self_attn_layer_norm", "final_layer_norm")),
                      ("decoder", {"self_attn": "self_attn", "cross_attn": "encoder_attn"},
                       ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")))
            for stack, attentions, norms in stacks:
                ours, theirs = f"{stack}.{i}", f"{stack}.layers.{i}"
                for att, mine in attentions.items():
                    for x, proj in projections:
                        mapping[f"{ours}.{att}.{x}.weight"] = params[f"{theirs}.{mine}.{proj}.weight"]
                        zero.append(params[f"{theirs}.{mine}.{proj}.bias"])
                        used |= {f"{theirs}.{mine}.{proj}.weight", f"{theirs}.{mine}.{proj}.bias"}
                for p in ("weight", "bias"):
                    for w, fc in (("w1", "fc1"), ("w2", "fc2")):
                        mapping[f"{ours}.ffn.{w}.{p}"] = params[f"{theirs}.{fc}.{p}"]
                        used.add(f"{theirs}.{fc}.{p}")
                    for k, norm in enumerate(norms, start=1):
                        mapping[f"{ours}.norm{k}.{p}"] = params[f"{theirs}.{norm}.{p}"]
                        used.add(f"{theirs}.{norm}.{p}")
        load_with_extra_norms(state, mapping, params, used, zero)

    # -- decoding: the decoder's incremental state and SequenceGenerator ----------------------------------------
    def begin_decoding(self, src: Tensor) -> FairseqState:
        tokens, lengths = self._src(src)
        encoder_out = self.model.encoder(tokens, src_lengths=lengths)
        return FairseqState(encoder_out, torch.zeros(src.size(0), 0, dtype=torch.long, device=src.device), {})

    def decode_step(self, state: FairseqState, tokens: Tensor) -> tuple[Tensor, FairseqState]:
        """One token per row (N,) -> logits (N, tgt_vocab), as ``SequenceGenerator`` calls the decoder: the whole
        prefix with the ``incremental_state`` (the decoder numbers the positions from the prefix and feeds only its
        last token)."""
        prefix = torch.cat([state.prefix, self.tgt_ids[tokens][:, None]], dim=1)
        incremental = _copy_incremental(state.incremental)
        logits, _ = self.model.decoder(prefix, encoder_out=state.encoder_out, incremental_state=incremental)
        return self._scores(logits[:, -1]), FairseqState(state.encoder_out, prefix, incremental)

    def reorder_state(self, state: FairseqState, indices: Tensor) -> FairseqState:
        """Row i continues row ``indices[i]``: the caches through the decoder's
        ``reorder_incremental_state_scripting``, the encoder output through ``reorder_encoder_out``."""
        incremental = _copy_incremental(state.incremental)
        if incremental:
            self.model.decoder.reorder_incremental_state_scripting(incremental, indices)
        encoder_out = self.model.encoder.reorder_encoder_out(state.encoder_out, indices)
        return FairseqState(encoder_out, state.prefix.index_select(0, indices), incremental)

    def generation_options(self, *, beam_size: int, alpha: float, max_len: int | None) -> argparse.Namespace:
        """The options ``fairseq-generate`` would parse for this call (fairseq's generation parser)."""
        from fairseq import options

        limits = [] if max_len is None else ["--max-len-a", "0", "--max-len-b", str(max_len)]
        args = ["unused-data-dir", "--task", "translation", "--beam", str(beam_size), "--lenpen", str(alpha),
                *self.generate_options, *limits]
        with _quiet(), contextlib.redirect_stderr(io.StringIO()):
            return options.parse_args_and_arch(options.get_generation_parser(), args)

    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                 max_len: int | None = None) -> Tensor:
        """``SequenceGenerator.generate`` on ``src`` (its beam search, also for a beam of 1), started with the
        audit's start symbol (its ``bos_token`` argument) and ended by the audit's end symbol (its ``eos``): each
        output up to its end symbol included, right-padded with the audit's padding."""
        from fairseq.sequence_generator import SequenceGenerator

        gen = self.generation_options(beam_size=beam_size, alpha=alpha, max_len=max_len)
        eos = int(self.tgt_ids[eos_id])
        generator = SequenceGenerator(
            [self.model], self.task.target_dictionary, beam_size=gen.beam, max_len_a=gen.max_len_a,
            max_len_b=gen.max_len_b, min_len=gen.min_len, normalize_scores=not gen.unnormalized,
            len_penalty=gen.lenpen, unk_penalty=gen.unkpen, temperature=gen.temperature,
            match_source_len=gen.match_source_len, no_repeat_ngram_size=gen.no_repeat_ngram_size, eos=eos)
        tokens, lengths = self._src(src)
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}}
        with torch.no_grad():
            hypos = generator.generate([self.model], sample, bos_token=int(self.tgt_ids[bos_id]))
        back = self.tgt_ids.argsort()  # fairseq id -> the audit's
        rows = [back[h[0]["tokens"]].tolist() for h in hypos]
        width = max([len(r) for r in rows] + [1])
        out = torch.full((len(rows), width), self.config.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return out

    # -- the recipe: fairseq's optimizer, scheduler, criterion and collate ----------------------------------------
    def _recipe(self, train_config: TrainConfig | None) -> tuple[argparse.Namespace, Any]:
        """The training options for ``train_config`` and their omegaconf form (once per TrainConfig)."""
        args = self.args
        if train_config is not None and self._options_fn is not None:
            cache = self.__dict__.setdefault("_parsed", {})
            if train_config not in cache:
                cache[train_config] = parse_train_options(self._options_fn(self.config, train_config))
            args = cache[train_config]
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        forms = self.__dict__.setdefault("_forms", {})
        if id(args) not in forms:
            with _quiet(), contextlib.redirect_stderr(io.StringIO()):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    forms[id(args)] = (args, convert_namespace_to_omegaconf(args))
        return forms[id(args)]

    def make_optimizer(self, params: Iterable[nn.Parameter], train_config: TrainConfig | None = None
                       ) -> torch.optim.Optimizer:
        """``fairseq.optim.build_optimizer(cfg.optimizer, params)`` as its Trainer calls it: the torch optimizer
        it wraps (``FairseqAdam.optimizer``, fairseq's own Adam), with the wrapper kept for the scheduler."""
        from fairseq import optim

        _, cfg = self._recipe(train_config)
        wrapper = optim.build_optimizer(cfg.optimizer, list(params))
        torch_optimizer = wrapper.optimizer
        torch_optimizer._fairseq_wrapper = wrapper
        return torch_optimizer

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig | None = None) -> Any:
        """``build_lr_scheduler(cfg.lr_scheduler, optimizer)``, stepped as fairseq's Trainer steps it: after each
        update ``step_update(num_updates)`` with the updates done so far (``Trainer.set_num_updates``)."""
        from fairseq.optim import lr_scheduler

        _, cfg = self._recipe(train_config)
        wrapper = getattr(optimizer, "_fairseq_wrapper", None)
        if wrapper is None:
            raise ValueError("make_scheduler takes the optimizer make_optimizer returned (fairseq's schedulers set "
                             "the rate through its FairseqOptimizer wrapper)")
        return TrainerSteps(lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, wrapper))

    def make_criterion(self, train_config: TrainConfig | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """The task's criterion (``task.build_criterion``), its ``compute_loss`` on the model's log-softmax, summed
        and divided as the Trainer divides the gradients: by the sample size, the real target tokens (without
        ``--sentence-avg``)."""
        args, _ = self._recipe(train_config)
        with _quiet():
            criterion = self.task.build_criterion(args)
        ids, model = self.tgt_ids, self.model

        def loss(scores: Tensor, labels: Tensor) -> Tensor:
            logits = scores.index_select(-1, ids.argsort())  # fairseq's column order
            target = ids[labels]
            total, _ = criterion.compute_loss(model, (logits[None], None), {"target": target[None]}, reduce=True)
            return total / target.ne(PAD).sum().clamp_min(1)

        return loss

    def make_batch(self, target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        """``LanguagePairDataset``'s ``collate`` on the target rows (padding stripped; the source is a placeholder):
        the decoder input is ``prev_output_tokens`` (``input_feeding``: the target with its end symbol moved to the
        front), the labels its ``target``; both back in the batch's order and width, in the audit's ids."""
        from fairseq.data.language_pair_dataset import collate

        rows = self.tgt_ids[target]
        samples = [{"id": i, "source": torch.tensor([UNK, EOS]), "target": row[row.ne(PAD)]}
                   for i, row in enumerate(rows)]
        batch = collate(samples, PAD, EOS, left_pad_source=self.args.left_pad_source,
                        left_pad_target=self.args.left_pad_target, input_feeding=True,
                        pad_to_length={"source": None, "target": target.size(1)})
        order = batch["id"].argsort()
        back = self.tgt_ids.argsort()
        return (back[batch["net_input"]["prev_output_tokens"][order]].to(target.device),
                back[batch["target"][order]].to(target.device))


class TrainerSteps:
    """fairseq's Trainer around its scheduler: the scheduler sets the rate of the first update when it is built
    (``warmup_init_lr`` for inverse_sqrt); after each update ``set_num_updates(n + 1)`` calls
    ``lr_step_update``, which calls ``step_update(num_updates)``."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.num_updates = 0
        scheduler.step_update(0)  # Trainer.lr_step_begin_epoch / lr_step_update at 0 updates

    def step(self) -> None:
        self.num_updates += 1
        self.scheduler.step_update(self.num_updates)


class _Registration(FairseqAdapter):
    def __init__(self, config: ModelConfig, options: Callable[..., list[str]], generate_options: Sequence[str]):
        super().__init__(config, options, generate_options)
        self._options_fn = options


# §6.1: the output limit is the input length + 50 (fairseq's ax + b with a = 1, b = 50)
PAPER_GENERATE = ("--max-len-a", "1", "--max-len-b", "50")


def build_paper(config: ModelConfig) -> FairseqAdapter:
    return _Registration(config, paper_options, PAPER_GENERATE)


def build_defaults(config: ModelConfig) -> FairseqAdapter:
    return _Registration(config, default_options, ())


# -- checkpoints as fairseq-train saves them --------------------------------------------------------------------
ACCEPTED = ("accepted: a .pt saved by fairseq 0.12's fairseq-train (a dict with 'model' and 'cfg' or 'args') of "
            "a 'transformer' architecture")


def _load(path: str) -> Any:
    return read_torch_checkpoint(path, "a fairseq", ACCEPTED)


def _model_args(saved: Mapping[str, Any]) -> argparse.Namespace:
    """The model options a checkpoint was trained with: ``cfg["model"]`` (fairseq 0.10+, a plain dict or a
    Namespace as the legacy model saves it) or the old ``args``."""
    cfg = saved.get("cfg")
    model = cfg.get("model") if isinstance(cfg, Mapping) else None
    if isinstance(model, argparse.Namespace):
        return argparse.Namespace(**vars(model))
    if isinstance(model, Mapping):
        return argparse.Namespace(**dict(model))
    if isinstance(saved.get("args"), argparse.Namespace):
        return argparse.Namespace(**vars(saved["args"]))
    raise ValueError(f"not a fairseq checkpoint (no model options in 'cfg' or 'args'); {ACCEPTED}")


def read_checkpoint(path: str) -> Checkpoint:
    """A checkpoint as ``fairseq-train`` writes it: the options from its configuration, the vocabulary sizes from
    the embedding matrices (the dictionaries live in the data directory; their specials are fairseq's, ``<pad>``
    at 1, relabelled to the audit's 0), the weights in the adapter's names (``model.`` + fairseq's)."""
    saved = _load(path)
    if not isinstance(saved, dict) or "model" not in saved or not ({"cfg", "args"} & set(saved)):
        found = f"a dict with keys {sorted(saved)[:6]}" if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"not a fairseq checkpoint (found {found}); {ACCEPTED}")
    args = _model_args(saved)
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    if not isinstance(arch, str) or not arch.startswith("transformer"):
        raise ValueError(f"a fairseq checkpoint of architecture {arch!r}; {ACCEPTED}")
    state = saved["model"]
    enc_layers, dec_layers = int(args.encoder_layers), int(args.decoder_layers)
    if enc_layers != dec_layers:
        raise ValueError(f"a fairseq checkpoint with {enc_layers} encoder and {dec_layers} decoder layers: "
                         "ModelConfig has one N for both stacks")
    shared = bool(getattr(args, "share_all_embeddings", False))
    src_vocab = int(state["encoder.embed_tokens.weight"].shape[0])
    tgt_vocab = int(state["decoder.embed_tokens.weight"].shape[0])
    positions = min(int(getattr(args, "max_source_positions", 1024) or 1024),
                    int(getattr(args, "max_target_positions", 1024) or 1024))
    config = ModelConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=int(args.encoder_embed_dim),
                         n_heads=int(args.encoder_attention_heads), d_ff=int(args.encoder_ffn_embed_dim),
                         n_layers=enc_layers, dropout=float(args.dropout), max_len=positions, pad_id=0,
                         share_embeddings=shared)
    weights = {f"model.{k}": v for k, v in state.items()}

    def build(cfg: ModelConfig) -> FairseqAdapter:
        options = argparse.Namespace(**vars(args))
        for side in ("encoder", "decoder"):
            for name, value in (("layers", cfg.n_layers), ("embed_dim", cfg.d_model), ("ffn_embed_dim", cfg.d_ff),
                                ("attention_heads", cfg.n_heads)):
                setattr(options, f"{side}_{name}", value)
        options.decoder_input_dim = options.decoder_output_dim = cfg.d_model
        options.dropout = cfg.dropout
        options.max_source_positions = options.max_target_positions = max(cfg.max_len, 8)
        if not cfg.share_embeddings:
            options.share_all_embeddings = False
        for name, value in vars(parse_train_options(["--arch", str(arch)])).items():
            if not hasattr(options, name):  # the task's and trainer's options, which cfg["model"] does not hold
                setattr(options, name, value)
        return FairseqAdapter(cfg, options, PAPER_GENERATE)

    history = saved.get("optimizer_history")
    updates = history[-1].get("num_updates") if isinstance(history, list) and history and \
        isinstance(history[-1], dict) else None
    trained = f", {updates} updates" if isinstance(updates, int) else ""
    return Checkpoint(config=config, state=weights, build=build,
                      describes=f"fairseq checkpoint{trained} ({arch}, {enc_layers} layers, d_model "
                                f"{config.d_model}, vocabularies {src_vocab}/{tgt_vocab})")


# -- declarations -----------------------------------------------------------------------------------------------
MHA, LN, SPE = "fairseq/modules/multihead_attention.py", "fairseq/modules/layer_norm.py", \
    "fairseq/modules/sinusoidal_positional_embedding.py"
UT, ENC, DEC = "fairseq/utils.py", "fairseq/models/transformer/transformer_encoder.py", \
    "fairseq/models/transformer/transformer_decoder.py"
SG, CF, ISR = "fairseq/sequence_generator.py", "fairseq/dataclass/configs.py", \
    "fairseq/optim/lr_scheduler/inverse_square_root_schedule.py"
TRN, ADAM, LPD = "fairseq/trainer.py", "fairseq/optim/adam.py", "fairseq/data/language_pair_dataset.py"
DU, LSC, ARCH = "fairseq/data/data_utils.py", "fairseq/criterions/label_smoothed_cross_entropy.py", \
    "fairseq/models/transformer/transformer_legacy.py"
TL, CRI, LRS = "fairseq/modules/transformer_layer.py", "fairseq/criterions/__init__.py", \
    "fairseq/optim/lr_scheduler/__init__.py"

# Every file:line the reasons and notes cite, with a fragment of that line (tests/test_toolkit_fairseq.py reads them).
LINES: dict[str, str] = {
    f"{MHA}:76": "bias=True,",
    f"{MHA}:124": "nn.Linear(self.kdim, embed_dim, bias=bias)",
    f"{MHA}:539": "return F.multi_head_attention_forward(",
    f"{MHA}:720": "attn_weights = attn_weights.masked_fill(",
    f"{MHA}:725": 'float("-inf"),',
    f"{MHA}:842": "if input_buffer_k.size(0) * self.beam_size == new_order.size(0):",
    f"{MHA}:843": "return incremental_state",
    f"{LN}:28": "def LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, export=False):",
    f"{TL}:42": "self.self_attn_layer_norm = LayerNorm(self.embed_dim, export=cfg.export)",
    f"{SPE}:52": "emb = math.log(10000) / (half_dim - 1)",
    f"{SPE}:57": "emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(",
    f"{SPE}:64": "emb[padding_idx, :] = 0",
    f"{UT}:266": "return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx",
    f"{ENC}:65": "self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(embed_dim)",
    f"{ENC}:206": 'torch.tensor(src_tokens.device.type == "xla") or encoder_padding_mask.any()',
    f"{DEC}:157": "bias=False,",
    f"{DEC}:159": "self.output_projection.weight = self.embed_tokens.weight",
    f"{DEC}:162": "self.output_embed_dim, len(dictionary), bias=False",
    f"{SG}:256": "bsz, src_len = src_tokens.size()[:2]",
    f"{SG}:272": "int(self.max_len_a * src_len + self.max_len_b),",
    f"{SG}:273": "self.max_len - 1,",
    f"{SG}:299": "tokens[:, 0] = self.eos if bos_token is None else bos_token",
    f"{SG}:341": "for step in range(max_len + 1):  # one extra step for EOS marker",
    f"{SG}:381": "if step >= max_len:",
    f"{SG}:377": "lprobs[:, self.pad] = -math.inf  # never select pad",
    f"{SG}:395": "if step < self.min_len:",
    f"{SG}:676": "eos_scores /= (step + 1) ** self.len_penalty",
    f"{SG}:755": "if finalized_sent_len == beam_size or step == max_len:",
    f"{CF}:812": "default=5,",
    f"{CF}:824": "default=0,",
    f"{CF}:830": "default=200,",
    f"{CF}:848": "default=1,",
    f"{CF}:868": "default=1,",
    f"{CF}:616": "default_factory=lambda: [0.25],",
    f"{CF}:1142": "optimizer: Any = None",
    f"{ISR}:60": "cfg.warmup_init_lr = 0 if cfg.warmup_updates > 0 else warmup_end_lr",
    f"{ISR}:69": "self.lr = cfg.warmup_init_lr",
    f"{ISR}:81": "self.lr = self.cfg.warmup_init_lr + num_updates * self.lr_step",
    f"{TRN}:382": "self._lr_scheduler.step_update(0)",
    f"{TRN}:1209": "new_lr = self.lr_scheduler.step_update(self.get_num_updates())",
    f"{TRN}:1278": "self.lr_step_update()",
    f"{ADAM}:27": 'default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"}',
    f"{ADAM}:30": 'default=1e-8, metadata={"help": "epsilon for Adam optimizer"}',
    f"{ADAM}:223": 'denom = exp_avg_sq.sqrt().add_(group["eps"])',
    f"{ADAM}:227": 'step_size = group["lr"] * math.sqrt(bias_correction2) / bias_correction1',
    f"{LPD}:105": "move_eos_to_beginning=True,",
    f"{DU}:64": "dst[0] = eos_idx",
    f"{DU}:313": "from fairseq.data.data_utils_fast import (",
    f"{DU}:319": "raise ImportError(",
    f"{DU}:65": "dst[1:] = src[:-1]",
    f"{LSC}:49": "eps_i = epsilon / (lprobs.size(-1) - 1)",
    f"{LSC}:50": "loss = (1.0 - epsilon - eps_i) * nll_loss + eps_i * smooth_loss",
    f"{ARCH}:175": 'args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)',
    f"{ARCH}:176": 'args.encoder_learned_pos = getattr(args, "encoder_learned_pos", False)',
    f"{ARCH}:196": 'args.share_all_embeddings = getattr(args, "share_all_embeddings", False)',
    f"{ARCH}:246": "def transformer_vaswani_wmt_en_de_big(args):",
    f"{CRI}:24": '"--criterion", base_class=FairseqCriterion, default="cross_entropy"',
    f"{LRS}:24": '"--lr-scheduler", base_class=FairseqLRScheduler, default="fixed"',
}

PARAMETERS = (
    f"beyond the schema: a bias on every attention projection, q, k, v and output (MultiheadAttention's bias=True, "
    f"{MHA}:76, :124; 4 x d_model per attention), with no option of the Transformer to leave them out"
)
POSITIONS = (
    f"SinusoidalPositionalEmbedding is tensor2tensor's table, not §3.5's: sines in the first half of the dimensions "
    f"and cosines in the second ({SPE}:57), frequencies 10000^(-i/(d_model/2 - 1)) ({SPE}:52), and positions "
    f"numbered from padding_idx + 1 ({UT}:266; row padding_idx is zero, {SPE}:64): with fairseq's <pad> at 1 the "
    "first token gets the table's row 2"
)
REFERENCE = (
    "loaded with the canonical weights it computes another function than the reference only through its positional "
    f"table ({SPE}:52, :57; positions from padding_idx + 1, {UT}:266): with the reference's table in its place it "
    "computes the reference's logits (tests/test_toolkit_fairseq.py proves it by value)"
)
EPSILON = (
    f"every layer norm is fairseq's LayerNorm with its default eps=1e-5 ({LN}:28; built without an eps, e.g. "
    f"{TL}:42): no option sets it, so the configured norm_eps is not used"
)
FINITE = (
    f"attention masks padded keys with -inf before the softmax (torch's multi_head_attention_forward, called at "
    f"{MHA}:539, and its own path at {MHA}:720-725): a fully padded source row gives NaN, which reaches every "
    "output of that row"
)
ONNX = (
    f"the encoder decides in Python whether the batch has padding ({ENC}:206: `... or "
    "encoder_padding_mask.any()`), a data-dependent branch: torch.export (torch.onnx.export(dynamo=True)) stops on it"
)
INCREMENTAL = (
    "the encoder-decoder attention reorders its cached keys and values only when the number of rows changes "
    f"({MHA}:842-843: with the same row count it returns the cache as it is): SequenceGenerator reorders rows within "
    "one source's beams, whose cross-attention keys are equal, but a reorder that moves a row to another source keeps "
    "the old source's keys (measured: the cached step differs from the full forward after such a reorder; a reorder "
    "within each source agrees)"
)
GREEDY = (
    f"SequenceGenerator forbids the end symbol before min_len tokens (min_len defaults to 1, {CF}:848; applied at "
    f"{SG}:395): where the end symbol is the most probable first token it emits another one"
)
BEAM = (
    f"SequenceGenerator divides a finished hypothesis's summed log-probability by |Y|^lenpen ({SG}:676; |Y| with "
    "the end symbol; lenpen is the alpha passed), not GNMT's ((5 + |Y|) / 6)^alpha; it stops a source once beam_size "
    f"hypotheses have finished ({SG}:755), not when no live hypothesis can beat the finished ones; it forbids the "
    f"end symbol at the first step (min_len 1, {CF}:848, {SG}:395) and never emits padding ({SG}:377)"
)
FORCED_END = (
    f"after max_len tokens SequenceGenerator takes one more step, where it allows the end symbol alone ({SG}:341, "
    ":381): every output that reaches the limit holds max_len + 1 tokens, the end symbol included, one more than "
    "the limit it was given"
)
MAX_LENGTH = (
    f"the limit is one number per batch, max_len_a x the padded source width + max_len_b ({SG}:256, :272; --max-len-a "
    "1 --max-len-b 50 here), not each source's real length + 50; and " + FORCED_END + ": measured, sources of 6, 3 "
    "and 1 real tokens in a batch of width 6 each decode 57 tokens, where §6.1 allows 56, 53 and 51"
)
ADAM_RULE = (
    f"fairseq's Adam adds epsilon to sqrt(v) before the bias correction ({ADAM}:223) and folds "
    f"sqrt(1 - beta2^t) into the step size ({ADAM}:227): the update is lr * m_hat / (sqrt(v_hat) + eps / "
    "sqrt(1 - beta2^t)), Adam's efficient form with a larger epsilon early on, not torch's Adam with eps 1e-9 "
    "(measured on a gradient of 1e-9: -0.00295 against -0.006)"
)
SCHEDULE = (
    f"inverse_sqrt starts at warmup_init_lr (0 when warmup is used, {ISR}:60, :69) and the Trainer steps it after "
    f"each update with the updates done so far ({TRN}:382, :1209, :1278), so update k runs at Eq. (3)'s step k - 1 "
    f"({ISR}:81): update 1 at rate 0"
)
SHIFT = (
    f"LanguagePairDataset's collate makes the decoder input by moving the target's end symbol to the front "
    f"({LPD}:105; {DU}:64-65): the decoder starts from </s>, not from a start symbol, and the bos_id is not used"
)

DEVIATIONS: dict[str, str] = {
    "config.parameters": PARAMETERS,
    "position.formula": POSITIONS,
    "model.reference-equivalence": REFERENCE,
    "norm.epsilon": EPSILON,
    "mask.finite": FINITE,
    "export.onnx": ONNX,
    "decode.incremental": INCREMENTAL,
    "decode.greedy": GREEDY,
    "decode.beam": BEAM,
    "decode.max-length": MAX_LENGTH,
    "train.optimizer": ADAM_RULE,
    "train.lr-schedule": SCHEDULE,
    "train.shift": SHIFT,
}

NOTES = (
    "Built by fairseq's own TranslationTask.build_model (TransformerModel.build_model) from options parsed by its "
    "own training parser, as `fairseq-train DATA --task translation` would from: `--arch "
    f"transformer_vaswani_wmt_en_de_big` ({ARCH}:246; its sizes replaced by the configuration's) `--encoder-layers N "
    "--decoder-layers N --encoder-embed-dim d_model --decoder-embed-dim d_model --encoder-ffn-embed-dim d_ff "
    "--decoder-ffn-embed-dim d_ff --encoder-attention-heads h --decoder-attention-heads h --dropout P_drop "
    "--max-source-positions max_len --max-target-positions max_len --share-all-embeddings --optimizer adam "
    "--adam-betas '(0.9, 0.98)' --adam-eps 1e-9 --weight-decay 0 --lr-scheduler inverse_sqrt --warmup-updates 4000 "
    "--lr d_model^-0.5 x 4000^-0.5 --criterion label_smoothed_cross_entropy --label-smoothing 0.1` (the tying only "
    "when the configuration ties). Decoding: SequenceGenerator with `--beam K --lenpen alpha --max-len-a 1 "
    "--max-len-b 50` (§6.1's input length + 50), `--max-len-a 0 --max-len-b max_len` when a limit is given, started "
    f"from the audit's start symbol through its bos_token argument ({SG}:299; fairseq-generate starts from </s>). "
    f"Not deviations: post-norm ({ARCH}:175), ReLU, attention and activation dropout 0, the sqrt(d_model) scale "
    f"({ENC}:65), three-way tying (--share-all-embeddings: the output projection is the embedding, without bias, "
    f"{DEC}:157-159), Eq. (3)'s shape (inverse_sqrt with --lr at the peak), label smoothing 0.1 (eps/(V-1) on every "
    f"class but the target, padding included, {LSC}:49-50; padding targets ignored), and learning the tiny tasks: "
    "train.learns decodes from the symbol the recipe's decoder input starts with, here </s> (declared under "
    "train.shift). The projection biases are set "
    "to 0 by `load_reference_state` (declared under config.parameters). Token ids: fairseq's Dictionary puts <s>, "
    "<pad>, </s>, <unk> first; the adapter relabels the ids so that the audit's start, padding and end symbols are "
    "fairseq's. The step methods are the decoder's incremental_state path as SequenceGenerator drives it (the "
    "whole prefix passed, the positions counted from it). Install: the fast install sets READTHEDOCS=1, fairseq's "
    "own switch that builds none of its C++/Cython extensions (measured 17 s in a fresh venv beside torch, 34 s "
    "with its dependencies, against 12 min 47 s for the full build); the model, SequenceGenerator, the optimizer, "
    "the scheduler, the criterion and LanguagePairDataset's collate are plain Python, but fairseq's token-bucket "
    "batching (data_utils.batch_by_size, which fairseq-train calls) needs the Cython data_utils_fast and is absent: "
    f"fairseq-train stops with its ImportError ({DU}:313, :319), so the checkpoint test trains with fairseq's "
    "Trainer on batches made by LanguagePairDataset.collater and saves with its own checkpoint code. "
    "Reproduce: `aiayn audit --impl fairseq`; a checkpoint as fairseq-train saved it: "
    "`pytest conformance/ --impl=fairseq --weights checkpoints/checkpoint_last.pt`. "
    f"Install beside this project's torch: `{INSTALL}`."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "fairseq/")


build = build_paper

SOURCE = ("https://github.com/JackismyShephard/fairseq (fairseq-fixed 0.12.3.1, a fork of fairseq v0.12.2; the "
          "installed fairseq: fairseq/models/transformer/, fairseq/sequence_generator.py)")


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="fairseq", build=build_paper, output="logits", deviations=DEVIATIONS, notes=NOTES,
        summary="fairseq 0.12 (fairseq-fixed) Transformer built by its TranslationTask toward the paper "
                "(transformer_vaswani_wmt_en_de_big options, shared embeddings): its SequenceGenerator, Adam, "
                "inverse_sqrt and label-smoothed criterion",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=fairseq_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))

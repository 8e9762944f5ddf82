"""Built-in plugins ``joeynmt`` and ``joeynmt-defaults``: JoeyNMT's Transformer, built by its own ``build_model``.

Source: the installed ``joeynmt`` package; the reasons below cite ``joeynmt 2.3.0`` (``WRITTEN_FOR``) as
``joeynmt/<file>.py:N`` (a line of that file in that release, under ``site-packages``).
tests/test_toolkit_joeynmt.py checks every cited line against the installed file.

Construction, as ``python -m joeynmt train`` does it: ``joeynmt.model.build_model(cfg["model"], src_vocab,
trg_vocab)`` with the ``model`` section of a JoeyNMT configuration (``MODEL_CONFIGS`` gives each registration's)
and ``joeynmt.vocabulary.Vocabulary`` objects of the config's sizes (JoeyNMT's special symbols first, as its
vocabularies always have them: ``<unk>`` 0, ``<pad>`` 1, ``<s>`` 2, ``</s>`` 3; placeholder tokens after).

Token ids: JoeyNMT's specials are its first ids whatever the vocabulary (``Vocabulary``); the adapter relabels the
vocabulary (``joey_ids``, as a tokenizer's vocabulary file would) so that the audit's padding, start and end
symbols are JoeyNMT's <pad>, <s> and </s>, on the way in and on the way out.

The calling convention, as JoeyNMT's ``Batch`` and ``search`` call the model: ``src_mask = (src != pad)``
(``[B, 1, S]``), ``model(return_type="encode", ...)`` then ``model(return_type="decode", ...)`` with
``trg_mask = (tgt != pad)`` (the decoder intersects it with its subsequent mask); the decoder returns logits.

Decoding is the toolkit's: ``generate`` runs ``joeynmt.search.search`` (``transformer_greedy`` for a beam of 1,
``beam_search`` otherwise) with the options of a ``testing`` section parsed by ``joeynmt.config.parse_test_args``,
and cuts each output after its first end symbol as JoeyNMT's ``Vocabulary`` does when it writes translations. The
step methods are JoeyNMT's decoding step: its Transformer decoder has no cache, and its search feeds the whole
prefix at every step (``search.py``), which ``decode_step`` does. The recipe is the toolkit's: its
``build_optimizer``, ``build_scheduler`` (stepped as its trainer steps it), ``XentLoss`` and ``Batch`` shift.

``read_checkpoint`` reads a ``.ckpt`` as JoeyNMT's trainer saves it, with the ``config.yaml``, ``src_vocab.txt``
and ``trg_vocab.txt`` it writes beside it in the model directory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
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
from .tk_common import load_with_extra_norms

__all__ = ["JoeyAdapter", "build", "build_paper", "build_defaults", "read_checkpoint", "DEVIATIONS", "NOTES",
           "CITED", "LINES", "SOURCE", "WRITTEN_FOR", "INSTALL", "joeynmt_unavailable", "paper_config",
           "default_config"]

WRITTEN_FOR = "joeynmt 2.3.0"
INSTALL = ("pip install --no-deps joeynmt==2.3.0 && pip install pyyaml importlib_metadata tensorboard sentencepiece "
           "subword-nmt sacrebleu")
JOEY_PAD = 1  # Vocabulary's specials: <unk> 0, <pad> 1, <s> 2, </s> 3 (joeynmt/config.py:126-133)
JOEY_BOS, JOEY_EOS = 2, 3


def joey_ids(size: int, pad_id: int) -> Tensor:
    """The audit's id -> JoeyNMT's: the audit's padding, start and end symbols (pad_id, 1, 2) are JoeyNMT's <pad>,
    <s> and </s> (1, 2, 3); every other id keeps its order over the ids left (the audit's 3 is <unk> at pad_id 0).
    So JoeyNMT's batching and search, which know its own specials, treat the audit's specials as theirs."""
    wanted = {pad_id: JOEY_PAD, 1: JOEY_BOS, 2: JOEY_EOS}
    ids = torch.empty(size, dtype=torch.long)
    ids[list(wanted)] = torch.tensor(list(wanted.values()))
    ids[[i for i in range(size) if i not in wanted]] = torch.tensor(
        [j for j in range(size) if j not in wanted.values()])
    return ids


def joeynmt_unavailable() -> str:
    """"" when joeynmt 2.3.x is installed; otherwise one line with the install command."""
    return unavailable_reason("joeynmt", "joeynmt", at_least="2.3", below="2.4", install=INSTALL)


# -- the configurations of each registration -------------------------------------------------------------------
def _stack(config: ModelConfig, **extra: Any) -> dict[str, Any]:
    embeddings = {"embedding_dim": config.d_model, **extra.pop("embeddings", {})}
    return {"type": "transformer", "num_layers": config.n_layers, "num_heads": config.n_heads,
            "hidden_size": config.d_model, "ff_size": config.d_ff, "dropout": config.dropout,
            "embeddings": embeddings, **extra}


def paper_config(config: ModelConfig, train: TrainConfig | None = None) -> dict[str, Any]:
    """A JoeyNMT configuration nearest the paper: post-norm, ReLU, sqrt(d_model), tied, P_drop everywhere it goes."""
    tc = train or TrainConfig()
    stack = dict(layer_norm="post", activation="relu", embeddings={"scale": True, "dropout": config.dropout})
    tied = config.share_embeddings
    first_rate = config.d_model ** -0.5 * tc.warmup_steps ** -1.5  # Eq. (3) at update 1
    return {
        "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform",
                  "bias_initializer": "zeros", "tied_embeddings": tied, "tied_softmax": tied,
                  "encoder": _stack(config, **copy.deepcopy(stack)), "decoder": _stack(config, **copy.deepcopy(stack))},
        "training": {"optimizer": "adam", "adam_betas": [tc.beta1, tc.beta2], "weight_decay": tc.weight_decay,
                     "scheduling": "noam", "learning_rate_factor": 1, "learning_rate_warmup": tc.warmup_steps,
                     "learning_rate": first_rate, "label_smoothing": tc.label_smoothing, "normalization": "tokens",
                     "batch_size": 64},
        "testing": {"beam_alpha": 0.6},
    }


def default_config(config: ModelConfig, train: TrainConfig | None = None) -> dict[str, Any]:
    """JoeyNMT's defaults: a Transformer encoder (the encoder's default is recurrent) and the sizes, nothing else."""
    # batch_size has no default (parse_train_args reads cfg["batch_size"]); it shapes no recipe piece audited here.
    # scheduling has none either (build_scheduler refuses None): the defaults registration exposes no schedule.
    return {"model": {"encoder": _stack(config), "decoder": _stack(config)}, "training": {"batch_size": 64},
            "testing": {}}


def specials() -> Any:
    """JoeyNMT's special symbols at their defaults (``joeynmt.config._check_special_symbols``)."""
    from types import SimpleNamespace

    from joeynmt.config import _check_special_symbols

    return SimpleNamespace(**_check_special_symbols({}))


def make_vocab(size: int) -> Any:
    """A JoeyNMT ``Vocabulary`` of ``size`` entries: its specials, then placeholders."""
    from joeynmt.vocabulary import Vocabulary

    return Vocabulary([f"w{i}" for i in range(size)][4:], specials())


# -- the adapter ------------------------------------------------------------------------------------------------
@dataclass
class JoeyState:
    """Between decoding steps: the encoder output, the source mask and the prefix fed so far (JoeyNMT ids)."""

    memory: Tensor  # (N, S, d_model)
    src_mask: Tensor  # (N, 1, S)
    prefix: Tensor  # (N, t)


class JoeyAdapter(nn.Module):
    """A JoeyNMT ``Model`` behind the adapter contract; returns logits (B, T, tgt_vocab) in the audit's ids."""

    src_ids: Tensor  # buffers: the audit's id -> JoeyNMT's (joey_ids)
    tgt_ids: Tensor
    _config_fn: Callable[..., dict[str, Any]] | None = None  # a registration's configuration, for the recipe

    def __init__(self, config: ModelConfig, cfg: Mapping[str, Any], vocabs: tuple[Any, Any] | None = None):
        super().__init__()
        from joeynmt.model import build_model

        self.config = config
        self.cfg = copy.deepcopy(dict(cfg))
        src_vocab, trg_vocab = vocabs or (make_vocab(config.src_vocab), make_vocab(config.tgt_vocab))
        if config.share_embeddings and self.cfg["model"].get("tied_embeddings"):
            src_vocab = trg_vocab
        self.model = build_model(self.cfg["model"], src_vocab=src_vocab, trg_vocab=trg_vocab)
        for size, name in ((config.src_vocab, "src_ids"), (config.tgt_vocab, "tgt_ids")):
            self.register_buffer(name, joey_ids(size, config.pad_id), persistent=False)  # audit id -> JoeyNMT id

    # -- ids and masks -------------------------------------------------------------------------------------------
    def _src(self, src: Tensor) -> tuple[Tensor, Tensor]:
        joey = self.src_ids[src]
        return joey, (joey != self.model.pad_index).unsqueeze(1)

    def _scores(self, joey_logits: Tensor) -> Tensor:
        return joey_logits.index_select(-1, self.tgt_ids)  # column i: the audit's token i

    def _encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        joey, src_mask = self._src(src)
        memory, _, _, _ = self.model(return_type="encode", src=joey, src_length=src_mask.sum(-1).view(-1),
                                     src_mask=src_mask)
        return memory, src_mask

    def _decode(self, memory: Tensor, src_mask: Tensor, trg_input: Tensor) -> Tensor:
        logits, _, _, _ = self.model(return_type="decode", encoder_output=memory, encoder_hidden=None,
                                     src_mask=src_mask, trg_input=trg_input, unroll_steps=trg_input.size(1),
                                     decoder_hidden=None, trg_mask=(trg_input != self.model.pad_index).unsqueeze(1))
        return logits

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab)."""
        memory, src_mask = self._encode(src)
        return self._scores(self._decode(memory, src_mask, self.tgt_ids[tgt]))

    def encode(self, src: Tensor) -> Tensor:
        return self._encode(src)[0]

    def positional_encoding(self, length: int) -> Tensor:
        """The encoder's ``PositionalEncoding`` table (its buffer is (1, 5000, d_model))."""
        table = self.model.encoder.pe.pe
        if length > table.size(1):
            raise ValueError(f"the table holds {table.size(1)} positions; {length} requested")
        return table[0, :length].detach().clone()

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical state: embedding and generator rows relabelled to JoeyNMT's ids, each ``normK`` at the
        K-th sub-layer's norm (on its input in a pre-norm layer, on its output in a post-norm one), the stacks' final
        norms (when built) neutral, every attention projection bias 0."""
        model = self.model
        params = dict(model.named_parameters())
        src_rows, tgt_rows = self.src_ids.argsort(), self.tgt_ids.argsort()  # JoeyNMT row j <- audit row rows[j]

        def rows(param: Tensor, order: Tensor) -> Callable[[Tensor], object]:
            return lambda value: param.copy_(value.index_select(0, order))

        matrices = (model.src_embed.lut.weight, model.trg_embed.lut.weight, model.decoder.output_layer.weight)
        mapping: dict[CanonicalKey, Target] = {
            "src_embed.weight": rows(matrices[0], src_rows),
            "tgt_embed.weight": rows(matrices[1], tgt_rows),
            "generator.weight": rows(matrices[2], tgt_rows),
        }
        used = {n for n, p in params.items() if any(p is m for m in matrices)}
        projections = (("q", "q_layer"), ("k", "k_layer"), ("v", "v_layer"), ("o", "output_layer"))
        zero: list[Tensor] = []
        for i in range(self.config.n_layers):
            stacks = (("encoder", {"self_attn": "src_src_att"}, ("layer_norm", "feed_forward.layer_norm")),
                      ("decoder", {"self_attn": "trg_trg_att", "cross_attn": "src_trg_att"},
                       ("x_layer_norm", "dec_layer_norm", "feed_forward.layer_norm")))
            for stack, attentions, norms in stacks:
                ours, theirs = f"{stack}.{i}", f"{stack}.layers.{i}"
                for att, mine in attentions.items():
                    for x, proj in projections:
                        mapping[f"{ours}.{att}.{x}.weight"] = params[f"{theirs}.{mine}.{proj}.weight"]
                        zero.append(params[f"{theirs}.{mine}.{proj}.bias"])
                        used |= {f"{theirs}.{mine}.{proj}.weight", f"{theirs}.{mine}.{proj}.bias"}
                for p in ("weight", "bias"):
                    for w, lin in (("w1", 0), ("w2", 3)):
                        mapping[f"{ours}.ffn.{w}.{p}"] = params[f"{theirs}.feed_forward.pwff_layer.{lin}.{p}"]
                        used.add(f"{theirs}.feed_forward.pwff_layer.{lin}.{p}")
                    for k, norm in enumerate(norms, start=1):
                        mapping[f"{ours}.norm{k}.{p}"] = params[f"{theirs}.{norm}.{p}"]
                        used.add(f"{theirs}.{norm}.{p}")
        load_with_extra_norms(state, mapping, params, used, zero)

    # -- decoding: JoeyNMT's step (the whole prefix, no cache) and its search ---------------------------------------
    def begin_decoding(self, src: Tensor) -> JoeyState:
        memory, src_mask = self._encode(src)
        return JoeyState(memory, src_mask, torch.zeros(src.size(0), 0, dtype=torch.long, device=src.device))

    def decode_step(self, state: JoeyState, tokens: Tensor) -> tuple[Tensor, JoeyState]:
        """The prefix grown by ``tokens`` (N,), decoded whole as ``search.py`` does at each step -> logits (N, V)."""
        prefix = torch.cat([state.prefix, self.tgt_ids[tokens][:, None]], dim=1)
        # search.py passes trg_mask = ones([1, 1, 1]): no target padding inside a prefix
        logits, _, _, _ = self.model(return_type="decode", encoder_output=state.memory, encoder_hidden=None,
                                     src_mask=state.src_mask, trg_input=prefix, unroll_steps=1, decoder_hidden=None,
                                     trg_mask=state.src_mask.new_ones([1, 1, 1]))
        return self._scores(logits[:, -1]), JoeyState(state.memory, state.src_mask, prefix)

    def reorder_state(self, state: JoeyState, indices: Tensor) -> JoeyState:
        return JoeyState(state.memory.index_select(0, indices), state.src_mask.index_select(0, indices),
                         state.prefix.index_select(0, indices))

    def test_options(self, *, beam_size: int, alpha: float, max_len: int | None) -> Any:
        """The ``testing`` section a user would write, parsed by ``joeynmt.config.parse_test_args``."""
        from joeynmt.config import parse_test_args

        testing = {**self.cfg.get("testing", {}), "beam_size": beam_size}
        if beam_size > 1:
            testing["beam_alpha"] = alpha
        if max_len is not None:
            testing["max_output_length"] = max_len
        return parse_test_args(testing, mode="translate")

    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                 max_len: int | None = None) -> Tensor:
        """``joeynmt.search.search`` on a JoeyNMT ``Batch`` of ``src``; each output cut after its first end symbol
        (as ``Vocabulary.arrays_to_sentences(cut_at_eos=True)``), right-padded."""
        from joeynmt.batch import Batch
        from joeynmt.search import search

        args = self.test_options(beam_size=beam_size, alpha=alpha, max_len=max_len)
        joey, src_mask = self._src(src)
        model = self.model
        bos, eos = int(self.tgt_ids[bos_id]), int(self.tgt_ids[eos_id])
        saved = model.bos_index, model.eos_index
        batch = Batch(src=joey, src_length=src_mask.sum(-1).view(-1), src_prompt_mask=None, trg=None,
                      trg_prompt_mask=None, indices=torch.arange(src.size(0)), device=src.device,
                      pad_index=model.pad_index, eos_index=eos, is_train=False)
        try:
            model.bos_index, model.eos_index = bos, eos
            output, _, _ = search(model=model, batch=batch, beam_size=args.beam_size, beam_alpha=args.beam_alpha,
                                  max_output_length=args.max_output_length, n_best=1,
                                  min_output_length=args.min_output_length, generate_unk=args.generate_unk,
                                  return_attention=False, return_prob="none",
                                  repetition_penalty=args.repetition_penalty,
                                  no_repeat_ngram_size=args.no_repeat_ngram_size)
        finally:
            model.bos_index, model.eos_index = saved
        rows = []
        for row in torch.as_tensor(output).long().tolist():
            if eos in row:
                row = row[:row.index(eos) + 1]
            else:  # beam_search stacks its hypotheses padded (pad_and_stack_hyps)
                while row and row[-1] == model.pad_index:
                    row.pop()
            rows.append([int(self.tgt_ids.argsort()[t]) for t in row])  # JoeyNMT id -> the audit's
        width = max([len(r) for r in rows] + [1])
        out = torch.full((len(rows), width), self.config.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return out

    # -- the recipe ------------------------------------------------------------------------------------------------
    def _training(self, train_config: TrainConfig | None) -> Any:
        from joeynmt.config import parse_train_args

        section = self.cfg.get("training", {})
        if train_config is not None and self._config_fn is not None:
            section = self._config_fn(self.config, train_config)["training"]
        return parse_train_args(dict(section), mode="translate")

    def make_optimizer(self, params: Iterable[nn.Parameter], train_config: TrainConfig | None = None
                       ) -> torch.optim.Optimizer:
        """``joeynmt.builders.build_optimizer`` with the parsed ``training`` section, as the trainer calls it."""
        from joeynmt.builders import build_optimizer

        return build_optimizer(cfg=self._training(train_config)._asdict(), parameters=params)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig | None = None) -> Any:
        """``build_scheduler``'s scheduler, stepped as the trainer steps it: after update k (counted from 0 by
        ``stats.steps``) ``scheduler.step(k)`` sets the rate of update k + 1."""
        from joeynmt.builders import build_scheduler

        args = self._training(train_config)
        scheduler, step_at = build_scheduler(cfg=args._asdict(), optimizer=optimizer,
                                             scheduler_mode="min" if args.minimize_metric else "max",
                                             hidden_size=self.model.encoder._output_size)
        return TrainerSteps(scheduler if step_at == "step" else None)

    def make_criterion(self, train_config: TrainConfig | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """``XentLoss(pad_index, smoothing=label_smoothing)`` on the log-softmax of the logits (the model's
        ``return_type="loss"`` path), divided as ``Batch.normalize`` divides it: by the real target tokens with
        ``normalization: tokens``; ``batch`` divides by the sentences, which a flattened call cannot count, so it
        is left summed."""
        from joeynmt.loss import XentLoss

        args = self._training(train_config)
        loss = XentLoss(pad_index=self.model.pad_index, smoothing=args.label_smoothing)
        ids = self.tgt_ids

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:
            joey_labels = ids[labels]
            log_probs = torch.log_softmax(scores.index_select(-1, ids.argsort()), dim=-1)  # JoeyNMT's column order
            total = loss(log_probs, trg=joey_labels)
            if args.normalization == "tokens":
                return total / (joey_labels != JOEY_PAD).sum().clamp_min(1)
            return total

        return criterion

    def make_batch(self, target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        """JoeyNMT's ``Batch`` on a training batch: ``trg = <s> target``; the decoder input is ``trg`` with every
        ``</s>`` made padding, cut by one (``has_eos``, "true in training": its datasets end every target with
        ``</s>``); the labels ``trg[:, 1:]``. ``</s>`` is JoeyNMT's id 3, relabelled to the audit's ids."""
        trg = torch.cat([torch.full_like(target[:, :1], bos_id), target], dim=1)
        eos = int(self.tgt_ids.argsort()[self.model.eos_index])  # the audit's id of JoeyNMT's </s>
        trg_input = torch.where(trg == eos, torch.full_like(trg, self.config.pad_id), trg)
        return trg_input[:, :-1], trg[:, 1:]


class TrainerSteps:
    """JoeyNMT's trainer around its scheduler: ``scheduler.step(stats.steps)`` after each update, then
    ``stats.steps += 1`` (joeynmt/training.py:444, :450); no scheduler: a constant rate."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.steps = 0

    def step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step(self.steps)
        self.steps += 1


class _Registration(JoeyAdapter):
    def __init__(self, config: ModelConfig, config_fn: Callable[..., dict[str, Any]]):
        super().__init__(config, config_fn(config))
        self._config_fn = config_fn


def build_paper(config: ModelConfig) -> JoeyAdapter:
    return _Registration(config, paper_config)


class _Defaults(_Registration):
    """JoeyNMT's trainer cannot run without a ``scheduling`` option (None is refused, and ``plateau``, the first it
    lists, passes ``verbose=`` to torch's ReduceLROnPlateau, which torch 2.13 no longer takes): no schedule to
    expose, so the suite's checks of one skip and its training uses the reference's."""

    make_scheduler = None  # type: ignore[assignment]


def build_defaults(config: ModelConfig) -> JoeyAdapter:
    return _Defaults(config, default_config)


# -- checkpoints as JoeyNMT's trainer saves them ----------------------------------------------------------------
ACCEPTED = ("accepted: a .ckpt saved by JoeyNMT 2.x's trainer (a dict with 'model_state'), in its model directory "
            "with the config.yaml, src_vocab.txt and trg_vocab.txt the trainer writes there")


def read_checkpoint(path: str) -> Checkpoint:
    """A JoeyNMT checkpoint with its model directory's ``config.yaml`` and vocabulary files."""
    ckpt = Path(path)
    try:
        saved = torch.load(str(ckpt), map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise ValueError(f"not a JoeyNMT checkpoint (torch.load failed: {type(exc).__name__}: {text}); "
                         f"{ACCEPTED}") from None
    if not isinstance(saved, dict) or "model_state" not in saved:
        found = f"a dict with keys {sorted(saved)[:6]}" if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"not a JoeyNMT checkpoint (found {found}); {ACCEPTED}")
    folder = ckpt.resolve().parent
    missing = [n for n in ("config.yaml", "src_vocab.txt", "trg_vocab.txt") if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"a JoeyNMT checkpoint without {', '.join(missing)} beside it in {folder}; {ACCEPTED}")
    from joeynmt.config import load_config
    from joeynmt.vocabulary import Vocabulary

    cfg = load_config(folder / "config.yaml")
    symbols = cfg.get("data", {}).get("special_symbols", {})
    if symbols:
        raise ValueError(f"a JoeyNMT checkpoint whose config sets special_symbols {symbols}: this reader takes "
                         "JoeyNMT's default special symbols")
    src_vocab = Vocabulary([t for t in (folder / "src_vocab.txt").read_text().splitlines()], specials())
    trg_vocab = Vocabulary([t for t in (folder / "trg_vocab.txt").read_text().splitlines()], specials())
    model_cfg = cfg["model"]
    enc, dec = model_cfg["encoder"], model_cfg["decoder"]
    if enc.get("type", "recurrent") != "transformer" or dec.get("type", "transformer") != "transformer":
        raise ValueError(f"a JoeyNMT checkpoint with encoder type {enc.get('type', 'recurrent')!r} and decoder type "
                         f"{dec.get('type', 'transformer')!r}; {ACCEPTED}")
    if enc["num_layers"] != dec["num_layers"]:
        raise ValueError(f"a JoeyNMT checkpoint with {enc['num_layers']} encoder and {dec['num_layers']} decoder "
                         "layers: ModelConfig has one N for both stacks")
    tied = bool(model_cfg.get("tied_embeddings", False) and model_cfg.get("tied_softmax", False))
    config = ModelConfig(src_vocab=len(src_vocab), tgt_vocab=len(trg_vocab), d_model=enc["hidden_size"],
                         n_heads=enc["num_heads"], d_ff=enc["ff_size"], n_layers=enc["num_layers"],
                         dropout=float(enc.get("dropout", 0.0)),
                         max_len=int(cfg.get("data", {}).get("src", {}).get("max_length", 0) or 5000),
                         pad_id=0, share_embeddings=tied)  # JoeyNMT's <pad> (1) is the audit's 0: joey_ids
    state = {f"model.{k}": v for k, v in saved["model_state"].items()}

    def build(cfg_: ModelConfig) -> JoeyAdapter:
        sized = copy.deepcopy(cfg)
        for side in ("encoder", "decoder"):
            s = sized["model"][side]
            embeddings = s.setdefault("embeddings", {})
            if embeddings.get("dropout", s.get("dropout", 0.0)) == s.get("dropout", 0.0):  # one P_drop (model.py:368)
                embeddings.pop("dropout", None)
            s.update(num_layers=cfg_.n_layers, num_heads=cfg_.n_heads, hidden_size=cfg_.d_model, ff_size=cfg_.d_ff,
                     dropout=cfg_.dropout)
            embeddings["embedding_dim"] = cfg_.d_model
        if not cfg_.share_embeddings:
            sized["model"]["tied_embeddings"] = sized["model"]["tied_softmax"] = False
        same = (cfg_.src_vocab, cfg_.tgt_vocab) == (config.src_vocab, config.tgt_vocab)
        return JoeyAdapter(cfg_, sized, (src_vocab, trg_vocab) if same else None)

    stats = saved.get("stats_state")
    steps = stats.get("steps") if isinstance(stats, dict) else None
    return Checkpoint(config=config, state=state, build=build,
                      describes=f"JoeyNMT checkpoint{f', step {steps}' if isinstance(steps, int) else ''} "
                                f"({config.n_layers} layers, d_model {config.d_model}, vocabularies "
                                f"{config.src_vocab}/{config.tgt_vocab})")


# -- declarations -----------------------------------------------------------------------------------------------
TL, SE, BU, TRN = "joeynmt/transformer_layers.py", "joeynmt/search.py", "joeynmt/builders.py", "joeynmt/training.py"
CF, EN, DE, EM = "joeynmt/config.py", "joeynmt/encoders.py", "joeynmt/decoders.py", "joeynmt/embeddings.py"
VO, BA, MO, LO = "joeynmt/vocabulary.py", "joeynmt/batch.py", "joeynmt/model.py", "joeynmt/loss.py"

# Every file:line the reasons and notes cite, with a fragment of that line (tests/test_toolkit_joeynmt.py reads them).
LINES: dict[str, str] = {
    f"{TL}:38": "self.k_layer = nn.Linear(size, num_heads * head_size)",
    f"{TL}:42": "self.output_layer = nn.Linear(size, size)",
    f"{TL}:91": 'scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))',
    f"{TL}:94": "attention_weights = self.softmax(scores)",
    f"{TL}:95": "attention_probs = self.dropout(attention_weights)",
    f"{TL}:143": "self.layer_norm = nn.LayerNorm(input_size, eps=1e-6)",
    f"{TL}:147": "nn.Dropout(dropout),",
    f"{TL}:245": "self.layer_norm = nn.LayerNorm(size, eps=1e-6)",
    f"{SE}:294": "if step < min_output_length:",
    f"{SE}:588": "for forbidden_index in [bos_index, pad_index, sep_index] + model.lang_tags:",
    f"{SE}:597": "if step < min_output_length:",
    f"{SE}:624": "length_penalty = ((5.0 + (step + 1)) / 6.0)**alpha",
    f"{SE}:668": "is_finished = topk_ids.eq(eos_index) | is_finished | topk_scores.eq(-np.inf)",
    f"{SE}:673": "end_condition = is_finished.all(-1)",
    f"{SE}:859": "max_output_length = int(max(batch.src_length.cpu().numpy()) * 1.5)",
    f"{BU}:110": 'kwargs["betas"] = cfg.get("adam_betas", (0.9, 0.999))',
    f"{BU}:111": "optimizer = torch.optim.Adam(parameters, **kwargs)",
    f"{BU}:173": 'scheduler_name = cfg.get("scheduling", None)',
    f"{BU}:179": '"verbose": False,',
    f"{BU}:185": "scheduler = ReduceLROnPlateau(optimizer=optimizer, **kwargs)",
    f"{BU}:226": "raise ConfigurationError(",
    f"{TRN}:437": "self.optimizer.step()",
    f"{TRN}:444": "self.scheduler.step(self.stats.steps)",
    f"{TRN}:450": "self.stats.steps += 1",
    f"{CF}:128": 'special_symbols["pad_id"] = special_symbols.get("pad_id", 1)',
    f"{CF}:312": 'label_smoothing=cfg.get("label_smoothing", 0.0),',
    f"{CF}:315": 'learning_rate=cfg.get("learning_rate", 0.005),',
    f"{CF}:422": 'max_output_length=cfg.get("max_output_length", -1),',
    f"{CF}:423": 'min_output_length=cfg.get("min_output_length", 1),',
    f"{EN}:208": 'layer_norm=kwargs.get("layer_norm", "pre"),',
    f"{EN}:218": 'if kwargs.get("layer_norm", "post") == "pre" else None',
    f"{DE}:537": 'layer_norm=kwargs.get("layer_norm", "post"),',
    f"{DE}:549": "self.output_layer = nn.Linear(hidden_size, vocab_size, bias=False)",
    f"{EM}:28": "scale: bool = False,",
    f"{EM}:63": "return self.lut(x) * math.sqrt(self.embedding_dim)",
    f"{VO}:34": "self.specials = [cfg.unk_token, cfg.pad_token, cfg.bos_token, cfg.eos_token]",
    f"{BA}:73": "has_eos = torch.any(trg == eos_index).item()  # true in training",
    f"{BA}:74": "trg_input = torch.where(trg == eos_index, pad_index, trg)",
    f"{MO}:352": 'if cfg.get("tied_embeddings", False):',
    f"{MO}:418": 'if cfg.get("tied_softmax", False):',
    f"{LO}:40": "smooth_dist.fill_(self.smoothing / (vocab_size - 2))",
}

PARAMETERS = (
    f"beyond the schema: a bias on every attention projection, q, k, v and output (nn.Linear's default, "
    f"{TL}:38-42; 4 x d_model per attention, 24 x d_model at N = 2), with no option to leave them out"
)
EXTRA_DROPOUT = (
    f"every dropout of a layer takes the layer's one `dropout` rate: the attention weights are dropped "
    f"({TL}:95) and so are the FFN's hidden units ({TL}:147), at P_drop; there is no option for either alone"
)
FINITE = (
    f"attention masks with -inf ({TL}:91) before the softmax ({TL}:94): a query whose keys are all padding (a "
    "fully padded source row) gets NaN, which reaches every output of that row"
)
BEAM = (
    f"search.py's beam search keeps finished hypotheses in the K beam slots (a finished beam stays finished there, "
    f"{SE}:668) and stops a source only when all K slots have finished ({SE}:673), not when no live hypothesis can "
    f"beat the finished ones; it forbids the end symbol at the first step (min_output_length defaults to 1, "
    f"{CF}:423, applied at {SE}:597) and never emits the start or padding symbols ({SE}:588); the length penalty is "
    f"GNMT's ((5 + |Y|) / 6)^alpha ({SE}:624)"
)
MAX_LENGTH = (
    f"without max_output_length (default -1, {CF}:422) the limit is one number per batch, 1.5 x the longest "
    f"source length of the batch ({SE}:859): a source of 6 tokens is cut at 9, not at its length + 50, and every "
    "shorter source of the batch gets the longest one's limit"
)
ADAM = (
    f"build_optimizer passes the configured lr, betas and weight decay to torch.optim.Adam ({BU}:110-111) and "
    "nothing else: epsilon is torch's 1e-8, not §5.3's 1e-9, and no option sets it"
)
SCHEDULE = (
    f"the trainer steps the scheduler after the update ({TRN}:437, :444) with stats.steps counted from 0 "
    f"({TRN}:450), so the noam rate of step k is set for update k + 1: update k runs at Eq. (3)'s step k - 1, and "
    "update 1 at the configured learning_rate (here Eq. (3)'s step 1)"
)

GREEDY = (f"greedy search forbids the end symbol at the first step (min_output_length defaults to 1, {CF}:423, "
          f"applied at {SE}:294): where the end symbol is the most probable first token it emits another one")

DEVIATIONS: dict[str, str] = {
    "config.parameters": PARAMETERS,
    "dropout.extra-sites": EXTRA_DROPOUT,
    "mask.finite": FINITE,
    "decode.beam": BEAM,
    "decode.greedy": GREEDY,
    "decode.max-length": MAX_LENGTH,
    "train.optimizer": ADAM,
    "train.lr-schedule": SCHEDULE,
}

NOTES = (
    "Built by JoeyNMT's own `build_model` (joeynmt/model.py) from the `model` section a user would write: "
    "`encoder`/`decoder`: `type: transformer`, `num_layers: N`, `num_heads: h`, `hidden_size: d_model`, `ff_size: "
    "d_ff`, `dropout: P_drop`, `layer_norm: post`, `activation: relu`, `embeddings: {embedding_dim: d_model, scale: "
    "true, dropout: P_drop}`; `tied_embeddings` and `tied_softmax` as the configuration ties; `initializer: "
    "xavier_uniform`. Training section: `optimizer: adam`, `adam_betas: [0.9, 0.98]`, `scheduling: noam`, "
    "`learning_rate_warmup: 4000`, `learning_rate_factor: 1`, `learning_rate`: Eq. (3) at step 1 (the rate of the "
    "first update, before the scheduler's first step), `label_smoothing: 0.1`, `normalization: tokens`. Testing: "
    "`beam_size: K`, `beam_alpha: alpha`, `max_output_length: max_len` when a limit is given. "
    "Not deviations: post-norm (`layer_norm: post`, then no final norms are built), sqrt(d_model) (`scale: true`), "
    "three-way tying, ReLU, §3.5's interleaved sinusoids, the output layer without bias "
    f"({DE}:549); the projection biases are set to 0 by `load_reference_state` (declared under config.parameters). "
    f"The layer norms' epsilon is 1e-6 written in the code ({TL}:143, :245), the audit's default norm_eps: a "
    "configuration with another epsilon cannot be built. Label smoothing spreads eps over V - 2 classes, neither the "
    f"target nor padding ({LO}:40; the Annotated Transformer's convention). Token ids: JoeyNMT's vocabularies put "
    f"<unk>, <pad>, <s>, </s> first ({VO}:34), so its padding id is 1 ({CF}:128); the adapter relabels the ids so that "
    "the audit's padding, start and end symbols are JoeyNMT's <pad>, <s> and </s>. JoeyNMT's Transformer decoder "
    "has no cache: its search recomputes the "
    "whole prefix at every step, and so does `decode_step`. Its greedy search forbids the end symbol at the first "
    f"step as its beam search does ({SE}:294). Training batches: `trg = <s> target`, the "
    f"decoder reading it with every </s> made padding, cut by one ({BA}:73-74). "
    "Reproduce: `aiayn audit --impl joeynmt`; a checkpoint as JoeyNMT's trainer saved it: "
    "`pytest conformance/ --impl=joeynmt --weights models/NAME/best.ckpt` (config.yaml and the vocabulary files "
    f"beside it). Install beside this project's torch: `{INSTALL}`."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "joeynmt/")


build = build_paper

SOURCE = "https://github.com/joeynmt/joeynmt/tree/v2.3.0 (the installed joeynmt: joeynmt/model.py, search.py)"


@hookimpl
def register_implementations(register):
    unavailable = joeynmt_unavailable()
    register(Implementation(
        name="joeynmt", build=build_paper, output="logits", deviations=DEVIATIONS, notes=NOTES,
        summary="JoeyNMT 2.3.0 Transformer built by joeynmt.model.build_model toward the paper (post-norm, scaled, "
                "tied): biased projections, attention and FFN dropout, its search.py greedy and beam search",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=unavailable, read_checkpoint=read_checkpoint,
        install=INSTALL))

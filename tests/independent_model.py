"""A second conforming Transformer, written independently of ``reference/``.

The no-false-alarm control of the suite's own tests: it computes the paper's
function by other means, so a check that accuses it is a check that depends on
how the reference happens to be written, not on the paper.

Differences from the reference, all function-preserving:
- sequence-first internally: activations are (L, B, d_model);
- one fused Q|K|V projection for self-attention and a fused K|V projection for
  cross-attention (the canonical per-matrix weights are concatenated on load);
- attention written with ``torch.einsum`` over an explicit head axis, the
  mask applied additively from a float bias, empty rows zeroed afterwards;
- layer norm via ``torch.nn.functional.layer_norm``;
- the positional table from the exp/log form of §3.5, built once as a buffer;
- the output is log-probabilities (``log_softmax`` of the tied projection);
- decoding recomputes the prefix (``decode_step``) and ``generate`` is a per-source, list-based
  transcription of §6.1 and tensor2tensor's beam search (2K candidates, K alive, K finished kept aside,
  GNMT's penalty with |Y| counting the end symbol, t2t's early-stop bound), written without
  ``reference/decoding.py``'s batched tensors.

Its training recipe (the contract's recipe capabilities) is written apart from
``reference/training.py`` too, in the styles the contract must accept: AdamW with
no decay (which is Adam), a learning rate as a function of a loop counter that
starts at 0 (``learning_rate``), a KL-divergence criterion on log-probabilities
against the Annotated Transformer's smoothing (eps/(V-2), nothing on the padding
class), and a batch built by slicing a target that starts with BOS.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.spec.config import ModelConfig


def table(length: int, d_model: int) -> Tensor:
    """§3.5 via exp(-2i ln(10000) / d_model): (length, d_model), interleaved sin/cos."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    ang = pos * inv  # (L, d_model/2)
    return torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(1)[:, :d_model].float()  # (L, d_model)


class Attention(nn.Module):
    def __init__(self, d: int, h: int, fused_self: bool):
        super().__init__()
        self.h, self.dk = h, d // h
        self.fused_self = fused_self
        if fused_self:
            self.qkv = nn.Linear(d, 3 * d, bias=False)
        else:
            self.q = nn.Linear(d, d, bias=False)
            self.kv = nn.Linear(d, 2 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, mem: Tensor | None, allowed: Tensor) -> Tensor:
        """x (Lq, B, d), mem (Lk, B, d) or None, allowed (B, Lq|1, Lk) True = may attend -> (Lq, B, d)."""
        Lq, B, d = x.shape
        if self.fused_self:
            q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (Lq, B, d)
        else:
            q = self.q(x)
            k, v = self.kv(mem).chunk(2, dim=-1)  # 2 x (Lk, B, d)
        q = q.reshape(Lq, B, self.h, self.dk)  # (Lq, B, h, dk)
        k = k.reshape(k.size(0), B, self.h, self.dk)  # (Lk, B, h, dk)
        v = v.reshape(v.size(0), B, self.h, self.dk)
        s = torch.einsum("qbhd,kbhd->bhqk", q, k) * self.dk ** -0.5  # (B, h, Lq, Lk)
        bias = torch.zeros(allowed.shape, dtype=s.dtype, device=s.device).masked_fill(~allowed, float("-inf"))
        empty = ~allowed.any(-1)  # (B, Lq|1)
        bias = bias.masked_fill(empty[..., None], 0.0)  # keep empty rows finite, zeroed below
        w = torch.softmax(s + bias[:, None], dim=-1)  # over keys
        w = w.masked_fill(empty[:, None, :, None], 0.0)
        o = torch.einsum("bhqk,kbhd->qbhd", w, v).reshape(Lq, B, d)  # concat heads per position
        return self.out(o)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, cross: bool):
        super().__init__()
        d = cfg.d_model
        self.self_attn = Attention(d, cfg.n_heads, fused_self=True)
        self.cross_attn = Attention(d, cfg.n_heads, fused_self=False) if cross else None
        self.ff1, self.ff2 = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)
        n = 3 if cross else 2
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(d)) for _ in range(n))
        self.shifts = nn.ParameterList(nn.Parameter(torch.zeros(d)) for _ in range(n))
        self.eps, self.p = cfg.norm_eps, cfg.dropout

    def _res(self, i: int, x: Tensor, sub: Tensor) -> Tensor:
        x = x + F.dropout(sub, self.p, self.training)
        return F.layer_norm(x, x.shape[-1:], self.gains[i], self.shifts[i], self.eps)

    def forward(self, x: Tensor, self_allowed: Tensor, mem: Tensor | None = None, mem_allowed=None) -> Tensor:
        x = self._res(0, x, self.self_attn(x, None, self_allowed))
        if self.cross_attn is not None:
            x = self._res(1, x, self.cross_attn(x, mem, mem_allowed))
        return self._res(len(self.gains) - 1, x, self.ff2(F.relu(self.ff1(x))))


class Independent(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.emb_src = nn.Parameter(torch.randn(cfg.src_vocab, cfg.d_model) * cfg.d_model ** -0.5)
        self.emb_tgt = self.emb_src if cfg.share_embeddings else nn.Parameter(
            torch.randn(cfg.tgt_vocab, cfg.d_model) * cfg.d_model ** -0.5)
        self.proj = self.emb_src if cfg.share_embeddings else nn.Parameter(
            torch.randn(cfg.tgt_vocab, cfg.d_model) * cfg.d_model ** -0.5)
        self.enc = nn.ModuleList(Block(cfg, cross=False) for _ in range(cfg.n_layers))
        self.dec = nn.ModuleList(Block(cfg, cross=True) for _ in range(cfg.n_layers))
        self.register_buffer("table", table(cfg.max_len, cfg.d_model), persistent=False)

    def positional_encoding(self, length: int) -> Tensor:
        return self.table[:length] if length <= self.table.size(0) else table(length, self.cfg.d_model)

    def _inputs(self, ids: Tensor, emb: Tensor) -> Tensor:
        x = F.embedding(ids.t(), emb) * self.cfg.d_model ** 0.5  # (L, B, d)
        x = x + self.positional_encoding(ids.size(1)).to(x)[:, None]
        return F.dropout(x, self.cfg.dropout, self.training)

    def encode(self, src: Tensor) -> Tensor:
        keys = (src != self.cfg.pad_id)[:, None, :]  # (B, 1, S)
        x = self._inputs(src, self.emb_src)
        for blk in self.enc:
            x = blk(x, keys)
        return x.transpose(0, 1)  # (B, S, d)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        keys = (src != self.cfg.pad_id)[:, None, :]  # (B, 1, S)
        mem = self.encode(src).transpose(0, 1)  # (S, B, d)
        T = tgt.size(1)
        pos = torch.arange(T, device=tgt.device)
        allowed = (pos[None, :] <= pos[:, None])[None] & (tgt != self.cfg.pad_id)[:, None, :]  # (B, T, T)
        y = self._inputs(tgt, self.emb_tgt)
        for blk in self.dec:
            y = blk(y, allowed, mem, keys)
        return torch.log_softmax(y.transpose(0, 1) @ self.proj.t(), dim=-1)  # (B, T, V)

    # -- decoding, written apart from reference/decoding.py -------------------------------------------------
    def begin_decoding(self, src: Tensor):
        return src, src[:, :0]

    def decode_step(self, state, tokens: Tensor):
        src, ys = state
        ys = torch.cat([ys, tokens[:, None]], dim=1)
        return self(src, ys)[:, -1], (src, ys)

    def reorder_state(self, state, indices: Tensor):
        return state[0][indices], state[1][indices]

    def _next(self, src: Tensor, prefixes: list[list[int]]) -> list[list[float]]:
        logp = self(src.expand(len(prefixes), -1), torch.tensor(prefixes, device=src.device))[:, -1].double()
        logp[:, self.cfg.pad_id] = -math.inf  # padding is never generated
        return logp.tolist()

    @torch.no_grad()
    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int = 4, alpha: float = 0.6,
                 max_len: int | None = None) -> Tensor:
        pad = self.cfg.pad_id
        outs = []
        for b in range(src.size(0)):
            one = src[b:b + 1]
            limit = int((one != pad).sum()) + 50 if max_len is None else max_len
            if beam_size == 1:
                out: list[int] = []
                while len(out) < limit and eos_id not in out:
                    row = self._next(one, [[bos_id] + out])[0]
                    out.append(max(range(len(row)), key=row.__getitem__))
            else:
                out = self._beam(one, bos_id, eos_id, beam_size, alpha, limit)
            outs.append(out)
        width = max((len(o) for o in outs), default=0)
        return torch.tensor([o + [pad] * (width - len(o)) for o in outs], dtype=torch.long).view(len(outs), width)

    def _beam(self, one: Tensor, bos_id: int, eos_id: int, k: int, alpha: float, limit: int) -> list[int]:
        def lp(n: int) -> float:
            return ((5.0 + n) / 6.0) ** alpha

        alive: list[tuple[float, list[int]]] = [(0.0, [])]
        finished: list[tuple[float, list[int]]] = []
        for i in range(limit):
            rows = self._next(one, [[bos_id] + seq for _, seq in alive])
            grown = sorted(((s + x, seq + [v]) for (s, seq), row in zip(alive, rows) for v, x in enumerate(row)
                            if x > -math.inf), key=lambda c: c[0], reverse=True)[:2 * k]
            finished = sorted(finished + [(s / lp(i + 1), seq) for s, seq in grown if seq[-1] == eos_id],
                              key=lambda c: c[0], reverse=True)[:k]
            alive = [(s, seq) for s, seq in grown if seq[-1] != eos_id][:k]
            if finished and min(f[0] for f in finished) > alive[0][0] / lp(limit):
                break
        return finished[0][1] if finished else alive[0][1]

    @torch.no_grad()
    def load_reference_state(self, state) -> None:
        self.emb_src.copy_(state["src_embed.weight"])
        if not self.cfg.share_embeddings:
            self.emb_tgt.copy_(state["tgt_embed.weight"])
            self.proj.copy_(state["generator.weight"])
        for stack, blocks, norms in (("encoder", self.enc, 2), ("decoder", self.dec, 3)):
            for i, blk in enumerate(blocks):
                p = f"{stack}.{i}"
                blk.self_attn.qkv.weight.copy_(torch.cat([state[f"{p}.self_attn.{n}.weight"] for n in "qkv"]))
                blk.self_attn.out.weight.copy_(state[f"{p}.self_attn.o.weight"])
                if blk.cross_attn is not None:
                    blk.cross_attn.q.weight.copy_(state[f"{p}.cross_attn.q.weight"])
                    blk.cross_attn.kv.weight.copy_(torch.cat([state[f"{p}.cross_attn.{n}.weight"] for n in "kv"]))
                    blk.cross_attn.out.weight.copy_(state[f"{p}.cross_attn.o.weight"])
                for ours, theirs in (("ff1", "w1"), ("ff2", "w2")):
                    getattr(blk, ours).weight.copy_(state[f"{p}.ffn.{theirs}.weight"])
                    getattr(blk, ours).bias.copy_(state[f"{p}.ffn.{theirs}.bias"])
                for j in range(norms):
                    blk.gains[j].copy_(state[f"{p}.norm{j + 1}.weight"])
                    blk.shifts[j].copy_(state[f"{p}.norm{j + 1}.bias"])

    # -- its own training recipe -------------------------------------------------------------------------------
    def make_optimizer(self, params, train_config):
        return torch.optim.AdamW(params, lr=1.0, betas=train_config.betas, eps=train_config.adam_eps, weight_decay=0.0)

    def learning_rate(self, step_num, train_config):
        counter = step_num - 1  # this loop's counter is 0 at the first update; the rate uses counter + 1
        s = counter + 1.0
        return self.cfg.d_model ** -0.5 * min(1.0 / math.sqrt(s), s / train_config.warmup_steps ** 1.5)

    def make_criterion(self, train_config):
        return SmoothedKL(self.cfg.tgt_vocab, train_config.label_smoothing, self.cfg.pad_id)

    def make_batch(self, target, bos_id):
        seq = F.pad(target, (1, 0), value=bos_id)  # (B, 1 + T): BOS, then the target
        return seq[:, :-1], seq[:, 1:]


class SmoothedKL(nn.Module):
    """KL(true || model) summed, divided by the real tokens; true = 1 - eps on the label, eps/(V-2) elsewhere
    except the padding class; padding labels have no true distribution."""

    def __init__(self, vocab: int, eps: float, pad: int):
        super().__init__()
        self.vocab, self.eps, self.pad = vocab, eps, pad

    def forward(self, log_probs: Tensor, labels: Tensor) -> Tensor:
        true = torch.full_like(log_probs, self.eps / (self.vocab - 2))
        true.scatter_(1, labels[:, None], 1.0 - self.eps)
        true[:, self.pad] = 0.0
        true[labels == self.pad] = 0.0
        return F.kl_div(log_probs, true, reduction="sum") / (labels != self.pad).sum().clamp_min(1)


@hookimpl
def register_implementations(register):
    register(Implementation(name="independent", build=Independent, output="log_probs",
                            summary="a conforming model written apart from the reference (sequence-first, fused QKV, "
                                    "einsum)", source="tests/independent_model.py"))

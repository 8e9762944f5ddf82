"""Stage 6: the plugin as render.py writes it, run against the reference -> :class:`Scaffold`, whose text is
unmarked only where this proved it.

The plugin's adapter is built at the probe's sizes without dropout, loads the visible canonical weights (the
transplant-based checks' weights: gains far from 1, biases far from 0, sharp attention) through its
``load_reference_state`` (learned positional tables get the sinusoid for the probe), and runs on a padded batch
beside the reference holding the same weights. Where the log-probabilities agree at every real target position the
whole mapping is proved; where only the encoder's output agrees (through ``encode``), the encoder's lines and the
source embedding are.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from aiayn_conformance.conformance.helpers.transplant import STATE_SEED, reference_twin, visible_state
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import as_log_probs

from .masks import probe_batch
from .proposal import Proposed
from .render import Proof, render

TOLERANCE = 1e-4


@dataclass
class Scaffold:
    """Stage 6's record: the proposal, what the value probe proved, and the plugin's text."""

    proposed: Proposed
    proof: Proof
    text: str

    @property
    def name(self) -> str:
        return self.proposed.probed.built.loaded.name

    @property
    def notes(self) -> list[str]:
        return self.proposed.probed.built.loaded.notes

    @property
    def checks(self) -> int:
        return self.text.count("# CHECK:")


def prove(proposed: Proposed) -> Scaffold:
    """The value probe run on the plugin as written unproved, and the plugin written again with what it proved."""
    probed = proposed.probed
    config = probed.built.config.replace(d_ff=probed.d_ff)  # a model ignoring d_ff is probed at its own width
    proof = run_probe(render(proposed), config, probed.forward.output, probed.table.learned or [])
    return Scaffold(proposed, proof, render(proposed, proof))


def _module(text: str) -> types.ModuleType:
    module = types.ModuleType("aiayn_scaffold_probe")
    exec(compile(text, "<the scaffold's plugin>", "exec"), module.__dict__)  # noqa: S102
    return module


def _learned_sinusoids(adapter: Any, ref: Any, learned: list[str]) -> None:
    """The probe's learned positional tables hold the paper's sinusoid (the mapping is what is probed)."""
    for name in learned:
        p = adapter.model.get_parameter(name)
        rows = p.shape[-2]
        with torch.no_grad():
            p.copy_(ref._table(rows).reshape(p.shape).to(p.dtype))


def run_probe(text: str, config: ModelConfig, output: str, learned: list[str]) -> Proof:
    """Run the value probe on the plugin ``text`` (see the module's docstring)."""
    config = config.replace(dropout=0.0)
    state = visible_state(config, seed=STATE_SEED)
    try:
        adapter = _module(text).Adapter(config).eval()
        adapter.load_reference_state({k: v.detach().clone() for k, v in state.items()})
    except Exception as exc:
        return Proof(detail=f"the plugin could not load the canonical weights ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})")
    ref = reference_twin(config, state)
    table_gap = _table_gap(adapter, ref, config)  # before the probe's sinusoids go into learned tables
    _learned_sinusoids(adapter, ref, learned)
    src, tgt = probe_batch(config)
    proof = Proof(table_gap=table_gap)
    with torch.no_grad():
        try:
            mine = as_log_probs(adapter(src, tgt), output)[tgt != config.pad_id]
            gap = float((mine - as_log_probs(ref(src, tgt), "logits")[tgt != config.pad_id]).abs().max())
        except Exception as exc:
            return Proof(detail=f"the probe's forward raised {type(exc).__name__}")
        if gap <= TOLERANCE:
            proof.proved.add("model")
        enc_gap = _encoder_gap(adapter, ref, src, config)
    if enc_gap is not None and enc_gap <= TOLERANCE:
        proof.proved.add("encoder")
    enc = "" if enc_gap is None else f", encoder output max |diff| {enc_gap:.2g}"
    proof.detail = (f"with the visible canonical weights loaded through this mapping, the log-probabilities differ "
                    f"from the reference's by max {gap:.2g}{enc} (tolerance {TOLERANCE:g})")
    return proof


def _table_gap(adapter: Any, ref: Any, config: ModelConfig) -> float | None:
    if not hasattr(adapter, "positional_encoding"):
        return None
    try:
        with torch.no_grad():
            mine = adapter.positional_encoding(config.max_len).double()
    except Exception:
        return None
    theirs = ref.positional_encoding(config.max_len).double()
    return float((mine - theirs).abs().max()) if mine.shape == theirs.shape else float("inf")


def _encoder_gap(adapter: Any, ref: Any, src: torch.Tensor,
                 config: ModelConfig) -> float | None:
    if not hasattr(adapter, "encode"):
        return None
    try:
        mine = adapter.encode(src)
    except Exception:
        return None
    theirs = ref.encode(src)
    if mine.shape != theirs.shape:
        return None
    real = src != config.pad_id
    return float((mine.double() - theirs.double())[real].abs().max())

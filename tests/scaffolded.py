"""Helpers of the scaffold's tests: the plugin the scaffold writes, imported as written, and the check that it
computes the reference's function on the canonical weights."""

from __future__ import annotations

import types

import torch

from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state
from aiayn_conformance.scaffold import render, scaffold
from aiayn_conformance.spec.config import TINY


def plugin_module(target: str, name: str = "scaffolded") -> types.ModuleType:
    """The scaffold's plugin for ``target``, imported as written (every CHECK line accepted)."""
    text = render(scaffold(target, name))
    module = types.ModuleType(f"scaffolded_{abs(hash(target))}")
    exec(compile(text, f"<scaffold of {target}>", "exec"), module.__dict__)
    return module


def reproduces_the_reference(target: str):
    """The plugin as written loads the canonical weights so that the model computes the reference's outputs;
    returns (the adapter, the reference twin) for further comparisons."""
    config = TINY.replace(dropout=0.0)
    adapter = plugin_module(target).Adapter(config).eval()
    state = visible_state(config, seed=6)
    adapter.load_reference_state(state)
    ref = reference_twin(config, state)
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    tgt = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(adapter(src, tgt)[tgt != 0], ref(src, tgt)[tgt != 0], rtol=1e-4, atol=1e-4)
    return adapter, ref


# -- plugins of NMT toolkits, checked in a fresh process (tests/test_scaffold_toolkits.py) ----------------------------
def plugin_file(path: str) -> types.ModuleType:
    """The plugin file at ``path``, imported as ``aiayn --plugin`` would import it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaffolded_plugin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")


def opennmt_gaps(path: str, seed: int = 7) -> dict[str, float]:
    """OpenNMT-py's model (pre-norm: the paper's arrangement of sub-layers it is not) loaded through the plugin at
    ``path``: each part computed by OpenNMT-py's own modules against the reference's part holding the same canonical
    weights, where the part is the paper's: each sub-layer with the norm before it, the embeddings with their scale
    and sinusoid, the pre-softmax projection; and the norms the paper lacks (a gain of 1, a bias of 0)."""
    config = TINY.replace(dropout=0.0)
    adapter = plugin_file(path).Adapter(config).eval()
    state = visible_state(config, seed=seed)
    adapter.load_reference_state(state)
    model, ref = adapter.model, reference_twin(config, state)
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, 5, config.d_model, generator=g), torch.randn(2, 7, config.d_model, generator=g)
    src, tgt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]] * 2), torch.tensor([[1, 2, 3, 4, 5]] * 2)

    def attend(module, query, kv):  # OpenNMT-py's order: key, value, query
        return module(kv, kv, query, mask=None)[0]

    gaps: dict[str, float] = {}
    with torch.no_grad():
        for i in range(config.n_layers):
            enc, r = model.encoder.transformer[i], ref.encoder[i]
            gaps[f"encoder.{i} norm1, self_attn"] = _gap(attend(enc.self_attn, enc.layer_norm(x), enc.layer_norm(x)),
                                                         r.self_attn(r.norm1(x), r.norm1(x), r.norm1(x)))
            gaps[f"encoder.{i} norm2, ffn"] = _gap(enc.feed_forward(x) - x, r.ffn(r.norm2(x)))
            dec, r = model.decoder.transformer_layers[i], ref.decoder[i]
            gaps[f"decoder.{i} norm1, self_attn"] = _gap(attend(dec.self_attn, dec.layer_norm_1(x),
                                                                dec.layer_norm_1(x)),
                                                         r.self_attn(r.norm1(x), r.norm1(x), r.norm1(x)))
            gaps[f"decoder.{i} norm2, cross_attn"] = _gap(attend(dec.context_attn, dec.layer_norm_2(x), memory),
                                                          r.cross_attn(r.norm2(x), memory, memory))
            gaps[f"decoder.{i} norm3, ffn"] = _gap(dec.feed_forward(x) - x, r.ffn(r.norm3(x)))
        gaps["src_embed, positions"] = _gap(model.encoder.embeddings(src[..., None]), ref.embed(src, ref.src_embed))
        gaps["tgt_embed, positions"] = _gap(model.decoder.embeddings(tgt[..., None]), ref.embed(tgt, ref.tgt_embed))
        gaps["generator"] = _gap(model.generator(x), ref.generator(x))
        for stack in (model.encoder, model.decoder):  # the stacks' final norms, which the paper lacks
            gaps["final norms"] = max(gaps.get("final norms", 0.0), _gap(stack.layer_norm.weight, torch.ones(32)),
                                      _gap(stack.layer_norm.bias, torch.zeros(32)))
    return gaps


def joeynmt_gap(path: str, seed: int = 7) -> float:
    """JoeyNMT's model loaded through the plugin at ``path``, run by its own ``_encode_decode`` on a padded batch
    (masks True at real tokens, as JoeyNMT's batches build them): max |log-probability - the reference's| at the
    real target positions."""
    config = TINY.replace(dropout=0.0)
    adapter = plugin_file(path).Adapter(config).eval()
    state = visible_state(config, seed=seed)
    adapter.load_reference_state(state)
    ref = reference_twin(config, state)
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    tgt = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    with torch.no_grad():
        out = adapter.model._encode_decode(src=src, trg_input=tgt, src_mask=(src != 0).unsqueeze(1),
                                           src_length=(src != 0).sum(1), trg_mask=(tgt != 0).unsqueeze(1))[0]
        return _gap(out.log_softmax(-1)[tgt != 0], ref(src, tgt).log_softmax(-1)[tgt != 0])

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

"""The last steps of :func:`aiayn_conformance.scaffold.scaffold`: the adapter completed (scaffold/complete.py:
encode, the positional table, the repository's initialisation, the sizes the model ignores) and the value probe
(scaffold/proof.py) run on the plugin as it would be written, deciding which lines stay marked."""

from __future__ import annotations

import copy

from .complete import encode_hook, find_init, ignored_sizes, init_works, positional
from .masks import Found
from .probe import PROBE
from .proof import prove
from .proposal import propose
from .render import Scaffold, render


def finish(s: Scaffold, model, found: Found | None) -> Scaffold:
    """``s`` completed and probed (``model``: the class built with PROBE; ``found``: the mask convention)."""
    if found is not None:
        src, tgt = found.convention or (None, None)
        said = (f"masks found by probing the forward: source {src.describe()}, target {tgt.describe()}"
                if src and tgt else found.tried)
        s.masks = said
    lines, call = s.forward_call[:-1], s.forward_call[-1].removeprefix("return ")
    s.encode_hook = encode_hook(model, s.proposal, PROBE, lines, call, s.encode)
    s.table = positional(s.positional, model, PROBE)
    s.init = find_init(s.cls)
    broken = init_works(s.init, copy.deepcopy(model))
    if broken:
        s.init.check = broken
    ffn = ignored_sizes(s.cls, s.constructor, model, PROBE)
    if ffn is not None:
        s.ignored = {"d_ff": ffn[1]}
        s.proposal = propose(model, PROBE, ffn)
    at = PROBE.replace(d_ff=ffn[0]) if ffn else PROBE  # a model ignoring d_ff is probed at its own width
    s.proof = prove(render(s), at, s.output, s.table.learned or [])
    return s

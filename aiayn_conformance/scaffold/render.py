"""Rendering: the plugin file's text, from what the probe found and the proposal decided (:class:`Scaffold`).

Every line the user must review carries ``# CHECK:`` and the reason; the file's docstring counts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .probe import PROBE, Constructor
from .proposal import Line, Proposal


@dataclass
class Scaffold:
    """Everything the generated plugin needs."""

    cls: type
    where: str
    import_line: str
    constructor: Constructor
    proposal: Proposal
    name: str
    forward_call: list[str]
    forward_check: str
    output: str
    output_check: str
    encode: str
    positional: str
    notes: list[str] = field(default_factory=list)  # what the target's loading left out (a notebook's skipped cells)

    @property
    def checks(self) -> int:
        return render(self).count("# CHECK:")


def render(s: Scaffold) -> str:
    """The plugin file's text."""
    text = _head(s) + _adapter(s) + _registration(s)
    text = re.sub(r"\n{3,}(?=@hookimpl)", "\n\n\n", text)
    return text.replace("{checks}", str(text.count("# CHECK:")))


# -- the lines of the generated code ------------------------------------------------------------------------------
def _key(canonical: str | tuple[str, ...], layer: bool) -> str:
    f = "f" if layer else ""
    if isinstance(canonical, tuple):
        return "(" + ", ".join(f'{f}"{c}"' for c in canonical) + ")"
    return f'{f}"{canonical}"'


def _target(name: str, canonical: str | tuple[str, ...], why: str, layer: bool) -> str:
    f = "f" if layer else ""
    if name:
        return f'get({f}"{name}")'
    what = canonical if isinstance(canonical, str) else "+".join(canonical)
    return f'_unmapped({f}"{what}", {why!r})'


def _listing(lines: list[str]) -> str:
    return "[\n" + "\n".join(lines) + "\n        ]" if lines else "[]"


def _constructor_lines(constructor: Constructor) -> list[str]:
    return constructor.lines(12)


def _mapping_lines(mapping: list[Line]) -> list[str]:
    """The entries of the canonical mapping outside the layers."""
    lines = []
    for ln in mapping:
        check = f"  # CHECK: {ln.check}" if ln.check or not ln.target else ""
        target = _target(ln.target, ln.canonical, ln.check, False)
        lines.append(f"            {_key(ln.canonical, False)}: {target},{check}")
    return lines


def _noted_lines(names: list[tuple[str, str]]) -> list[str]:
    return [f"            get(\"{n}\"),{'  # CHECK: ' + why if why else ''}" for n, why in names]


def _layer_lines(p: Proposal) -> list[str]:
    """The body of the loop over layer numbers: both stacks' template lines."""
    lines: list[str] = []
    for stack in ("encoder", "decoder"):
        if stack in p.stack_checks:
            lines.append(f"            # CHECK: {p.stack_checks[stack]}")
        for ln in p.layers.get(stack, []):
            check = ln.check or ("" if ln.target else "no parameter found")
            lines.append(f"            mapping[{_key(ln.canonical, True)}] = "
                         f"{_target(ln.target, ln.canonical, check, True)}"
                         f"{'  # CHECK: ' + check if check else ''}")
        for n, why in p.layer_zero.get(stack, []):
            lines.append(f"            zero.append(get(f\"{n}\"))  # a bias the paper lacks"
                         f"{'; CHECK: ' + why if why else ''}")
        for n, why in p.layer_one.get(stack, []):
            lines.append(f"            one.append(get(f\"{n}\"))  # CHECK: {why}")
    return lines


def _optional_methods(s: Scaffold) -> str:
    """``encode`` and ``positional_encoding`` where the probe found them, else ""."""
    encode = (f"\n    def encode(self, src: Tensor) -> Tensor:\n        \"\"\"The last encoder layer's output "
              f"(B, S, d_model).\"\"\"\n        return {s.encode}  # CHECK: does it mask the source padding?\n"
              if s.encode else "")
    positional = ""
    if s.positional:
        attr_path = s.positional
        positional = (f"\n    def positional_encoding(self, length: int) -> Tensor:\n"
                      f"        \"\"\"The table added to the scaled embeddings: (length, d_model).\"\"\"\n"
                      f"        table = _attribute(self.model, {attr_path!r})  # CHECK: the table both stacks add?\n"
                      f"        return table.reshape(-1, table.size(-1))[:length]\n")
    return encode + positional


# -- the file, in three parts ---------------------------------------------------------------------------------------
def _head(s: Scaffold) -> str:
    """The docstring (with a ``{checks}`` placeholder), the imports and the helpers the adapter uses."""
    return f'''"""aiayn plugin for {s.where}, started by `aiayn scaffold`.

Review every line marked `# CHECK:` ({{checks}} of them): correct it, then delete the marker. Then audit:

    python3 -m pytest conformance/ --plugin=THIS_FILE --impl={s.name}
    aiayn audit --plugin THIS_FILE --impl {s.name}

The scaffold built {s.cls.__name__} with a ModelConfig (d_model {PROBE.d_model}, h {PROBE.n_heads}, \
d_ff {PROBE.d_ff}, N {PROBE.n_layers}, vocabularies {PROBE.src_vocab}, tied)
and proposed where each canonical parameter (spec.schema.parameter_schema) goes, from the model's parameter
names, shapes and registration order. A canonical parameter it found no home for goes to `_unmapped(...)`,
which fails in one line naming it. docs/plugins.md explains each part; spec/contract.py is the contract.
"""

from __future__ import annotations

import sys  # noqa: F401  (a model loaded from a file path is imported through sys.path)
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

{s.import_line}


def _unmapped(name: str, why: str) -> Callable[[Tensor], None]:
    """The target of a canonical parameter the scaffold could not place: loading fails, naming it."""
    def store(value: Tensor) -> None:
        raise ValueError(f"{{name}} is not mapped yet ({{why}}): edit load_reference_state")
    return store


def _attribute(model: nn.Module, path: str) -> Tensor:
    *modules, attr = path.split(".")
    for part in modules:
        model = getattr(model, part)
    return getattr(model, attr)


'''


def _adapter(s: Scaffold) -> str:
    """The adapter class: the constructor call, forward, the optional methods and load_reference_state."""
    p = s.proposal
    ctor_lines = _constructor_lines(s.constructor)
    map_lines = _mapping_lines(p.mapping)
    zero_lines, one_lines = _noted_lines(p.zero), _noted_lines(p.one)
    layer_lines = _layer_lines(p)
    fwd = "\n".join(f"        {ln}" for ln in s.forward_call[:-1])
    fwd_return = s.forward_call[-1]
    methods = _optional_methods(s)
    return f'''class Adapter(nn.Module):
    """{s.cls.__name__} behind the adapter contract (spec/contract.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = {s.cls.__name__}(
{chr(10).join(ctor_lines)}
        )

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src [B, S], tgt [B, T]: token ids right-padded with config.pad_id, tgt already shifted right."""
{fwd + chr(10) if fwd else ""}        {fwd_return}  # CHECK: {s.forward_check}
{methods}
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Copy a canonical state dict (spec.schema) into the model; biases the paper lacks get 0."""
        get = self.model.get_parameter
        mapping: dict[CanonicalKey, Target] = {{
{chr(10).join(map_lines)}
        }}
        zero: list[Tensor] = {_listing(zero_lines)}
        one: list[Tensor] = {_listing(one_lines)}
        for i in range(self.config.n_layers):
{chr(10).join(layer_lines) or "            pass  # CHECK: no layers found"}
        load_canonical(state, mapping, zero=zero, one=one)

'''


def _registration(s: Scaffold) -> str:
    """The parameters left as built (a comment), and the hook that registers the implementation."""
    left = [f"#   {n}: {why}" for n, why in s.proposal.left]
    note = ("# Parameters not in the paper's schema, left as the model built them:\n" + "\n".join(left) + "\n"
            if left else "")
    return f'''{note}

@hookimpl
def register_implementations(register):
    register(Implementation(
        name={s.name!r},
        build=Adapter,
        summary="{s.cls.__name__} from {s.where} (scaffolded)",
        source="{s.where}",
        output={s.output!r},  # CHECK: {s.output_check}
        deviations={{}},  # after a first audit: {{clause id: why}} for what the model knowingly departs from
    ))
'''

"""Stage 5: the plugin file's text, from the proposal and what the value probe proved (:class:`Proof`; proof.py
runs the text this writes, then has it written again with the lines it proved unmarked). Every line the user must
review carries ``# CHECK:`` and the reason; the file's docstring counts them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .calls import Constructor
from .initialisation import Init
from .positions import Positional
from .proposal import Line, Proposal, Proposed


@dataclass
class Proof:
    """Which parts of the mapping the value probe proved, and its figures."""

    proved: set[str] = field(default_factory=set)  # "model" (everything), "encoder" (encoder lines, src_embed)
    detail: str = ""  # one line: what was compared and how far apart
    table_gap: float | None = None  # positional_encoding(S) against the sinusoid of section 3.5 (None: not compared)

    def covers(self, part: str) -> bool:
        return "model" in self.proved or part in self.proved


@dataclass
class _View:
    """What the text is written from: the proposal, and the proof (None: not run)."""

    p: Proposed
    proof: Proof | None

    @property
    def cls(self) -> type:
        return self.p.probed.built.loaded.obj

    @property
    def where(self) -> str:
        return self.p.probed.built.loaded.where

    @property
    def name(self) -> str:
        return self.p.probed.built.loaded.name


def render(proposed: Proposed, proof: Proof | None = None) -> str:
    """The plugin file's text."""
    s = _View(proposed, proof)
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


UNPROVED = "not proved by the value probe (see the note above)"
FACTS = ("d_ff=",)  # notes that state what the model does (complete.py: ignored_sizes), kept even where proved


def mark(check: str, target: str, part: str, proof: Proof | None) -> str:
    """The CHECK note of a line mapping into ``target`` ("" for none): a line the value probe proved has none, a line
    it did not prove has its own reason or UNPROVED; ``part`` is "encoder" for the lines the encoder probe covers."""
    if proof is None or not target or check.startswith(FACTS):
        return check
    if proof.covers(part):
        return ""
    return check or UNPROVED


def _mapping_lines(mapping: list[Line], proof: Proof | None) -> list[str]:
    """The entries of the canonical mapping outside the layers."""
    lines = []
    for ln in mapping:
        part = "encoder" if ln.canonical == "src_embed.weight" else "model"
        note = mark(ln.check, ln.target, part, proof)
        check = f"  # CHECK: {note}" if note or not ln.target else ""
        target = _target(ln.target, ln.canonical, ln.check, False)
        lines.append(f"            {_key(ln.canonical, False)}: {target},{check}")
    return lines


def _noted_lines(names: list[tuple[str, str]], proof: Proof | None) -> list[str]:
    noted = [(n, mark(why, n, "model", proof)) for n, why in names]
    return [f"            get(\"{n}\"),{'  # CHECK: ' + why if why else ''}" for n, why in noted]


def _layer_lines(p: Proposal, proof: Proof | None) -> list[str]:
    """The body of the loop over layer numbers: both stacks' template lines."""
    lines: list[str] = []
    for stack in ("encoder", "decoder"):
        part = "encoder" if stack == "encoder" else "model"
        if stack in p.stack_checks and not (proof and proof.covers(part)):
            lines.append(f"            # CHECK: {p.stack_checks[stack]}")
        for ln in p.layers.get(stack, []):
            check = mark(ln.check, ln.target, part, proof) or ("" if ln.target else "no parameter found")
            lines.append(f"            mapping[{_key(ln.canonical, True)}] = "
                         f"{_target(ln.target, ln.canonical, check, True)}"
                         f"{'  # CHECK: ' + check if check else ''}")
        for n, why in p.layer_zero.get(stack, []):
            why = mark(why, n, part, proof)
            lines.append(f"            zero.append(get(f\"{n}\"))  # a bias the paper lacks"
                         f"{'; CHECK: ' + why if why else ''}")
        for n, why in p.layer_one.get(stack, []):
            why = mark(why, n, part, proof)
            lines.append(f"            one.append(get(f\"{n}\"))  # a gain the paper lacks"
                         f"{'; CHECK: ' + why if why else ''}")
    return lines


def _proved(s: _View) -> bool:
    return s.proof is not None and s.proof.covers("model")


def _forward_note(s: _View) -> str:
    forward = s.p.probed.forward
    masks = forward.masks + "; " if forward.masks else ""
    if _proved(s):
        return f"  # {masks}proved by the value probe (the note in load_reference_state)"
    return f"  # CHECK: {masks}{forward.check}"


def _output_note(s: _View) -> str:
    return "  # proved by the value probe" if _proved(s) else f"  # CHECK: {s.p.probed.forward.output_check}"


def _proof_note(s: _View) -> str:
    if s.proof is None:
        return ""
    if _proved(s):
        return f"        # Proved by the scaffold's value probe: {s.proof.detail}."
    enc = " (the encoder's lines are proved: its output matches)" if s.proof.covers("encoder") else ""
    return (f"        # CHECK: not proved{enc}: {s.proof.detail}; a departure of the model (the audit names it) or "
            "a line below")


def _encode_method(s: _View) -> str:
    hook = s.p.encode
    if not hook.own and not hook.module:
        return (f"\n    # CHECK: {hook.check}\n" if hook.check else "")
    note = "" if s.proof is not None and s.proof.covers("encoder") else f"  # CHECK: {hook.check or UNPROVED}"
    if hook.own:
        body = f"        return {hook.own}{note}\n"
        what = ""
    else:
        body = (f"        start = torch.full_like(src[:, :1], (self.config.pad_id + 1) % self.config.tgt_vocab)\n"
                f"        return _memory(self.model, {hook.module!r}, src, lambda: self(src, start)){note}\n")
        what = f": what {hook.module} reads in a forward on a one-token target"
    return (f"\n    def encode(self, src: Tensor) -> Tensor:\n        \"\"\"The final encoder output (B, S, d_model)"
            f"{what}.\"\"\"\n" + body)


def _positional_method(s: _View) -> str:
    table: Positional = s.p.probed.table
    if not table.path:
        return f"\n    # CHECK: {table.check}\n" if table.check else ""
    note = f"  # CHECK: {table.check}" if table.check else ""
    gap = s.proof.table_gap if s.proof is not None else None
    if not table.learned and gap is not None:
        note = "" if gap <= 1e-5 else (f"  # CHECK: the table both stacks add? it differs from the sinusoid of "
                                        f"section 3.5 by max {gap:.2g}")
    if table.learned:
        read = f"self.model.get_parameter({table.path!r})"
    else:
        read = f"_attribute(self.model, {table.path!r})"
    return (f"\n    def positional_encoding(self, length: int) -> Tensor:\n"
            f"        \"\"\"The table added to the scaled embeddings: (length, d_model).\"\"\"\n"
            f"        table = {read}{note}\n"
            f"        return table.reshape(-1, table.size(-1))[:length]\n")


def _optional_methods(s: _View) -> str:
    """``encode`` and ``positional_encoding`` where the probe found them, else a CHECK saying why not."""
    return _encode_method(s) + _positional_method(s)


def _init_function(s: _View) -> str:
    """``_init(model)``: the repository's own initialisation, applied after building the model."""
    init: Init = s.p.probed.init
    if init.code:
        code = init.code
        if re.search(r"(?<![\w.])init\.", code):
            code = "from torch.nn import init\n" + code
        body = "\n".join("    " + ln for ln in code.splitlines())
        note = f"  # CHECK: {init.check}" if init.check else ""
        return (f"def _init(model: nn.Module) -> None:\n    \"\"\"The repository's own initialisation ({init.origin}), "
                f"applied after building the model.\"\"\"{note}\n{body}\n")
    what = init.origin or "none needed"
    if init.check:
        return (f"def _init(model: nn.Module) -> None:\n    \"\"\"The repository's own initialisation, applied after "
                f"building the model.\"\"\"\n    # CHECK: {init.check}\n")
    return (f"def _init(model: nn.Module) -> None:\n    \"\"\"The repository's own initialisation: {what}.\"\"\"\n")


# -- the file, in three parts ---------------------------------------------------------------------------------------
def _head(s: _View) -> str:
    """The docstring (with a ``{checks}`` placeholder), the imports and the helpers the adapter uses."""
    built = s.p.probed.built
    c = built.config
    imports = built.loaded.import_line(built.constructor.callables())
    return f'''"""aiayn plugin for {s.where}, started by `aiayn scaffold`.

Review every line marked `# CHECK:` ({{checks}} of them): correct it, then delete the marker. Then audit:

    python3 -m pytest conformance/ --plugin=THIS_FILE --impl={s.name}
    aiayn audit --plugin THIS_FILE --impl {s.name}

The scaffold built {s.cls.__name__} with a ModelConfig (d_model {c.d_model}, h {c.n_heads}, \
d_ff {c.d_ff}, N {c.n_layers}, vocabularies {c.src_vocab}, tied)
and proposed where each canonical parameter (spec.schema.parameter_schema) goes, from the model's parameter
names, shapes and registration order. A canonical parameter it found no home for goes to `_unmapped(...)`,
which fails in one line naming it. docs/plugins.md explains each part; spec/contract.py is the contract.
"""

from __future__ import annotations

import sys  # noqa: F401  (a model loaded from a file path is imported through sys.path)
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance import CanonicalKey, Implementation, ModelConfig, Target, hookimpl, load_canonical

{imports}


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


def _memory(model: nn.Module, path: str, src: Tensor, run: Callable[[], object]) -> Tensor:
    """The [B, S, d_model] tensor (an [S, B, d_model] one transposed) the sub-module ``path`` first receives while
    ``run()`` runs: the encoder output, as the decoder's cross-attention reads it."""
    B, S = src.shape
    seen: list[Tensor] = []

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        for t in [*args, *kwargs.values()] if not seen else []:
            if isinstance(t, Tensor) and t.dim() == 3 and tuple(t.shape[:2]) in ((B, S), (S, B)):
                seen[:] = [t if t.shape[0] == B else t.transpose(0, 1)]

    handle = model.get_submodule(path).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen[0]


{_init_function(s)}

'''


def _adapter(s: _View) -> str:
    """The adapter class: the constructor call, forward, the optional methods and load_reference_state."""
    p = s.p.proposal
    ctor_lines = _constructor_lines(s.p.probed.built.constructor)
    map_lines = _mapping_lines(p.mapping, s.proof)
    zero_lines, one_lines = _noted_lines(p.zero, s.proof), _noted_lines(p.one, s.proof)
    layer_lines = _layer_lines(p, s.proof)
    fwd = "\n".join(f"        {ln}" for ln in s.p.probed.forward.lines)
    fwd_return = f"return {s.p.probed.forward.call}"
    methods = _optional_methods(s)
    return f'''class Adapter(nn.Module):
    """{s.cls.__name__} behind the adapter contract (spec/contract.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = {s.cls.__name__}(
{chr(10).join(ctor_lines)}
        )
        _init(self.model)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src [B, S], tgt [B, T]: token ids right-padded with config.pad_id, tgt already shifted right."""
{fwd + chr(10) if fwd else ""}        {fwd_return}{_forward_note(s)}
{methods}
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Copy a canonical state dict (spec.schema) into the model; biases the paper lacks get 0."""
{_proof_note(s)}
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


def _ignored_note(s: _View) -> str:
    ignored = s.p.probed.ignored
    if not ignored:
        return ""
    said = "; ".join(ignored.values())
    return (f"        # CHECK: config.parameters will fail: {said}. Make the model follow it, or declare "
            "config.parameters\n")


def _registration(s: _View) -> str:
    """The parameters left as built (a comment), and the hook that registers the implementation."""
    left = [f"#   {n}: {why}" for n, why in s.p.proposal.left]
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
        output={s.p.probed.forward.output!r},{_output_note(s)}
{_ignored_note(s)}        deviations={{}},  # after a first audit: {{clause id: why}} for what it knowingly departs from
    ))
'''

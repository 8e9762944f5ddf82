"""The shape contract: which batch sizes and lengths an implementation's forward accepts (model.shape).

model.shape asks for any batch size and any lengths from 1 to ``max_len``. Tutorial code often accepts less:
position ids hard-coded for its own example sentence, a positional table shorter than ``max_len``, one
sentence at a time. Left alone, such a model errors in every check of every clause, the one true finding
buried under the cascade. So the suite probes the contract first, once per implementation and session (one
build, about a dozen forward calls on unpadded random tokens): at the batch sizes and lengths the witnesses
use, at 1 and at ``max_len``. Then

* model.shape's probe check (``test_model.test_accepted_shapes``) reports the rejected shapes once, with the
  accepted ones and the model's own error;
* witnesses are fitted to accepted shapes (``inputs.witness_batch``, ``inputs.fitted``): the other clauses
  are judged where the model runs;
* hypothesis strategies draw accepted shapes only (``strategies.src_tgt`` and the composites built on it);
* a forward call at a rejected shape skips its check as "blocked by model.shape: forward(src [3, 7], tgt [3, 5])
  needs source length 7, and the model accepts only source length 5" (the gate of ``harness.call_forward``):
  no check errors, and hypothesis never shrinks a crash the probe has explained. A model whose forward raises
  at every probed shape is reported once by the probe check (an error: it could not be checked), and every
  other forward-based check skips.

Acceptance is modelled per axis (batch size, source length, target length): each axis is probed with the
other two held at a shape the model accepts (the base). An unprobed length lying between two accepted probed
lengths (or beyond the longest probed one, when that one is accepted) counts as accepted; every length counts
as accepted on an axis where every probed length is. A model whose build raises has no contract: its checks
run, and report the build error.

The plugin makes the implementation of each test the one under test (:func:`under_test`), as it makes the
test's clause the clause under test; helpers read its contract with :func:`current`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pytest
import torch

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability

from . import settings
from .harness import ImplementationError, build_model, first_line, output_problem, shape_gate

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["Axis", "ShapeContract", "probe", "contract_of", "under_test", "current", "fit_pair", "ranges",
           "describe_shape"]

Axis = Literal["batch", "src", "tgt"]
AXES: tuple[Axis, ...] = ("batch", "src", "tgt")
NAMES = {"batch": ("batch size", "batch sizes"), "src": ("source length", "source lengths"),
         "tgt": ("target length", "target lengths")}


def ranges(values: Sequence[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1-3, 5, 7-8"``."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)


def describe_shape(batch: int, s_len: int, t_len: int) -> str:
    """``forward(src [B, S], tgt [B, T])``."""
    return f"forward(src [{batch}, {s_len}], tgt [{batch}, {t_len}])"


@dataclass
class ShapeContract:
    """What one implementation's forward accepted when probed.

    ``probed[axis][n]`` is None when the model accepted ``n`` on that axis (the other two at ``base``), else
    the model's error in one line. ``base`` is the accepted shape (batch, src_len, tgt_len) the axes were
    probed around, None when forward raised at every shape tried (``error`` says how).
    """

    impl: str
    max_len: int
    probed: dict[str, dict[int, str | None]]
    base: tuple[int, int, int] | None
    error: str = ""  # the first rejection: "forward(src [3, 7], tgt [3, 5]) raised: RuntimeError: ..."
    output: tuple[str, str] | None = None  # (what forward returned at the base shape, what it should) when
    # that is not a floating tensor [B, T, tgt_vocab]
    hint: str = ""  # the likely cause of the rejections, in code terms
    tried: list[tuple[int, int, int]] = field(default_factory=list)  # every shape called, in order

    # -- what was seen ---------------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        """Forward accepted at least one shape."""
        return self.base is not None

    @property
    def complete(self) -> bool:
        """Forward accepted every probed batch size and length."""
        return self.usable and all(err is None for axis in AXES for err in self.probed[axis].values())

    def accepted(self, axis: Axis) -> list[int]:
        return sorted(n for n, err in self.probed[axis].items() if err is None)

    def rejected(self, axis: Axis) -> list[int]:
        return sorted(n for n, err in self.probed[axis].items() if err is not None)

    def accepts_value(self, axis: Axis, n: int) -> bool:
        """Whether forward accepts ``n`` on ``axis`` (inferred between probed values, see the module doc)."""
        if n < 1 or not self.usable:
            return False
        seen = self.probed[axis]
        if n in seen:
            return seen[n] is None
        if all(err is None for err in seen.values()):
            return True
        below = [m for m in seen if m < n]
        above = [m for m in seen if m > n]
        if not below:
            return False
        return seen[max(below)] is None and (not above or seen[min(above)] is None)

    def accepts(self, batch: int, s_len: int, t_len: int) -> bool:
        return (self.accepts_value("batch", batch) and self.accepts_value("src", s_len)
                and self.accepts_value("tgt", t_len))

    def values(self, axis: Axis, low: int, high: int) -> list[int]:
        """The accepted values of ``axis`` from ``low`` to ``high``."""
        return [n for n in range(low, high + 1) if self.accepts_value(axis, n)]

    # -- what it accepts, in words ---------------------------------------------------------------------------
    def accepted_words(self, axis: Axis) -> str:
        """``"source lengths 1-4"``: the accepted values up to max_len (batch sizes up to the largest probed)."""
        top = max(self.probed[axis]) if axis == "batch" else self.max_len
        vals = self.values(axis, 1, top)
        if not vals:
            return f"no {NAMES[axis][0]}"
        if len(vals) == 1:
            return f"only {NAMES[axis][0]} {vals[0]}"
        return f"{NAMES[axis][1]} {ranges(vals)} only"

    def need(self, what: str, axis: Axis | None = None) -> str:
        """The skip reason of a check that cannot run at an accepted shape: ``what`` it needs, and what the
        model accepts (on ``axis``, or on every axis where it rejects something)."""
        if not self.usable:
            return self.blocked(0, 0, 0)
        axes = [axis] if axis is not None else [a for a in AXES if self.rejected(a)]
        return f"blocked by model.shape: {what}, and the model accepts " + "; ".join(
            self.accepted_words(a) for a in axes)

    def blocked(self, batch: int, s_len: int, t_len: int) -> str:
        """The skip reason for a forward call at (batch, s_len, t_len) the model rejects, else ""."""
        if not self.usable:
            return ("blocked by model.shape: forward raised at every probed shape, so no check can run "
                    f"({self.error})")
        checks: tuple[tuple[Axis, int], ...] = (("src", s_len), ("tgt", t_len), ("batch", batch))
        for axis, n in checks:
            if not self.accepts_value(axis, n):
                return self.need(f"{describe_shape(batch, s_len, t_len)} needs {NAMES[axis][0]} {n}", axis)
        return ""

    # -- fitting inputs --------------------------------------------------------------------------------------
    def fit_length(self, axis: Axis, wanted: int, *, room: int = 0) -> int | None:
        """The accepted length to use for ``wanted``: itself if accepted, else the longest accepted one below
        it, else the shortest above; with ``room``, length + room must be accepted too. None if none is."""
        fits = [n for n in range(1, max(self.max_len, wanted) + 1)
                if self.accepts_value(axis, n) and self.accepts_value(axis, n + room)]
        if not fits:
            return None
        if wanted in fits:
            return wanted
        below = [n for n in fits if n < wanted]
        return max(below) if below else min(fits)

    def fit_batch(self, wanted: int, *, min_batch: int = 1) -> int | None:
        """The accepted batch size to use for ``wanted`` rows (at least ``min_batch``): the largest accepted
        one up to ``wanted``; None if none is."""
        fits = self.values("batch", min_batch, wanted)
        return max(fits) if fits else None

    # -- the report ------------------------------------------------------------------------------------------
    def report(self) -> tuple[str, str]:
        """(accepted, rejected): the probed values per axis, in words."""
        def per_axis(pick: Any) -> str:
            parts = [f"{NAMES[a][1]} {', '.join(map(str, pick(a)))}" for a in ("src", "tgt", "batch") if pick(a)]
            return "; ".join(parts) or "none"
        return per_axis(self.accepted), per_axis(self.rejected)


# --------------------------------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------------------------------
def _tokens(config: ModelConfig, batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """Unpadded random ids [batch, length] (every token real)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 1, (batch, length), generator=g)
    return ids + (ids >= config.pad_id).long()  # skip the pad id


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"[:300]


def probe(model: Any, config: ModelConfig, *, lengths: Sequence[int], batches: Sequence[int],
          witness: tuple[int, int, int], impl_name: str = "") -> ShapeContract:
    """Call ``model`` (eval mode, no grad) at a few shapes and record which it accepts.

    The base is the witness shape if accepted, else the first accepted of: the witness lengths at the other
    batch sizes, then square shapes (b, L, L) for every probed length L (nearest the witness's target length
    first) at those batch sizes. From the base, each probed length L is tried on both axes at once, (b0, L, L),
    and only when that is rejected on each axis alone. A call is rejected when it raises, or when it returns
    something other than floats [B, T, tgt_vocab] while the base call returns them (a table that broadcasts
    at length 1 into the wrong shape); a model that returns the wrong output at every shape tried has none
    rejected for it (what forward returns is model.shape's own concern, recorded at the base as ``output``).
    CheckTimeout (a BaseException) is not caught: a hang stays a hang.
    """
    lengths = sorted({*lengths, 1, config.max_len})
    batches = sorted({*batches, 1, witness[0]})
    raised: dict[tuple[int, int, int], str | None] = {}
    wrong: dict[tuple[int, int, int], tuple[str, str] | None] = {}  # what it returned, what it should
    tried: list[tuple[int, int, int]] = []

    def run(shape: tuple[int, int, int]) -> None:
        if shape in raised:
            return
        b, s, t = shape
        src = _tokens(config, b, s, config.src_vocab, seed=b * 1000 + s)
        tgt = _tokens(config, b, t, config.tgt_vocab, seed=b * 1000 + t + 500)
        tried.append(shape)
        try:
            with torch.no_grad():
                out = model(src, tgt)
        except Exception as exc:  # a rejection: the model's own error, kept for the report
            raised[shape] = f"{describe_shape(*shape)} raised: {_one_line(exc)}"
            return
        raised[shape] = None
        wrong[shape] = output_problem(out, src, tgt, config.tgt_vocab)

    b_w, s_w, t_w = witness
    candidates = [witness] + [(b, s_w, t_w) for b in batches if b != b_w]
    near = sorted(lengths, key=lambda n: (abs(n - t_w), n))  # square shapes nearest the witness's first
    candidates += [(b, n, n) for b in [b_w] + [b for b in batches if b != b_w] for n in near]
    base: tuple[int, int, int] | None = None
    for shape in candidates:
        run(shape)
        if raised[shape] is None and wrong[shape] is None:
            base = shape
            break
    strict = base is not None  # the right output is seen somewhere: a wrong one elsewhere is a rejection
    if base is None:
        base = next((shape for shape in candidates if raised[shape] is None), None)

    def verdict(shape: tuple[int, int, int]) -> str | None:
        run(shape)
        problem = wrong.get(shape)
        if raised[shape] is None and strict and problem is not None:
            return f"{describe_shape(*shape)} returned {problem[0]}, expected {problem[1]}"
        return raised[shape]

    probed: dict[str, dict[int, str | None]] = {"batch": {}, "src": {}, "tgt": {}}
    if base is None:
        first = next((err for err in raised.values() if err is not None), "")
        return ShapeContract(impl_name, config.max_len, probed, None, error=first, tried=tried)
    b0, s0, t0 = base
    for n in lengths:
        if verdict((b0, n, n)) is None:
            probed["src"][n] = probed["tgt"][n] = None
        else:
            probed["src"][n] = verdict((b0, n, t0))
            probed["tgt"][n] = verdict((b0, s0, n))
    for b in batches:
        probed["batch"][b] = verdict((b, s0, t0))
    first = next((err for err in (verdict(shape) for shape in tried) if err is not None), "")
    contract = ShapeContract(impl_name, config.max_len, probed, base, tried=tried, error=first, output=wrong[base])
    contract.hint = _hint(contract, model, config)
    return contract


def _hint(contract: ShapeContract, model: Any, config: ModelConfig) -> str:
    """The likely cause of the rejections, from the accepted lengths and the positional evidence."""
    hints: list[str] = []
    src_ok, tgt_ok = contract.values("src", 1, config.max_len), contract.values("tgt", 1, config.max_len)
    rejected_len = contract.rejected("src") + contract.rejected("tgt")
    if rejected_len:
        evidence = ""
        first_bad = min(rejected_len)
        if has_capability(model, "positional_encoding"):
            try:
                table = model.positional_encoding(first_bad)
                shape = list(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
                rows = table.shape[-2] if isinstance(table, torch.Tensor) and table.dim() >= 2 else None
                evidence = (f"; positional_encoding({first_bad}) returns a {shape} table, yet forward rejects "
                            f"length {first_bad}: forward does not take its positions from that table's rows "
                            f"0..L-1" if rows == first_bad else
                            f"; positional_encoding({first_bad}) returns {shape}, not {first_bad} rows")
            except Exception as exc:
                evidence = f"; positional_encoding({first_bad}) raised: {_one_line(exc)}"
        fixed = [v[0] for v in (src_ok, tgt_ok) if len(v) == 1]
        if fixed:
            hints.append(f"forward accepts exactly one length ({', '.join(map(str, sorted(set(fixed))))}): position "
                         "ids hard-coded for one example sentence (a table indexed by fixed ids, or an ids tensor "
                         "built once) rather than arange(length) of each input; index the positional table with "
                         f"positions 0..L-1 of the call (pe[:L]){evidence}")
        elif all(v and v == list(range(1, max(v) + 1)) for v in (src_ok, tgt_ok)):
            longest = min(max(src_ok), max(tgt_ok))
            hints.append(f"forward accepts lengths up to {longest} only: a positional table (or another "
                         f"length-sized buffer) built for {longest} positions instead of config.max_len = "
                         f"{config.max_len}{evidence}")
        else:
            hints.append(f"some lengths from 1 to max_len = {config.max_len} are rejected: a length-dependent "
                         f"reshape or buffer{evidence}")
    if contract.rejected("batch"):
        hints.append(f"forward accepts {contract.accepted_words('batch')}: code written for one sentence at a "
                     "time (a view/reshape with a fixed batch, a squeeze(0), a state built for one sample); "
                     "keep the batch axis B throughout")
    return "; ".join(hints)


# --------------------------------------------------------------------------------------------------
# Per implementation and session; the implementation under test
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Subject:
    """What the probe needs to know: the implementation, the audit config, the witness shapes."""

    impl: Implementation
    config: ModelConfig
    lengths: tuple[int, ...]
    batches: tuple[int, ...]
    witness: tuple[int, int, int]


_SUBJECT: contextvars.ContextVar[Subject | None] = contextvars.ContextVar("aiayn_subject_under_test", default=None)


def contract_of(subject: Subject) -> ShapeContract | None:
    """The implementation's shape contract, probed once per session on the CPU whatever ``--device`` says (which
    shapes a model accepts is a matter of its code; a forward that mixes devices on the audit's device is
    device.portable's finding), None when its build raises: then there is no contract, and each check reports the
    build error itself."""
    contracts = settings.current().cache("shape-contracts")
    key = (subject.impl.name, id(subject.impl), subject.config)
    if key not in contracts:
        try:
            model = build_model(subject.impl, subject.config, place=False)
        except ImplementationError:
            contracts[key] = None
            return None
        contracts[key] = probe(model.eval(), subject.config, lengths=subject.lengths, batches=subject.batches,
                                witness=subject.witness, impl_name=subject.impl.name)
    return contracts[key]


def current() -> ShapeContract | None:
    """The shape contract of the implementation under test (probed on first use); None outside a check of an
    implementation, or when its build raises."""
    subject = _SUBJECT.get()
    return None if subject is None else contract_of(subject)


def _gate(src: torch.Tensor, tgt: torch.Tensor) -> str:
    contract = current()
    if contract is None or contract.complete or src.dim() != 2 or tgt.dim() != 2:
        return ""
    return contract.blocked(src.size(0), src.size(1), tgt.size(1))


@contextlib.contextmanager
def under_test(impl: Implementation | None, config: ModelConfig, *, lengths: Sequence[int],
               batches: Sequence[int], witness: tuple[int, int, int]) -> Iterator[None]:
    """Make ``impl`` the implementation under test while open: :func:`current` returns its contract, and
    ``harness.call_forward`` skips a call at a shape it rejects (the plugin does this for every check)."""
    if impl is None:
        yield
        return
    token = _SUBJECT.set(Subject(impl, config, tuple(lengths), tuple(batches), witness))
    try:
        with shape_gate(_gate):
            yield
    finally:
        _SUBJECT.reset(token)


# --------------------------------------------------------------------------------------------------
# Fitting a witness
# --------------------------------------------------------------------------------------------------
def _width(tokens: torch.Tensor, width: int, pad_id: int) -> torch.Tensor:
    """A right-padded batch cut or padded to ``width`` columns (rows keep their prefix of real tokens)."""
    if width <= tokens.size(1):
        return tokens[:, :width]
    return torch.cat([tokens, torch.full((tokens.size(0), width - tokens.size(1)), pad_id, dtype=tokens.dtype)],
                     dim=1)


def room_needed(axis: Axis, room: int, who: str) -> str:
    """``"this check appends 4 pad tokens to the target, so it needs target lengths L and L + 4"``."""
    side = "source" if axis == "src" else "target"
    return (f"{who} appends {room} pad token{'s' if room > 1 else ''} to the {side}, so it needs {side} lengths L "
            f"and L + {room}")


def fit_pair(contract: ShapeContract | None, src: torch.Tensor, tgt: torch.Tensor, pad_id: int, *,
             src_room: int = 0, tgt_room: int = 0, min_batch: int = 1,
             keep: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, tgt) at shapes the model accepts: unchanged when it accepts them (and ``src_room`` /
    ``tgt_room`` more tokens, for checks that append padding), else cut or padded to the nearest accepted
    widths and cut to an accepted batch size (at least ``min_batch`` rows): the rows ``keep`` first (the rows
    the check is about), then the others in order. Skips, naming model.shape, when no accepted shape fits."""
    if contract is None or (contract.complete and src.size(0) >= min_batch):
        return src, tgt
    b, s, t = src.size(0), src.size(1), tgt.size(1)
    if contract.accepts(b, s, t) and contract.accepts_value("src", s + src_room) and \
            contract.accepts_value("tgt", t + tgt_room) and b >= min_batch:
        return src, tgt
    widths = []
    sides: tuple[tuple[Axis, int, int], ...] = (("src", s, src_room), ("tgt", t, tgt_room))
    for axis, wanted, room in sides:
        fit = contract.fit_length(axis, wanted, room=room)
        if fit is None:
            pytest.skip(contract.need(room_needed(axis, room, "this check") if room else
                                      f"this check needs a {NAMES[axis][0]}", axis))
        widths.append(fit)
    rows = contract.fit_batch(b, min_batch=min_batch)
    if rows is None:
        pytest.skip(contract.need(f"this check needs a batch of at least {min_batch} rows", "batch"))
    order = [r for r in keep if r < b] + [r for r in range(b) if r not in keep]
    kept = sorted(order[:rows])
    return _width(src[kept], widths[0], pad_id), _width(tgt[kept], widths[1], pad_id)

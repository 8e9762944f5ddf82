"""What the export targets share, public in one place: errors, example inputs, the model to export, the ONNX
graph plumbing, the check a verified decoding returns, and ``Target``, the entry of the table of targets
(``export.TARGETS``) that ``aiayn export`` builds its ``--format`` choices and options from.

Nothing here imports a runtime (onnx, onnxruntime, ctranslate2) at import time: the command line reads the table
whether or not the extras are installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig

__all__ = ["OPSET", "NEVER", "ExportError", "short_error", "resolve_model", "example_inputs", "example_sources",
           "export_graph", "session", "is_reference", "reference_for", "pick_eos", "DecodeCheck", "Check",
           "Target", "installed", "Progress"]

OPSET = 18  # see export.onnx for why 18
NEVER = -1  # an end symbol no token equals: decoding runs to the limit

Progress = Callable[[str], None]


class ExportError(RuntimeError):
    """The exporter, the checker or onnxruntime refused the model; the message is one line."""


def short_error(exc: BaseException, limit: int = 300) -> str:
    """One line for an exception from an exporter or a runtime: its type and the first line of its message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(("#", "File"))]
    first = lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {first}"[:limit]


def resolve_model(impl_or_model: Any, config: ModelConfig, *, seed: int = 0) -> tuple[nn.Module, str]:
    """A registered implementation's name (built with ``config``) or a module; returns (module, output kind)."""
    if isinstance(impl_or_model, nn.Module):
        return impl_or_model.eval(), getattr(impl_or_model, "output_kind", "logits")
    from aiayn_conformance.implementations import get_registry

    impl = get_registry().get(impl_or_model) if isinstance(impl_or_model, str) else impl_or_model
    torch.manual_seed(seed)
    return impl.build(config).eval(), impl.output


def example_inputs(config: ModelConfig, batch: int = 2, s_len: int = 5, t_len: int = 4, seed: int = 0):
    """(src, tgt) of random ids with no padding id (seeded): the example an export traces, or a shape to verify."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, config.src_vocab, (batch, s_len), generator=g)
    tgt = torch.randint(1, config.tgt_vocab, (batch, t_len), generator=g)
    src[src == config.pad_id] = (config.pad_id + 1) % config.src_vocab
    tgt[tgt == config.pad_id] = (config.pad_id + 1) % config.tgt_vocab
    return src, tgt


def example_sources(config: ModelConfig, sources: int, src_len: int, seed: int = 0) -> tuple[Tensor, str]:
    """(``sources`` sources of ``src_len`` tokens, the second one right-padded from its middle, their real lengths
    as text): the inputs every verified decoding runs on."""
    src_len = min(src_len, config.max_len)
    src, _ = example_inputs(config, sources, src_len, 1, seed=seed)
    if sources > 1 and src_len > 2:
        src[1, src_len // 2:] = config.pad_id
    return src, ", ".join(str(int(n)) for n in (src != config.pad_id).sum(dim=1))


# The exporter logs one warning per torchvision operator it cannot register when torchvision is absent
# (it is not a dependency: a Transformer uses none of them). Kept quiet during our exports only.
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def export_graph(module: nn.Module, args: tuple, dynamic: tuple, names: tuple[list[str], list[str]], path: Path,
                 progress: Progress, symbolic: Mapping[str, Sequence[int]] | None = None) -> Path:
    """Export ``module`` on ``args``, save it as one file, check it; ``symbolic`` maps graph input and
    output names to the axes that must have stayed symbolic (default: axes 0 and 1 of every input)."""
    import onnx

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb"):
            pass
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    progress(f"exporting {type(module).__name__} with torch.onnx.export(dynamo=True, opset {OPSET}) ...")
    started = time.perf_counter()
    try:
        with warnings.catch_warnings(), _quiet_logger(_REGISTRATION_LOGGER):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic, opset_version=OPSET,
                                        input_names=names[0], output_names=names[1], verbose=False)
        if program is None:  # only the legacy exporter (dynamo=False) returns None
            raise ExportError("torch.onnx.export returned no program")
        program.save(str(path), external_data=False)
    except Exception as exc:
        raise ExportError(f"export failed: {short_error(exc)}") from exc
    progress(f"exported in {time.perf_counter() - started:.1f} s; checking ...")
    model = onnx.load(str(path))
    try:
        onnx.checker.check_model(model)
        onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise ExportError(f"onnx.checker rejected the exported model: {short_error(exc)}") from exc
    # Batch and length axes must stay symbolic: an example dimension of size 0 or 1, or a guard the
    # exporter could not prove, specializes them silently.
    values = {v.name: v for v in [*model.graph.input, *model.graph.output]}
    expected = symbolic if symbolic is not None else {i.name: (0, 1) for i in model.graph.input}
    for name, axes in expected.items():
        if name not in values:
            raise ExportError(f"the exported graph has no input or output named {name!r}")
        dims = [d.dim_param or d.dim_value for d in values[name].type.tensor_type.shape.dim]
        if not all(a < len(dims) and isinstance(dims[a], str) and dims[a] for a in axes):
            raise ExportError(f"{name} was exported with static dimensions {dims} (axes {list(axes)} must be symbolic)")
    return path


def session(path: str | Path, *, threads: int | None = None, disabled_optimizers: Sequence[str] = ()):
    """An onnxruntime session on the CPU provider (asserted); ``threads`` sets its intra-op thread count and
    ``disabled_optimizers`` names graph optimizers onnxruntime must not apply. Its intra-op threads do not spin
    between runs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    # onnxruntime's intra-op threads spin after each run by default, taking the cores from what the caller computes
    # between runs (a search's PyTorch ops, its own OpenMP threads): with 2 threads, each runtime alone in its own
    # process, beam 4 over 8 sources decoded in 0.56 of CTranslate2's time with spinning off, 0.95 with it on
    # (BENCHMARKS.md); with one thread there is no pool and nothing changes
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        sess = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(disabled_optimizers) or None)
    except Exception as exc:  # InvalidGraph, NotImplemented, Fail: the exported graph is what is wrong
        raise ExportError(f"onnxruntime rejected the exported graph: {short_error(exc)}") from exc
    if sess.get_providers()[0] != "CPUExecutionProvider":  # ORT falls back silently otherwise
        raise ExportError(f"onnxruntime chose {sess.get_providers()} instead of the CPU provider")
    return sess


def is_reference(model: nn.Module) -> bool:
    """True when ``model`` is a reference ``Transformer`` (exported or converted as it is)."""
    from aiayn_conformance.reference.model import Transformer

    return isinstance(model, Transformer)


def reference_for(model: nn.Module, config: ModelConfig, *, seed: int = 0) -> nn.Module:
    """A reference ``Transformer`` computing what ``model`` computes if ``model`` conforms.

    ``model`` itself when it is a reference ``Transformer``. Otherwise a fresh reference model
    (seeded) whose canonical state is also loaded into ``model`` with ``load_reference_state``, so both
    hold the same weights: the exported graphs then hold the paper's computation with those weights,
    and verification compares them with ``model``'s own decoding. ExportError when ``model`` has
    neither form.
    """
    if is_reference(model):
        return model.eval()
    if not callable(getattr(model, "load_reference_state", None)):
        raise ExportError(f"{type(model).__name__} is not the reference Transformer and has no "
                          "load_reference_state(); the cached export needs one of the two "
                          "(or use --no-cache for its own encode/decode)")
    from aiayn_conformance.reference.model import Transformer

    torch.manual_seed(seed)
    twin = Transformer(config).eval()
    try:
        model.load_reference_state(twin.state_dict())  # type: ignore[operator]
    except Exception as exc:
        raise ExportError(f"{type(model).__name__}.load_reference_state failed: {short_error(exc)}") from exc
    return twin


@dataclass(frozen=True)
class DecodeCheck:
    """One whole decoding compared: the runtime (onnxruntime driving the search, or CTranslate2) against PyTorch."""

    name: str  # what ran, e.g. "greedy search"
    setting: str  # sources, end symbol, limit
    ok: bool
    tokens_equal: bool
    worst_log_prob: float  # worst |log p_onnxruntime - log p_torch| over every step, row and token
    worst_at: tuple[int, int]  # (row, step) of that difference
    steps: int  # decoder steps run (past lengths 0 .. steps - 1)
    rows: int  # rows of the decoder state (sources, or sources x beams)
    outcome: str = ""  # how the sources ended
    worst_score: float | None = None  # beam search: worst |score_onnxruntime - score_torch| of the winners
    runtime: str = "onnxruntime"

    def describe(self) -> str:
        verdict = "equals" if self.ok else "DIFFERS FROM"
        score = f"; worst |Δ score| = {self.worst_score:.3g}" if self.worst_score is not None else ""
        return (f"{self.name} in {self.runtime} {verdict} PyTorch ({self.setting}; {self.steps} steps over {self.rows} "
                f"rows, past lengths 0..{max(self.steps - 1, 0)}; {self.outcome}): tokens "
                f"{'equal' if self.tokens_equal else 'DIFFER'}; worst per-step |Δ log p| = {self.worst_log_prob:.3g} "
                f"at (row, step) {self.worst_at}{score}")


def pick_eos(tokens: Tensor, pad_id: int) -> int:
    """An end symbol that ends the sources at different steps, and not all at the first: from a no-EOS output."""
    best, best_key = int(tokens[0, 0]), (-1, -1)
    for tok in sorted({int(t) for t in tokens.flatten().tolist()} - {pad_id}):
        firsts = [int(row.nonzero()[0]) if bool(row.any()) else tokens.size(1) for row in tokens == tok]
        key = (len(set(firsts)), sum(1 for f in firsts if 0 < f < tokens.size(1)))
        if key > best_key:
            best, best_key = tok, key
    return best


def installed(*modules: str) -> bool:
    """True when every module can be found (nothing is imported)."""
    return all(importlib.util.find_spec(m) is not None for m in modules)


class Check(Protocol):
    """What a verification returns, one per comparison: whether it held, and one line saying what was compared."""

    @property
    def ok(self) -> bool: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Target:
    """One export target: an entry of ``export.TARGETS``, the table ``aiayn export --format`` reads.

    ``missing()`` says, in one line with the install command, what the target needs and this environment lacks
    ("" when nothing). ``add_options(parser)`` adds the target's own options to the ``aiayn export`` parser
    (the command's own options, --impl, --plugin, --preset, --format, --out-dir and --verify, are there already);
    ``usage(args)`` returns the one-line usage error of a call (or ""). ``export(model, output, config, args,
    progress)`` writes the model and returns one line naming what it wrote; ``verify(model, output, config,
    args, progress)`` runs the target's runtime against PyTorch on what ``export`` wrote. ``model`` is the
    implementation built for ``config`` and ``output`` its output kind (``export.resolve_model``).
    """

    name: str
    description: str
    missing: Callable[[], str]
    export: Callable[[nn.Module, str, ModelConfig, argparse.Namespace, Progress], str]
    verify: Callable[[nn.Module, str, ModelConfig, argparse.Namespace, Progress], Sequence[Check]]
    add_options: Callable[[argparse._ActionsContainer], None] = field(default=lambda parser: None)
    usage: Callable[[argparse.Namespace], str] = field(default=lambda args: "")

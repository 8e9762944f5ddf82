"""The audit's settings: the configuration it runs at, the configurations derived from it, the user's weights.

The plugin builds one :class:`AuditSettings` per pytest session from ``--config`` and ``--weights`` and keeps it
in the session's stash; checks receive it (and its ``config``) through the ``settings`` and ``config`` fixtures,
and helpers read the one of the check under test with :func:`current`. Nothing here is mutated: two sessions in
one process each have their own, and so their own memo of built models and probes.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from aiayn_conformance.spec.config import TINY, ModelConfig
from aiayn_conformance.spec.schema import parameter_count

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

    from .user_weights import UserWeights

__all__ = ["AuditSettings", "current", "others_for", "readout_config", "using"]

READOUT_VOCAB_PER_FEATURE = 4  # the readout's rows per column of [E, 1]: its smallest singular value ~ 1 / sqrt(d)


def readout_config(config: ModelConfig) -> ModelConfig:
    """The configuration the readout probes build (``readout_probes``): the audit's, with a target vocabulary of at
    least 4 d_model (the source vocabulary with it when the embeddings are shared)."""
    need = READOUT_VOCAB_PER_FEATURE * config.d_model
    if config.tgt_vocab >= need:
        return config
    return config.replace(tgt_vocab=need, src_vocab=need if config.share_embeddings else config.src_vocab)


def others_for(config: ModelConfig) -> dict[str, ModelConfig]:
    """The other configurations some checks build, derived from the audit configuration (config.parameters
    builds each; a check whose configuration the implementation refuses is skipped as blocked by it)."""
    unit = 2 * config.n_heads  # d_model stays divisible by h and even (the sinusoid pairs)
    wider = -(-config.d_model * 3 // 2 // unit) * unit
    return {
        "separate-vocabularies": config.replace(src_vocab=config.src_vocab + 4, tgt_vocab=config.tgt_vocab + 6,
                                                share_embeddings=False),
        # §3.4's three-way tying: the audit configuration itself unless it has separate vocabularies
        "shared-vocabulary": config.replace(tgt_vocab=config.src_vocab, share_embeddings=True),
        # one head of h d_k and h d_v features (d_model where they follow d_model / h)
        "one-head": config.replace(n_heads=1, **{name: 0 if name in config.derived_heads else
                                                 config.n_heads * getattr(config, name) for name in ("d_k", "d_v")}),
        "wider": config.replace(d_model=max(wider, config.d_model + unit), max_len=max(64, config.max_len)),
        # decoding (§6.1) runs up to the longest witness source + 50 positions
        "longer": config.replace(max_len=max(64, config.max_len)),
        # the readout probes read the final hidden state back through a vocabulary of at least 4 d_model
        "readout": readout_config(config),
    }


# Above LARGE parameters (the audit configuration's), the memos holding models or full canonical states keep only
# their most recently used entries: at the base model's sizes each holds hundreds of megabytes, and the checks'
# derived configurations (wider, separate vocabularies, one head, readout...) would otherwise all stay resident.
LARGE = 5_000_000
BOUNDED = {"built-models": 2, "transplanted": 2, "scratch-models": 2, "visible-states": 2, "decode-subjects": 2,
           "initial-states": 1, "visible-twins": 1}
# The canonical states (float32, one tensor per tied group) keep more entries where their bytes allow: at base (252
# MB a state) the checks draw 16 of them, seeded apart, and with 4 kept five were drawn twice (0.6 s each, with
# the serial draw of then; stop 52 draws on torch's threads); 2 GiB
# keeps 8 at base, and at big (857 MB a state) the count bound's 2: measured at big, 2 kept instead of 4 took the
# audit's peak from 15.2 to 13.5 GiB (331 and 334 s back to back, one pair: no time difference shown either way).
BYTES_BOUNDED = {"visible-states": 2 * 2**30}


# Memos of models (and of what holds models: the decode subjects) are emptied between test files at large sizes
# (``AuditSettings.release_models``): a file's checks reuse their models, the next file's rarely do, and kept
# through the run they held most of a big model's 21 GiB in one process (one decode subject alone holds four big
# models, 3.4 GB). The freshly built models every file copies (``built-models``: a big model takes seconds to
# initialise, a copy a fraction of that), the canonical states and the initial states (seeded data the files
# share) stay.
RELEASED_BETWEEN_FILES = ("transplanted", "scratch-models", "decode-subjects", "visible-twins")


def _return_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS where the C library can (glibc's malloc_trim). Measured at big
    in one process: peak resident 20.3 GiB with nothing released, 17.6 GiB with the memos emptied between files,
    13.6 GiB with this trim after each emptying (why glibc kept the freed pages was not measured)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, looked up once (find_library may run ldconfig), None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to do


def memo_bound(name: str, config: ModelConfig) -> int | None:
    """How many entries the memo ``name`` keeps for an audit at ``config`` (None: all)."""
    count = parameter_count(config)
    if count <= LARGE or name not in BOUNDED:
        return None
    if name in BYTES_BOUNDED:
        return max(BOUNDED[name], BYTES_BOUNDED[name] // (4 * count))
    return BOUNDED[name]


class Recent(OrderedDict):
    """A memo of at most ``size`` entries, the least recently used dropped first."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclass(frozen=True, eq=False)
class AuditSettings:
    """What one audit runs at. ``memo`` holds what the session computes once (built models, shape contracts)."""

    config: ModelConfig = TINY
    weights: UserWeights | None = None  # --weights, held by the implementation ``weights_for``
    weights_for: str = ""
    header: str = ""  # the report header's line on --config / --weights ("" at the suite's own sizes)
    device: str = "cpu"  # --device: where the models the checks build run (devices.OnDevice)
    memo: dict[str, dict[Any, Any]] = field(default_factory=dict, repr=False)

    @cached_property
    def others(self) -> dict[str, ModelConfig]:
        return others_for(self.config)

    def cache(self, name: str) -> dict[Any, Any]:
        """The session's memo called ``name`` (bounded to its most recent entries at large sizes: ``memo_bound``)."""
        if name not in self.memo:
            bound = memo_bound(name, self.config)
            self.memo[name] = {} if bound is None else Recent(bound)
        return self.memo[name]

    def release_models(self) -> list[str]:
        """At large sizes (the audit configuration above LARGE parameters), empty the memos that hold models
        (``RELEASED_BETWEEN_FILES``) and hand the freed memory back to the OS (also what the test
        file's own fixtures held); returns the names emptied."""
        if parameter_count(self.config) <= LARGE:
            return []
        emptied = [name for name in RELEASED_BETWEEN_FILES if self.memo.get(name)]
        for name in emptied:
            self.memo[name].clear()
        _return_freed_memory()
        return emptied

    def config_change(self, config: ModelConfig) -> str:
        """How ``config`` differs from the audit configuration ("src_vocab=41, tgt_vocab=43"), dropout aside."""
        derived = set(config.derived_heads) & set(self.config.derived_heads)  # d_k, d_v follow d_model / h
        changed = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                   if f.init and f.name != "dropout" and f.name not in derived
                   and getattr(config, f.name) != getattr(self.config, f.name)]
        return ", ".join(f"{name}={value}" for name, value in changed)

    def held_weights(self, impl: Implementation, config: ModelConfig) -> str:
        """The path of the user's weights a model of ``impl`` built at ``config`` holds, else ""."""
        if self.weights is None or impl.name != self.weights_for or self.config_change(config):
            return ""
        return self.weights.path


_DEFAULT = AuditSettings()
_CURRENT: contextvars.ContextVar[AuditSettings | None] = contextvars.ContextVar("aiayn_settings", default=None)


def current() -> AuditSettings:
    """The settings of the check under test; outside a session, the suite's own (the tiny preset, no weights)."""
    return _CURRENT.get() or _DEFAULT


@contextlib.contextmanager
def using(settings: AuditSettings) -> Iterator[AuditSettings]:
    """Make ``settings`` the current ones while open (the plugin does this around every phase of a check)."""
    token = _CURRENT.set(settings)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)

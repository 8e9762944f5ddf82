"""The paper's behaviour as data and types: config, clauses, schema, contract, tolerances."""

from .clauses import AREAS, CLAUSES, Clause, clauses_in_area, get_clause
from .config import BASE, BIG, PRESETS, TINY, ModelConfig, preset
from .contract import OPTIONAL_METHODS, OUTPUT_KINDS, Adapter, OutputKind, has_capability
from .decoding import DECODE_PRESETS, PARSING, TRANSLATION, DecodeConfig, decode_preset
from .schema import copy_canonical, load_canonical, parameter_count, parameter_schema, tied_groups
from .tolerance import ELEMENTWISE, MODEL, Tolerance, compare, tolerance

__all__ = [
    "AREAS", "BASE", "BIG", "CLAUSES", "Clause", "ELEMENTWISE", "MODEL", "ModelConfig",
    "OPTIONAL_METHODS", "OUTPUT_KINDS", "Adapter", "OutputKind", "PRESETS", "TINY", "Tolerance",
    "clauses_in_area", "compare", "copy_canonical", "get_clause", "has_capability", "load_canonical",
    "parameter_count",
    "parameter_schema", "preset", "tied_groups", "tolerance",
    "DECODE_PRESETS", "DecodeConfig", "PARSING", "TRANSLATION", "decode_preset",
]

PAPER = "arXiv:1706.03762v7"
# 2: severities audited against the paper (mask.finite became should); norm.epsilon split from norm.layer-norm.
SPEC_VERSION = "2"

"""Built-in plugin: the reference implementation (``reference/model.py``), the oracle."""

from reference.model import build

from .declarations import Implementation
from .hookspecs import hookimpl

NOTES = ("The oracle: every other subject is compared with it (`reference/model.py`, the paper to the letter). "
         "It declares no deviation and must pass every clause. It decodes with `reference/decoding.py`: a key/value "
         "cache of plain tensors, greedy search and tensor2tensor's beam search with GNMT's length penalty (§6.1).")


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="reference",
        build=build,
        summary="The project's oracle: the paper to the letter (post-norm, 1/sqrt(d_k), -inf masks, tied weights)",
        source="aiayn-conformance reference/model.py; Vaswani et al. 2017, arXiv:1706.03762v7",
        output="logits",
        notes=NOTES,
    ))

"""Built-in plugin: the reference implementation (``reference/model.py``), the oracle, with the paper's training
recipe (``reference/training.py``) exposed through the contract's recipe capabilities."""

from aiayn_conformance.reference.model import build

from ..declarations import Implementation
from ..hookspecs import hookimpl

NOTES = ("The oracle: every other subject is compared with it (`reference/model.py`, the paper to the letter). "
         "It declares no deviation and must pass every clause. It decodes with `reference/decoding.py`: a key/value "
         "cache of plain tensors, greedy search and tensor2tensor's beam search with GNMT's length penalty (§6.1). "
         "It trains with `reference/training.py` (§5.3-5.4), exposed as its recipe capabilities: Adam (0.9, 0.98, "
         "1e-9), Eq. (3) with warmup 4000 counting updates from 1, label smoothing 0.1 spread as eps/(V-1) with "
         "padding targets weighted 0, and BOS + target[:-1] as the decoder input.")


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="reference",
        build=build,
        summary="The project's oracle: the paper to the letter (post-norm, 1/sqrt(d_k), -inf masks, tied weights), "
                "with the paper's training recipe",
        source="aiayn-conformance reference/model.py, reference/training.py; Vaswani et al. 2017, arXiv:1706.03762v7",
        output="logits",
        free_head_dims=True,
        notes=NOTES,
    ))

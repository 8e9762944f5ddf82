"""Models whose bug shows only where d_k and d_v are not d_model / h (Table 3, row B): a plugin for
tests/test_head_sizes.py (``--plugin tests/head_size_models.py``).

At the paper's d_k = d_v = d_model / h each computes the reference's function; with the head sizes given apart
they do not. They declare nothing: the test reads which clauses fail.

- ``heads-scale-sqrt-d-v`` divides the scores by sqrt(d_v), the size of the values, instead of sqrt(d_k) (a kernel
  that reads its scale from ``v.size(-1)``).
- ``heads-ignore-d-k`` registers ``free_head_dims=True`` but builds d_k = d_v = d_model / h whatever the
  configuration says (a model that derives its head size from d_model and h).
- ``heads-undeclared`` is the reference registered without ``free_head_dims``: the registry refuses the sizes for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer, build, scaled_dot_product_attention
from aiayn_conformance.spec.config import ModelConfig


def scale_by_value_size(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Eq. (1) with sqrt(d_v) where sqrt(d_k) belongs (the reference's kernel on rescaled queries)."""
    return scaled_dot_product_attention(q * math.sqrt(q.size(-1) / v.size(-1)), k, v, mask)  # BUG: 1/sqrt(d_v)


def scale_sqrt_d_v(config: ModelConfig) -> Transformer:
    return Transformer(config, attention=scale_by_value_size)


def ignore_d_k(config: ModelConfig) -> Transformer:
    return Transformer(config.replace(d_k=0, d_v=0))  # BUG: the head sizes of d_model / h, whatever was asked


@hookimpl
def register_implementations(register: Callable[[Implementation], None]) -> None:
    source = "tests/head_size_models.py"
    register(Implementation(name="heads-scale-sqrt-d-v", build=scale_sqrt_d_v, free_head_dims=True, source=source,
                            summary="BUG: scores divided by sqrt(d_v) instead of sqrt(d_k)"))
    register(Implementation(name="heads-ignore-d-k", build=ignore_d_k, free_head_dims=True, source=source,
                            summary="BUG: builds d_k = d_v = d_model / h whatever the configuration gives"))
    register(Implementation(name="heads-undeclared", build=build, source=source,
                            summary="the reference, registered without free_head_dims"))

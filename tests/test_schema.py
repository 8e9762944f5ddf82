"""spec.schema.load_canonical: every canonical name used exactly once, every shape checked, nothing written on error."""

import pytest
import torch

from aiayn_conformance.spec import TINY, parameter_schema
from aiayn_conformance.spec.schema import load_canonical


def tensors():
    return {"a.q.weight": torch.ones(2, 3), "a.k.weight": torch.full((2, 3), 2.0), "a.o.weight": torch.full((3,), 3.0)}


def test_fills_plain_packed_and_callable_targets_then_zero_and_one():
    packed, plain = torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(3))
    scalar, bias, gain = torch.zeros(1), torch.ones(5), torch.zeros(5)
    load_canonical(tensors(), {("a.q.weight", "a.k.weight"): packed, "a.o.weight": lambda w: scalar.fill_(w.mean())},
                   zero=[bias], one=[gain])
    assert packed[:2].eq(1).all() and packed[2:].eq(2).all() and packed.requires_grad
    assert scalar.item() == 3.0 and bias.eq(0).all() and gain.eq(1).all() and plain.eq(0).all()


@pytest.mark.parametrize("mapping, message", [
    ({"a.q.weight": "a", "a.k.weight": "b"}, r"^canonical a\.o\.weight is loaded nowhere \(1 name\(s\) unmapped"),
    ({("a.q.weight", "a.k.weight"): "packed", "a.k.weight": "b", "a.o.weight": "c"},
     r"^a\.k\.weight: mapped twice"),
    ({"a.q.weight": "a", "a.k.weight": "b", "a.o.weight": "c", "a.v.weight": "d"},
     r"^canonical state has no a\.v\.weight"),
    ({"a.q.weight": "packed", "a.k.weight": "b", "a.o.weight": "c"},
     r"^a\.q\.weight: shape \(2, 3\), expected \(4, 3\)$"),
])
def test_errors_name_the_tensor_and_write_nothing(mapping, message):
    targets = {"a": torch.zeros(2, 3), "b": torch.zeros(2, 3), "c": torch.zeros(3), "d": torch.zeros(2, 3),
               "packed": torch.zeros(4, 3)}
    with pytest.raises(ValueError, match=message) as info:
        load_canonical(tensors(), {k: targets[v] for k, v in mapping.items()})
    assert "\n" not in str(info.value)
    assert all(t.eq(0).all() for t in targets.values()), "nothing may be written when the mapping is wrong"


def test_the_reference_loads_through_it():
    from aiayn_conformance.reference.model import Transformer

    source, target = Transformer(TINY), Transformer(TINY)
    state = source.state_dict()
    load_canonical(state, {n: target.get_parameter(n) for n in parameter_schema(TINY)})
    assert all(torch.equal(target.state_dict()[n], state[n]) for n in parameter_schema(TINY))

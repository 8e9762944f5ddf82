"""spec.ModelConfig: defaults are the paper's base model; invalid values name the field."""

import dataclasses

import pytest

from spec import BASE, BIG, PRESETS, TINY, ModelConfig, preset


def test_defaults_are_the_base_model():
    c = ModelConfig()
    assert (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout) == (512, 8, 2048, 6, 0.1)
    assert c.d_k == c.d_v == 64
    assert c.share_embeddings and c.norm_eps == 1e-6 and c.pad_id == 0
    assert c == BASE


def test_big_preset_is_table_3_big():
    assert (BIG.d_model, BIG.n_heads, BIG.d_ff, BIG.n_layers, BIG.dropout) == (1024, 16, 4096, 6, 0.3)
    assert BIG.d_k == 64


def test_tiny_has_several_heads_and_layers():
    assert TINY.n_heads > 1 and TINY.n_layers >= 2 and TINY.d_model <= 64


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.d_model = 256  # type: ignore[misc]


@pytest.mark.parametrize("changes, field", [
    ({"d_model": 30, "n_heads": 4}, "d_model"),
    ({"d_model": -8}, "d_model"),
    ({"n_heads": 0}, "n_heads"),
    ({"d_ff": -1}, "d_ff"),
    ({"n_layers": 0}, "n_layers"),
    ({"max_len": 0}, "max_len"),
    ({"src_vocab": -5}, "src_vocab"),
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"),
    ({"src_vocab": 100, "tgt_vocab": 200}, "share_embeddings"),
    ({"pad_id": 37000}, "pad_id"),
    ({"norm_eps": 0.0}, "norm_eps"),
    ({"d_model": 32.0}, "d_model"),
])
def test_invalid_values_raise_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}"):
        ModelConfig(**changes)


def test_untied_vocabularies_may_differ():
    c = ModelConfig(src_vocab=100, tgt_vocab=200, share_embeddings=False)
    assert c.tgt_vocab == 200


def test_replace_validates_again():
    assert TINY.replace(dropout=0.0).dropout == 0.0
    with pytest.raises(ValueError, match="dropout"):
        TINY.replace(dropout=2.0)


def test_preset_lookup():
    assert preset("base") is BASE and set(PRESETS) == {"base", "big", "tiny"}
    with pytest.raises(ValueError, match="unknown preset 'huge'; accepted: base, big, tiny"):
        preset("huge")


def test_copy_canonical_fills_packed_projections_and_names_bad_tensors():
    import torch

    from spec import copy_canonical

    state = {"a.q.weight": torch.ones(2, 3), "a.k.weight": torch.full((2, 3), 2.0)}
    packed = torch.nn.Parameter(torch.zeros(4, 3))
    copy_canonical(state, packed, "a.q.weight", "a.k.weight")
    assert packed[:2].eq(1).all() and packed[2:].eq(2).all() and packed.requires_grad
    with pytest.raises(ValueError, match=r"a\.q\.weight: shape \(2, 3\), expected \(4, 3\)"):
        copy_canonical(state, packed, "a.q.weight")
    with pytest.raises(ValueError, match=r"canonical state has no a\.v\.weight"):
        copy_canonical(state, packed, "a.q.weight", "a.v.weight")

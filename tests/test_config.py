"""spec.ModelConfig and its parameter counts against the paper's numbers (Table 3, §3.2.2, §5.1); invalid values
name the field."""

import dataclasses
import math

import pytest

from aiayn_conformance.spec import (
    BASE,
    BIG,
    PRESETS,
    TINY,
    ModelConfig,
    parameter_count,
    parameter_schema,
    preset,
    tied_groups,
)

# Table 3 of the paper (arXiv:1706.03762v7): N, d_model, d_ff, h, d_k, d_v, P_drop. The big row leaves d_k and
# d_v blank; §3.2.2's d_k = d_v = d_model / h gives 1024 / 16 = 64.
TABLE_3 = {
    "base": (6, 512, 2048, 8, 64, 64, 0.1),
    "big": (6, 1024, 4096, 16, 64, 64, 0.3),
}


def table_3_row(c: ModelConfig) -> tuple:
    return (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.d_k, c.d_v, c.dropout)


@pytest.mark.parametrize("name", sorted(TABLE_3))
def test_presets_are_table_3(name):
    assert table_3_row(preset(name)) == TABLE_3[name], f"preset {name!r} is not Table 3's {name} row"


def test_defaults_are_the_base_model():
    c = ModelConfig()
    assert table_3_row(c) == TABLE_3["base"] and c == BASE
    # §5.1: a shared source-target vocabulary of about 37000 tokens; §3.4: three-way tying.
    assert c.src_vocab == c.tgt_vocab == 37000 and c.share_embeddings
    assert c.norm_eps == 1e-6 and c.pad_id == 0  # tensor2tensor's epsilon; the paper gives none


@pytest.mark.parametrize("d_model, h, d_k", [
    (512, 1, 512), (512, 4, 128), (512, 16, 32), (512, 32, 16),  # Table 3, rows (A)
    (256, 8, 32), (1024, 8, 128),  # Table 3, rows (C)
])
def test_d_k_and_d_v_are_d_model_over_h(d_model, h, d_k):
    c = ModelConfig(d_model=d_model, n_heads=h)
    assert (c.d_k, c.d_v) == (d_k, d_k)


def test_tiny_has_several_heads_and_layers():
    assert TINY.n_heads > 1 and TINY.n_layers >= 2 and TINY.d_model <= 64 and TINY.d_k * TINY.n_heads == TINY.d_model


def test_parameter_counts_of_the_base_model():
    """The derived numbers: per block, per layer, and the total with V = 37000 and three-way tying."""
    schema = parameter_schema(BASE)

    def size(prefix: str) -> int:
        return sum(math.prod(shape) for name, shape in schema.items() if name.startswith(prefix))

    assert size("encoder.0.self_attn.") == 4 * 512 * 512 == 1_048_576  # W^Q, W^K, W^V, W^O, no bias
    assert size("encoder.0.ffn.") == 2_099_712  # 2 * 512 * 2048 + 2048 + 512 (Eq. 2 has biases)
    assert size("encoder.0.norm1.") == 1_024
    assert size("encoder.0.") == 3_150_336 and size("decoder.0.") == 4_199_936
    assert size("encoder.") + size("decoder.") == 44_101_632
    assert parameter_count(BASE) == 44_101_632 + 37000 * 512 == 63_045_632
    assert parameter_count(BASE.replace(share_embeddings=False)) - parameter_count(BASE) == 2 * 37000 * 512


@pytest.mark.parametrize("name, millions", [("base", 65), ("big", 213)])
def test_totals_match_table_3_within_5_percent(name, millions):
    """Table 3's totals are rounded and depend on the vocabulary (about 37000 tokens, §5.1)."""
    assert abs(parameter_count(preset(name)) / 1e6 - millions) <= 0.05 * millions


@pytest.mark.parametrize("changes, millions", [
    ({"n_layers": 2}, 36), ({"n_layers": 4}, 50), ({"n_layers": 8}, 80),  # Table 3, rows (C)
    ({"d_ff": 1024}, 53), ({"d_ff": 4096}, 90),
    ({"d_k": 16}, 58), ({"d_k": 32}, 60),  # Table 3, rows (B): d_k alone, d_v stays 64
])
def test_table_3_differences_from_the_base_model(changes, millions):
    """Rows (B) and (C) that keep d_model keep the embedding matrix, so their difference from the base model's 65M does
    not depend on the vocabulary: it must match Table 3 within its rounding (each total to 1M)."""
    delta = (parameter_count(BASE.replace(**changes)) - parameter_count(BASE)) / 1e6
    assert abs(delta - (millions - 65)) <= 1.0, f"{changes}: {delta:+.2f}M, Table 3 {millions - 65:+d}M"


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
    ({"d_k": -4}, "d_k"),
    ({"d_v": 16.0}, "d_v"),
    ({"d_k": True}, "d_k"),
    ({"d_model": 30, "n_heads": 4, "d_k": 8}, "d_model"),  # d_v still derived: d_model / h must be whole
])
def test_invalid_values_raise_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}"):
        ModelConfig(**changes)


def test_untied_vocabularies_may_differ():
    c = ModelConfig(src_vocab=100, tgt_vocab=200, share_embeddings=False)
    schema = parameter_schema(c)
    assert (schema["src_embed.weight"], schema["tgt_embed.weight"], schema["generator.weight"]) == \
        ((100, 512), (200, 512), (200, 512))
    assert tied_groups(c) == [] and parameter_count(c) == 44_101_632 + (100 + 200 + 200) * 512


def test_replace_changes_one_field_keeps_the_others_and_validates_again():
    c = BASE.replace(n_heads=16)
    assert table_3_row(c) == (6, 512, 2048, 16, 32, 32, 0.1)  # Table 3, row (A) with h = 16
    assert c.replace(n_heads=8) == BASE and BASE.n_heads == 8  # a copy: the preset is untouched
    with pytest.raises(ValueError, match="dropout"):
        TINY.replace(dropout=2.0)


def test_head_sizes_follow_d_model_and_h_unless_given():
    """d_k and d_v left at 0 are d_model / h and stay derived through replace (a copy at another width or head
    count derives them again); given ones (Table 3, row B) are kept and shape the projections."""
    assert (BASE.d_k, BASE.d_v, BASE.paper_heads) == (64, 64, True)
    assert BASE == ModelConfig(d_k=64, d_v=64) and hash(BASE) == hash(ModelConfig(d_k=64, d_v=64))
    assert (BIG.d_k, BASE.replace(n_heads=16).d_k, TINY.replace(d_model=64).d_v) == (64, 32, 16)
    row_b = BASE.replace(d_k=16)
    assert (row_b.d_k, row_b.d_v, row_b.paper_heads) == (16, 64, False)
    assert row_b.replace(d_model=1024, n_heads=16).d_k == 16  # given: kept
    assert row_b.replace(d_model=1024, n_heads=16).d_v == 64  # derived: 1024 / 16
    assert row_b.replace(d_k=0) == BASE  # 0 derives it again
    schema = parameter_schema(BASE.replace(d_k=16, d_v=32))
    assert [schema[f"encoder.0.self_attn.{p}.weight"] for p in "qkvo"] == [(128, 512), (128, 512), (256, 512),
                                                                          (512, 256)]
    free = ModelConfig(d_model=30, n_heads=4, d_k=8, d_v=8)  # given sizes: h need not divide d_model
    assert not free.paper_heads and parameter_schema(free)["decoder.0.cross_attn.o.weight"] == (30, 32)
    assert "d_k=16" in repr(row_b) and "derived_heads" not in repr(row_b)


def test_preset_lookup():
    assert preset("base") is BASE and set(PRESETS) == {"base", "big", "tiny"}
    with pytest.raises(ValueError, match="unknown preset 'huge'; accepted: base, big, tiny"):
        preset("huge")


def test_copy_canonical_fills_packed_projections_and_names_bad_tensors():
    import torch

    from aiayn_conformance.spec import copy_canonical

    state = {"a.q.weight": torch.ones(2, 3), "a.k.weight": torch.full((2, 3), 2.0)}
    packed = torch.nn.Parameter(torch.zeros(4, 3))
    copy_canonical(state, packed, "a.q.weight", "a.k.weight")
    assert packed[:2].eq(1).all() and packed[2:].eq(2).all() and packed.requires_grad
    with pytest.raises(ValueError, match=r"a\.q\.weight: shape \(2, 3\), expected \(4, 3\)"):
        copy_canonical(state, packed, "a.q.weight")
    with pytest.raises(ValueError, match=r"canonical state has no a\.v\.weight"):
        copy_canonical(state, packed, "a.q.weight", "a.v.weight")

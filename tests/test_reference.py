"""The reference against the canonical schema and against values computed by hand."""

import math

import pytest
import torch

from aiayn_conformance.reference.model import (
    LayerNorm,
    Transformer,
    causal_mask,
    padding_mask,
    reference_twin,
    scaled_dot_product_attention,
    sinusoid_table,
)
from aiayn_conformance.spec import BASE, BIG, TINY, parameter_count, parameter_schema


def test_state_dict_equals_the_canonical_schema():
    model = Transformer(TINY)
    state = model.state_dict()
    schema = parameter_schema(TINY)
    assert list(state) == list(schema), set(state) ^ set(schema)
    for name, shape in schema.items():
        assert tuple(state[name].shape) == shape, name


def test_untied_state_dict_equals_the_schema():
    cfg = TINY.replace(src_vocab=40, tgt_vocab=50, share_embeddings=False)
    model = Transformer(cfg)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == parameter_schema(cfg)
    assert model.src_embed.weight is not model.tgt_embed.weight


def test_three_way_tie():
    model = Transformer(TINY)
    assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight
    assert model.generator.bias is None


def test_positional_table_is_a_non_persistent_buffer():
    model = Transformer(TINY)
    assert "pe" in dict(model.named_buffers()) and "pe" not in model.state_dict()
    assert all(p is not model.pe for p in model.parameters())


def test_parameter_counts_match_the_paper():
    # Table 3 reports 65M (base) and 213M (big) parameters. Counted from §3 with V = 37000 shared tokens (§5.1):
    # 44,101,632 in the 12 layers (6 x 3,150,336 encoder + 6 x 4,199,936 decoder), 63,045,632 with the
    # shared embedding matrix.
    layers = parameter_count(BASE) - BASE.src_vocab * BASE.d_model
    assert layers == 44_101_632
    assert parameter_count(BASE) == 63_045_632
    assert abs(parameter_count(BASE) / 65e6 - 1) < 0.05
    assert abs(parameter_count(BIG) / 213e6 - 1) < 0.05
    model = Transformer(TINY)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(TINY)


def test_pe_values_of_section_3_5():
    # §3.5 at d_model = 512: PE(0) alternates sin 0 = 0 and cos 0 = 1; PE(1, 2i) = sin(1 / 10000^(2i/512)).
    pe = sinusoid_table(2, 512, dtype=torch.float64)
    assert pe[0, :6].tolist() == [0, 1, 0, 1, 0, 1]
    expected = [0.841471, 0.540302, 0.821856, 0.569695, 0.801962, 0.597375]
    assert pe[1, :6].tolist() == pytest.approx(expected, abs=1e-6)


def test_pe_odd_width():
    pe = sinusoid_table(3, 5, dtype=torch.float64)
    assert pe.shape == (3, 5)
    assert pe[1, 4].item() == pytest.approx(math.sin(1 / 10000 ** (4 / 5)))


def test_layer_norm_of_a_known_vector():
    # Layer norm (Ba et al. 2016, used in §3.1) with the biased variance: mean 1/4, variance 3/16, so
    # x = [1, 0, 0, 0] -> [sqrt(3), -1/sqrt(3), -1/sqrt(3), -1/sqrt(3)] = [1.7321, -0.5774, -0.5774, -0.5774].
    ln = LayerNorm(4, eps=0.0)
    out = ln(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert out[0].tolist() == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


def test_attention_by_hand():
    # One query, two keys: scores [2, 0] / sqrt(4) = [1, 0]; weights softmax([1, 0]).
    q = torch.tensor([[[[1.0, 1.0, 1.0, 1.0]]]])
    k = torch.tensor([[[[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]]])
    v = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]])
    w1 = math.e / (math.e + 1)
    out = scaled_dot_product_attention(q, k, v)
    assert out[0, 0, 0, :2].tolist() == pytest.approx([w1, 1 - w1])
    masked = scaled_dot_product_attention(q, k, v, torch.tensor([False, True])[None, None, None])
    assert masked[0, 0, 0, :2].tolist() == [0.0, 1.0]
    nothing = scaled_dot_product_attention(q, k, v, torch.tensor([False, False])[None, None, None])
    assert nothing.abs().sum().item() == 0.0


def test_mask_polarity_and_shapes():
    tokens = torch.tensor([[5, 6, 0]])
    assert padding_mask(tokens, 0).tolist() == [[[[True, True, False]]]]
    cm = causal_mask(3)
    assert cm.shape == (1, 1, 3, 3)
    assert cm[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_embedding_input_is_scaled_embedding_plus_table():
    model = Transformer(TINY).eval()
    src = torch.tensor([[3, 4, 5]])
    got = model.embed(src, model.src_embed)
    expected = model.src_embed.weight[src] * math.sqrt(TINY.d_model) + sinusoid_table(3, TINY.d_model)
    torch.testing.assert_close(got, expected)


def test_positional_encoding_beyond_max_len_follows_the_formula():
    model = Transformer(TINY)
    long = model.positional_encoding(TINY.max_len + 50)
    torch.testing.assert_close(long, sinusoid_table(TINY.max_len + 50, TINY.d_model))


def test_forward_is_finite_for_a_fully_padded_source():
    model = Transformer(TINY).eval()
    src = torch.tensor([[3, 4, 5], [0, 0, 0]])
    tgt = torch.tensor([[1, 2], [1, 2]])
    out = model(src, tgt)
    assert out.shape == (2, 2, TINY.tgt_vocab) and torch.isfinite(out).all()


def test_greedy_decode_stops_at_eos_and_defaults_to_src_len_plus_50():
    torch.manual_seed(0)
    model = Transformer(TINY.replace(max_len=64)).eval()
    src = torch.tensor([[3, 4, 5, 6]])
    never = model.config.tgt_vocab + 1  # an id the model cannot emit
    ys = model.greedy_decode(src, bos_id=1, eos_id=never)
    assert ys.shape == (1, 1 + 4 + 50)
    first = int(ys[0, 1])
    stopped = model.greedy_decode(src, bos_id=1, eos_id=first)
    assert stopped.shape == (1, 2)


def test_greedy_decode_matches_full_recompute_argmax():
    torch.manual_seed(1)
    model = Transformer(TINY).eval()
    src = torch.tensor([[3, 4, 5, 6, 7]])
    ys = model.greedy_decode(src, bos_id=1, eos_id=2, max_new_tokens=6)
    logits = model(src, ys[:, :-1])
    # Batch of one: decoding stops right after EOS, so every emitted token is the argmax of its prefix.
    assert torch.equal(logits.argmax(-1)[0], ys[0, 1:])


@pytest.mark.parametrize("config", [TINY, TINY.replace(share_embeddings=False, tgt_vocab=50)], ids=["tied", "separate"])
def test_reference_twin_is_the_reference_built_and_loaded(config):
    """reference_twin builds without drawing an initialization (every parameter is loaded): the same parameters,
    ties, §3.5 table and outputs as a Transformer built as usual and loaded with the same state; a state that
    leaves a parameter out is refused (nothing stays uninitialized)."""
    from aiayn_conformance.conformance.helpers.transplant import visible_state

    state = visible_state(config, seed=11)
    twin, built = reference_twin(config, state), Transformer(config).eval()
    built.load_reference_state(state)
    assert not twin.training and all(p.requires_grad for p in twin.parameters())  # it trains as built
    assert list(twin.state_dict()) == list(built.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), built.state_dict().values()))
    buffers = dict(built.named_buffers())
    assert {n: torch.equal(b, buffers[n]) for n, b in twin.named_buffers()} == {n: True for n in buffers}
    assert torch.equal(twin.pe, sinusoid_table(config.max_len, config.d_model))
    assert (twin.generator.weight is twin.src_embed.weight) == config.share_embeddings
    src, tgt = torch.randint(1, config.src_vocab, (2, 5)), torch.randint(1, config.tgt_vocab, (2, 4))
    assert torch.equal(twin(src, tgt), built(src, tgt))
    with pytest.raises(RuntimeError, match="Missing key"):
        reference_twin(config, {k: v for k, v in state.items() if k != "decoder.0.ffn.w1.bias"})


def test_each_parameter_is_drawn_once_by_reset_parameters():
    """The layers are built without values (meta, then storage) and reset_parameters draws every parameter: a
    build under a seed equals reset_parameters alone under that seed (nothing drawn before it), the matrices are
    within Xavier-uniform's bound, and the model lands on the default device (meta under ``torch.device("meta")``)."""
    torch.manual_seed(0)
    built = Transformer(TINY)
    torch.manual_seed(0)
    built.reset_parameters()  # the same draws again, on the same parameters
    again = {k: v.clone() for k, v in built.state_dict().items()}
    torch.manual_seed(0)
    fresh = Transformer(TINY).state_dict()
    assert {k: torch.equal(v, again[k]) for k, v in fresh.items()} == {k: True for k in fresh}
    w = built.encoder[0].ffn.w1.weight  # (d_ff, d_model)
    assert float(w.abs().max()) <= math.sqrt(6 / sum(w.shape))
    assert {p.device.type for p in built.parameters()} == {"cpu"}
    with torch.device("meta"):
        shapes_only = Transformer(TINY)
    assert {p.device.type for n, p in shapes_only.named_parameters() if "embed" not in n and "generator" not in n} \
        == {"meta"}


class BufferedNorm(LayerNorm):
    """A norm component holding a buffer set at construction (a value the meta device would lose)."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__(d_model, eps)
        self.register_buffer("offset", torch.full((d_model,), 0.25))

    def forward(self, x):
        return super().forward(x) + self.offset


class SharedLinearFeedForward(torch.nn.Module):
    """A feed-forward component that applies one matrix twice (a tie the meta device's to_empty would break)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = torch.nn.Linear(d_model, d_model)
        self.w2 = self.w1

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


def test_components_keep_their_buffers_and_ties():
    """A component whose buffer or tie building on the meta device would lose is built where it lives: the buffer
    keeps its value, the tie stays one tensor, and every parameter is still drawn (finite, the matrices nonzero)."""
    model = Transformer(TINY, layer_norm=BufferedNorm, feed_forward=SharedLinearFeedForward)
    assert torch.equal(model.encoder[0].norm1.offset, torch.full((TINY.d_model,), 0.25))
    assert model.decoder[1].ffn.w1.weight is model.decoder[1].ffn.w2.weight
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(p.abs().sum() > 0 for p in model.parameters() if p.dim() == 2)

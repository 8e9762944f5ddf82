"""``aiayn scaffold`` on models built by NMT toolkits: builders reading options objects and config dicts, vocabulary
objects, sub-modules defined in other modules, and pre-norm layers whose norms are registered in another order than
they are used. Fixtures in tests/fixtures/scaffold_styles/ stand for each form; the real OpenNMT-py 3.5.1 and
JoeyNMT 2.3.0 entry points are scaffolded when they are installed (skipped otherwise, naming the install command)."""

from __future__ import annotations

import torch
from scaffolded import plugin_module

from aiayn_conformance.conformance.transplant import visible_state
from aiayn_conformance.scaffold import render, scaffold
from aiayn_conformance.spec.config import TINY

PACKAGE = "tests.fixtures.scaffold_styles"


def loaded(target: str, config=TINY, seed: int = 3):
    """The plugin's adapter for ``target`` with the visible canonical weights loaded, and those weights."""
    adapter = plugin_module(target).Adapter(config)
    state = visible_state(config, seed=seed)
    adapter.load_reference_state(state)
    return adapter, state


def assert_placed(adapter, state, expected: dict[str, str]) -> None:
    for canonical, name in expected.items():
        assert torch.equal(adapter.model.get_parameter(name), state[canonical]), f"{canonical} is not in {name}"


# -- norms, told apart by their values ------------------------------------------------------------------------------
def test_pre_norm_layers_have_their_norms_placed_by_the_values_they_compute():
    """Registered feed-forward norm first, attention norms after it with names that say nothing: registration
    order put the feed-forward network's norm on the self-attention; the value probe places each."""
    target = f"{PACKAGE}.prenorm_order:PreNormTransformer"
    adapter, state = loaded(target)
    assert_placed(adapter, state, {
        "encoder.0.norm1.weight": "encoder.0.layer_norm.weight",
        "encoder.1.norm2.bias": "encoder.1.feed_forward.layer_norm.bias",
        "decoder.0.norm1.weight": "decoder.0.x_layer_norm.weight",
        "decoder.1.norm2.weight": "decoder.1.dec_layer_norm.weight",
        "decoder.0.norm3.bias": "decoder.0.feed_forward.layer_norm.bias"})
    assert "registration order" not in render(scaffold(target)).split("def load_reference_state")[1]


def test_norms_no_value_tells_apart_are_marked_saying_which_and_why():
    text = render(scaffold(f"{PACKAGE}.prenorm_order:ParallelTransformer"))
    line = next(ln for ln in text.splitlines() if 'mapping[f"encoder.{i}.norm1.weight"]' in ln)
    assert "# CHECK: layer_norm given the one sub-layer left; the value probe could not tell (" in line
    assert "feed_forward.layer_norm was not called" in line
    assert "layer_norm matches the self-attention and the feed-forward network" in line


# -- sub-modules defined in other modules ---------------------------------------------------------------------------
def test_a_constructor_whose_sub_modules_live_in_other_modules_of_its_package():
    """``Seq2Seq(encoder, decoder)`` in model.py, the classes in encoders.py and decoders.py (not imported by
    model.py), each beside a recurrent class that does not build with a ModelConfig."""
    from scaffolded import reproduces_the_reference

    target = f"{PACKAGE}.split.model:Seq2Seq"
    text = render(scaffold(target))
    assert f"from {PACKAGE}.split.encoders import TransformerEncoder\n" in text
    assert f"from {PACKAGE}.split.decoders import TransformerDecoder\n" in text
    assert (f"encoder=TransformerEncoder(  # CHECK: encoder built as a TransformerEncoder ({PACKAGE}.split.encoders), "
            "the class its name suggests (others: RecurrentEncoder") in text
    reproduces_the_reference(target)


# -- options objects and config dicts -----------------------------------------------------------------------------
def test_an_options_builder_reads_any_number_of_options_from_its_toolkits_parser():
    """``build_model(model_opt, ...)`` reads 13 options only optkit.opts.model_opts defines, bare: they take the
    parser's defaults (the plugin builds the same parser); the architecture options take the paper's values, marked;
    two options no parser defines are None, marked. The plugin reproduces the reference."""
    from scaffolded import reproduces_the_reference

    target = f"{PACKAGE}.optkit.builder:build_model"
    text = render(scaffold(target))
    call = text[text.index("self.model = build_model("):text.index("_init(self.model)")]
    assert "model_opt=options(  # CHECK: the defaults of tests.fixtures.scaffold_styles.optkit.opts.model_opts" in call
    assert "                ArgumentParser,\n                [model_opts],\n" in call
    assert f"from {PACKAGE}.optkit.opts import model_opts\n" in text
    assert 'encoder_type="transformer",  # CHECK: the paper\'s encoder' in call
    assert "position_encoding=True,  # CHECK: the sinusoid of section 3.5" in call
    assert "gpu_ranks=None,  # CHECK: gpu_ranks is no ModelConfig field nor an option of the toolkit's parser" in call
    for line in ("word_vec_size=config.d_model,", "heads=config.n_heads,", "transformer_ff=config.d_ff,",
                 "enc_layers=config.n_layers,"):
        assert line in call, line
    assert "copy_attn" not in call and "feat_merge" not in call  # the parser's defaults, not written
    reproduces_the_reference(target)

"""``aiayn scaffold`` on models built by NMT toolkits: builders reading options objects and config dicts, vocabulary
objects, sub-modules defined in other modules, and pre-norm layers whose norms are registered in another order than
they are used. Fixtures in tests/fixtures/scaffold_styles/ stand for each form; the real OpenNMT-py 3.5.1 and
JoeyNMT 2.3.0 entry points are scaffolded when they are installed (skipped otherwise, naming the install command)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scaffolded import plugin_module

from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.transplant import visible_state
from aiayn_conformance.scaffold import render, scaffold
from aiayn_conformance.spec.config import TINY

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tests.fixtures.scaffold_styles"
OPENNMT = ("pip install --no-deps OpenNMT-py==3.5.1 pyonmttok==1.38.1 && "
           "pip install spacy fasttext-wheel rapidfuzz pyahocorasick configargparse regex")
JOEYNMT = ("pip install --no-deps joeynmt==2.3.0 importlib_metadata zipp lazy-importer tensorboard absl-py "
           "sentencepiece subword-nmt")


def missing(distribution: str, version: str, module: str) -> str:
    """"" when ``distribution`` ``version`` is installed and ``module`` imports, else why not."""
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return f"{distribution} is not installed"
    if found != version:
        return f"{distribution} {found} is installed, not {version}"
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure to import means: skip, saying why
        return f"import {module} fails ({type(exc).__name__}: {exc})"
    return ""


def in_a_fresh_process(call: str) -> object:
    """``call`` (an expression of tests/scaffolded.py's names) evaluated in a new Python process; its JSON value."""
    code = (f"import json, logging, sys, warnings; sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT)!r}]; "
            "warnings.simplefilter('ignore'); logging.disable(logging.CRITICAL); "
            f"from scaffolded import *; print(json.dumps({call}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


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


def test_a_config_dict_builder_taking_vocabulary_objects():
    """``build_model(cfg=None, src_vocab=None, trg_vocab=None)``: the dict's sections are the ones it reads, each
    holding the keys it reads and those the constructors it is unpacked into take (their defaults are not the
    paper's); the vocabularies are its own class built from made-up tokens, the first special-token ids it
    accepts putting the pad token at config.pad_id. The plugin reproduces the reference."""
    from scaffolded import reproduces_the_reference

    target = f"{PACKAGE}.dictkit.model:build_model"
    text = render(scaffold(target))
    call = text[text.index("self.model = build_model("):text.index("_init(self.model)")]
    encoder = call[call.index('"encoder": {'):call.index('"decoder": {')]
    for line in ('"hidden_size": config.d_model,', '"ff_size": config.d_ff,', '"num_layers": config.n_layers,',
                 '"num_heads": config.n_heads,', '"embedding_dim": config.d_model,',
                 '"type": "transformer",  # CHECK: read as the architecture', '"scale": True,  # CHECK:'):
        assert line in encoder, line
    assert '"tied_embeddings": config.share_embeddings,' in call
    assert "src_vocab=vocabulary(  # CHECK: a Vocabulary of made-up tokens built by its own constructor\n" in call
    assert "                    pad_id=0,\n" in call
    assert f"from {PACKAGE}.dictkit.model import build_model, Vocabulary\n" in text
    reproduces_the_reference(target)


# -- the real toolkits ------------------------------------------------------------------------------------------------
ONMT_MISSING = missing("OpenNMT-py", "3.5.1", "onmt.model_builder")
JOEY_MISSING = missing("joeynmt", "2.3.0", "joeynmt.model")


@pytest.mark.skipif(bool(ONMT_MISSING), reason=f"{ONMT_MISSING}; to run it: {OPENNMT}")
def test_opennmt_py_build_base_model(tmp_path):
    """``onmt.model_builder:build_base_model(model_opt, vocabs)``: options from onmt.opts.model_opts's defaults,
    the architecture options set to the paper's (marked), OpenNMT-py's own vocabularies. Written plugin imported in
    a fresh process: with the canonical weights loaded, each part of OpenNMT-py's model computes what the
    reference's part computes (each sub-layer with the norm OpenNMT-py puts before it, the embeddings with their
    scale and sinusoid, the projection); OpenNMT-py is pre-norm, so the whole model does not."""
    path = tmp_path / "onmt_plugin.py"
    assert main(["scaffold", "onmt.model_builder:build_base_model", "--name", "onmt", "-o", str(path)]) == 0
    text = path.read_text()
    for line in ("model_opt=options(  # CHECK: the defaults of onmt.opts.model_opts", "[model_opts],",
                 'encoder_type="transformer",  # CHECK:', "position_encoding=True,  # CHECK:",
                 "vocabs=dict_to_vocabs(  # CHECK: the toolkit's own vocabularies",
                 "table = _attribute(self.model, 'encoder.embeddings.make_embedding.pe.pe')"):
        assert line in text, line
    assert "registration order" not in text.split("def load_reference_state")[1]
    gaps = in_a_fresh_process(f"opennmt_gaps({str(path)!r})")
    assert isinstance(gaps, dict) and len(gaps) == 14  # 5 parts of each of 2 layers, embeddings, projection, norms
    assert all(gap <= 1e-4 for gap in gaps.values()), gaps


@pytest.mark.skipif(bool(JOEY_MISSING), reason=f"{JOEY_MISSING}; to run it: {JOEYNMT}")
def test_joeynmt_build_model(tmp_path):
    """``joeynmt.model:build_model(cfg, src_vocab, trg_vocab)``: ``cfg`` the model section JoeyNMT reads (its
    sections, the keys of the constructors they are unpacked into, the paper's post-norm, type and embedding scale,
    marked), JoeyNMT's own Vocabulary objects. Written plugin imported in a fresh process: with the canonical
    weights loaded, JoeyNMT's model, run by its own _encode_decode, computes the reference's log-probabilities."""
    path = tmp_path / "joeynmt_plugin.py"
    assert main(["scaffold", "joeynmt.model:build_model", "--name", "joeynmt", "-o", str(path)]) == 0
    text = path.read_text()
    for line in ('"layer_norm": "post",  # CHECK:', '"scale": True,  # CHECK:', '"num_heads": config.n_heads,',
                 "src_vocab=vocabulary(  # CHECK: a Vocabulary of made-up tokens built by its own constructor; its "
                 "pad token is at 1, not config.pad_id (0)", "table = _attribute(self.model, 'encoder.pe.pe')"):
        assert line in text, line
    assert "registration order" not in text.split("def load_reference_state")[1]
    gap = in_a_fresh_process(f"joeynmt_gap({str(path)!r})")
    assert isinstance(gap, float) and gap <= 1e-4, gap

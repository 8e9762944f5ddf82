"""``aiayn scaffold`` on the naming conventions of the main ecosystems: for one fixture per
convention (tests/fixtures/scaffold_map/), the plugin as written (no hand edit: its ``# CHECK:`` lines accepted)
loads each canonical tensor where it belongs, is unmarked only where the value probe proved it, has ``encode()``,
``positional_encoding()``, the mask convention its forward follows and the repository's initialisation, and the
audit of it (restricted by --clause) finds exactly the fixture's planted departures under their clauses."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state
from aiayn_conformance.scaffold import naming, render, scaffold
from aiayn_conformance.scaffold.construct import PROBE
from aiayn_conformance.scaffold.masks import Convention, _try, mask_lines
from aiayn_conformance.spec.config import TINY

ROOT = Path(__file__).resolve().parents[1]
PKG = "tests.fixtures.scaffold_map"
EVERY = ("model.reference-equivalence", "config.parameters")
# fixture -> (target, the clauses its planted departures break among AUDITED, canonical -> (model parameter, rows))
FIXTURES: dict[str, tuple[str, set[str], dict[str, tuple[str, slice | None]]]] = {
    "hf": (f"{PKG}.hf_style:BartLike", {"config.parameters"}, {  # q/k/v/o biases: the paper's projections have none
        "encoder.0.self_attn.q.weight": ("encoder.layers.0.self_attn.q_proj.weight", None),
        "encoder.0.self_attn.k.weight": ("encoder.layers.0.self_attn.k_proj.weight", None),
        "encoder.0.self_attn.v.weight": ("encoder.layers.0.self_attn.v_proj.weight", None),
        "encoder.0.self_attn.o.weight": ("encoder.layers.0.self_attn.out_proj.weight", None),
        "decoder.1.cross_attn.k.weight": ("decoder.layers.1.encoder_attn.k_proj.weight", None),
        "decoder.0.norm2.weight": ("decoder.layers.0.encoder_attn_layer_norm.weight", None),
        "decoder.0.norm3.bias": ("decoder.layers.0.final_layer_norm.bias", None),
        "encoder.1.ffn.w1.weight": ("encoder.layers.1.fc1.weight", None)}),
    "mha": (f"{PKG}.torch_mha:TorchStyleTransformer", {"norm.no-extra-norm", "config.parameters",
                                                         "model.reference-equivalence"}, {
        "encoder.0.self_attn.q.weight": ("encoder_layers.0.self_attn.in_proj_weight", slice(0, 32)),
        "encoder.0.self_attn.k.weight": ("encoder_layers.0.self_attn.in_proj_weight", slice(32, 64)),
        "decoder.1.cross_attn.v.weight": ("decoder_layers.1.multihead_attn.in_proj_weight", slice(64, 96)),
        "decoder.1.cross_attn.o.weight": ("decoder_layers.1.multihead_attn.out_proj.weight", None),
        "decoder.0.norm3.weight": ("decoder_layers.0.norm3.weight", None)}),
    "annotated": (f"{PKG}.annotated_style:EncoderDecoder", {"norm.post-norm", "norm.no-extra-norm",
                                                             "config.parameters", "model.reference-equivalence"}, {
        "encoder.0.self_attn.q.weight": ("encoder.layers.0.self_attn.linears.0.weight", None),
        "encoder.0.self_attn.o.weight": ("encoder.layers.0.self_attn.linears.3.weight", None),
        "decoder.1.cross_attn.v.weight": ("decoder.layers.1.src_attn.linears.2.weight", None),
        "decoder.1.norm2.weight": ("decoder.layers.1.sublayer.1.norm.a_2", None),
        "encoder.0.ffn.w2.bias": ("encoder.layers.0.feed_forward.w_2.bias", None)}),
    "jadore": (f"{PKG}.jadore_style:Transformer", {"embedding.scale", "model.reference-equivalence"}, {
        "encoder.0.self_attn.q.weight": ("encoder_layer_stack.0.slf_attn.w_qs.weight", None),
        "encoder.0.self_attn.o.weight": ("encoder_layer_stack.0.slf_attn.fc.weight", None),
        "decoder.1.cross_attn.k.weight": ("decoder_layer_stack.1.enc_attn.w_ks.weight", None),
        "decoder.0.norm2.weight": ("decoder_layer_stack.0.enc_attn.layer_norm.weight", None),
        "decoder.0.norm3.weight": ("decoder_layer_stack.0.pos_ffn.layer_norm.weight", None)}),
    "fused": (f"{PKG}.fused_qkv:FusedSeq2Seq", set(), {
        "encoder.0.self_attn.q.weight": ("enc.0.attn.qkv.weight", slice(0, 32)),
        "encoder.0.self_attn.k.weight": ("enc.0.attn.qkv.weight", slice(32, 64)),
        "decoder.1.self_attn.v.weight": ("dec.1.attn.qkv.weight", slice(64, 96)),
        "decoder.1.cross_attn.k.weight": ("dec.1.cross.kv.weight", slice(0, 32)),
        "decoder.1.cross_attn.v.weight": ("dec.1.cross.kv.weight", slice(32, 64)),
        "decoder.1.cross_attn.o.weight": ("dec.1.cross.proj.weight", None),
        "encoder.1.norm2.weight": ("enc.1.ln_3.weight", None)}),
    "learned": (f"{PKG}.learned_positions:LearnedPositions", {"position.formula", "config.parameters",
                                                               "model.reference-equivalence"}, {
        "encoder.0.self_attn.q.weight": ("encoder.layer.0.attention.query.weight", None),
        "encoder.0.self_attn.o.weight": ("encoder.layer.0.attention.dense.weight", None),
        "decoder.0.cross_attn.k.weight": ("decoder.layer.0.crossattention.key.weight", None),
        "decoder.0.norm2.bias": ("decoder.layer.0.cross_norm.bias", None)}),
    "head-axis": (f"{PKG}.head_axis:Seq2Seq", set(), {
        "encoder.0.self_attn.q.weight": ("encoder.0.attn.wq.weight", None),
        "decoder.0.cross_attn.o.weight": ("decoder.0.enc_attn.wo.weight", None),
        "decoder.1.norm2.weight": ("decoder.1.norm_2.weight", None)}),
    "ffn-2048": (f"{PKG}.ffn_fixed:Seq2Seq", {"config.parameters"}, {
        "encoder.0.ffn.w1.weight": ("encoder.0.ff.lin1.weight", None),
        "decoder.1.ffn.w2.bias": ("decoder.1.ff.lin2.bias", None)}),
    "init-loop": (f"{PKG}.initialised.model:Model", set(), {
        "encoder.0.self_attn.q.weight": ("encoder.0.self_attention.q_linear.weight", None),
        "decoder.1.cross_attn.o.weight": ("decoder.1.cross_attention.out.weight", None),
        "decoder.1.norm3.weight": ("decoder.1.norm3.weight", None)}),
}
AUDITED = ("model.reference-equivalence", "config.parameters", "embedding.scale", "norm.post-norm",
           "norm.no-extra-norm", "position.formula")
CONVERGE = {"ffn-2048": TINY.replace(d_ff=2048)}  # the config its FFN loads at
# The fixtures whose planted departures leave the mapping provable: the value probe loads the sinusoid into a learned
# table and probes a model ignoring d_ff at its own width; the others change what the layers compute.
PROVED = ["hf", "fused", "learned", "head-axis", "ffn-2048", "init-loop"]
_TEXTS: dict[str, str] = {}


def text_of(key: str) -> str:
    if key not in _TEXTS:
        _TEXTS[key] = render(scaffold(FIXTURES[key][0], f"sm-{key}"))
    return _TEXTS[key]


def plugin(key: str) -> types.ModuleType:
    module = types.ModuleType(f"scaffold_map_{key.replace('-', '_')}")
    exec(compile(text_of(key), f"<scaffold of {key}>", "exec"), module.__dict__)
    return module


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]]), torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])


@pytest.mark.parametrize("key", list(FIXTURES))
def test_the_plugin_as_written_puts_each_canonical_tensor_where_it_belongs(key):
    config = CONVERGE.get(key, TINY)
    adapter = plugin(key).Adapter(config)
    state = visible_state(config, seed=3)
    adapter.load_reference_state(state)
    for canonical, (name, rows) in FIXTURES[key][2].items():
        got = adapter.model.get_parameter(name)
        got = got[rows] if rows is not None else got
        assert torch.equal(got, state[canonical]), f"{canonical} is not in {name}{'' if rows is None else rows}"
    src, tgt = batch()
    assert adapter.eval()(src, tgt).shape == (2, 4, config.tgt_vocab)


@pytest.mark.parametrize("key", PROVED)
def test_a_proved_mapping_is_unmarked_and_reproduces_the_reference(key):
    """No planted departure changes the outputs: the value probe proves the mapping; the plugin's lines carry no
    mapping CHECK, and at the suite's own sizes it reproduces the reference (forward and encode)."""
    text = text_of(key)
    assert "# Proved by the scaffold's value probe" in text and "not proved" not in text
    assert "registration order" not in text.split("def load_reference_state")[1]
    config = CONVERGE.get(key, TINY).replace(dropout=0.0)
    adapter = plugin(key).Adapter(config).eval()
    state = visible_state(config, seed=5)
    adapter.load_reference_state(state)
    ref = reference_twin(config, state)
    learned = ("encoder.position_embeddings.weight", "decoder.position_embeddings.weight")
    for table in learned if key == "learned" else ():  # the probe's sinusoid in the learned tables
        adapter.model.get_parameter(table).data.copy_(ref.positional_encoding(config.max_len))
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(adapter(src, tgt).log_softmax(-1)[tgt != 0],
                                   ref(src, tgt).log_softmax(-1)[tgt != 0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(adapter.encode(src)[src != 0], ref.encode(src)[src != 0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key", [k for k in FIXTURES if k not in PROVED])
def test_a_mapping_the_probe_cannot_prove_is_marked_line_by_line(key):
    text = text_of(key)
    assert "# CHECK: not proved" in text
    body = text.split("def load_reference_state")[1].split("load_canonical(state")[0]
    lines = [ln for ln in body.splitlines() if "get(" in ln and "mapping[" in ln]
    unmarked = [ln for ln in lines if "# CHECK:" not in ln]
    proved_encoder = "the encoder's lines are proved" in text
    assert all('"encoder.' in ln or "f\"encoder." in ln for ln in unmarked) if proved_encoder else not unmarked


def test_a_projection_shared_by_every_head_is_named_as_such():
    """queries / keys / values as [d_k, d_k] linears applied to every head's slice: the scaffold says each is one
    projection shared by every head, which cannot hold the paper's per-head W^Q_i, not that none was found; the
    plugin refuses to load the canonical q, k and v with that reason."""
    text = render(scaffold(f"{PKG}.shared_heads:Seq2Seq", "sm-shared-heads"))
    for x, word in (("q", "queries"), ("k", "keys"), ("v", "values")):
        note = (f"# CHECK: the {x} projection attn.{word}.weight [8, 8] is shared by every head (one weight applied "
                f"to each head's slice), so it cannot hold the paper's per-head W^{x.upper()}_i")
        assert note in text, f"no note naming attn.{word}.weight as shared by every head in:\n{text}"
    assert "projection found" not in text.split("def load_reference_state")[1], text
    module = types.ModuleType("scaffold_map_shared_heads")
    exec(compile(text, "<scaffold of shared-heads>", "exec"), module.__dict__)
    with pytest.raises(ValueError, match=r"^encoder\.0\.self_attn\.q\.weight is not mapped yet \(the q projection "
                                         r"attn\.queries\.weight \[8, 8\] is shared by every head"):
        module.Adapter(TINY).load_reference_state(visible_state(TINY))


def test_hugging_face_names_the_old_bug_reproduced_and_now_caught(monkeypatch):
    """With "proj" among the output words (as an older table had it), q_proj / k_proj / v_proj were ambiguous and the
    registration order (k, v, q as BartAttention registers them) mapped q <- k_proj; the value probe now refuses to
    write that silently."""
    target = FIXTURES["hf"][0]
    fixed = render(scaffold(target))
    assert 'self_attn.q.weight"] = get(f"encoder.layers.{i}.self_attn.q_proj.weight")\n' in fixed
    monkeypatch.setitem(naming.PROJ, "o", naming.PROJ["o"] | {"proj"})
    old = render(scaffold(target))
    wrong = re.search(r'self_attn\.q\.weight"\] = get\(f"encoder\.layers\.\{i\}\.self_attn\.(\w+)\.weight"\)(.*)', old)
    assert wrong and wrong.group(1) == "k_proj", "the old table no longer reproduces the bug"
    assert "# CHECK:" in wrong.group(2) and "# CHECK: not proved" in old


def test_the_mask_convention_is_found_by_probing_the_forward():
    """head_axis adds the head axis itself: 3-D masks pass; a 4-D guess gives the attention a
    fifth axis, and the call crashes or returns the wrong shape: rejected. The Annotated layout takes 4-D masks as
    they are."""
    assert "source 3-D, boolean, True = may attend, target 3-D" in text_of("head-axis")
    assert "(tgt != pad)[:, None, :]" in text_of("head-axis")
    assert "source 4-D, boolean, True = may attend" in text_of("annotated")
    module_name, _, cls = FIXTURES["head-axis"][0].partition(":")
    model = getattr(__import__(module_name, fromlist=[cls]), cls)(37, 37, 32, 2, 4, 48, 0.0, 24).eval()
    four = mask_lines(["src", "tgt"], Convention(4, "bool"), Convention(4, "bool"))
    assert re.match(r"raised|returned \[", _try(model, PROBE, *four))  # the crash a 4-D guess gives
    blocked = mask_lines(["src", "tgt"], Convention(3, "blocked"), Convention(3, "blocked"))
    assert _try(model, PROBE, *blocked)  # the wrong polarity: attends to padding and the future


def test_a_learned_positional_table_is_returned_and_marked():
    text = text_of("learned")
    assert "self.model.get_parameter('encoder.position_embeddings.weight')  # CHECK: a learned table" in text
    assert "the decoder adds its own (decoder.position_embeddings.weight)" in text
    adapter = plugin("learned").Adapter(TINY)
    assert torch.equal(adapter.positional_encoding(5), adapter.model.encoder.position_embeddings.weight[:5])


def test_the_repository_initialisation_is_proposed_or_asked_for():
    text = text_of("init-loop")
    assert "(train.py:8), applied after building the model" in text
    assert "nn.init.xavier_uniform_(p)" in text and "_init(self.model)" in text
    adapter = plugin("init-loop").Adapter(TINY)
    w = adapter.model.encoder[0].feed_forward.linear_1.weight  # [d_ff, d_model]: Xavier's bound, not Kaiming's
    assert w.abs().max() <= math.sqrt(6 / sum(w.shape)) and w.abs().max() > 1 / math.sqrt(w.shape[1])
    assert "# CHECK: no initialisation found next to the class" in text_of("hf")


def test_an_ignored_ffn_width_is_reported_with_what_was_found():
    text = text_of("ffn-2048")
    said = "d_ff=48 requested, the model's FFN is 2048 wide whatever d_ff says"
    assert f'get(f"encoder.{{i}}.ff.lin1.weight")  # CHECK: {said}' in text
    assert f"# CHECK: config.parameters will fail: {said}" in text
    assert "no [48, 32] weight found" not in text and "no bias found" not in text


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> dict[str, dict[str, str]]:
    """One suite run over every fixture's plugin as written (CLI), restricted to AUDITED: impl -> {failing clause:
    its messages}."""
    where = tmp_path_factory.mktemp("scaffold_map")
    plugins = []
    for key in FIXTURES:
        path = where / f"sm_{key.replace('-', '_')}.py"
        assert main(["scaffold", FIXTURES[key][0], "--name", f"sm-{key}", "-o", str(path)]) == 0
        plugins.append(f"--plugin={path}")
    xml = where / "audit.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "conformance/", *plugins,
                          f"--impl={','.join(f'sm-{k}' for k in FIXTURES)}", f"--clause={','.join(AUDITED)}",
                          "-k", "not variant and not explored", "--check-timeout=900", "-q", "-p", "no:cacheprovider",
                          f"--junitxml={xml}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1500, env=_env())
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-2000:]
    failing: dict[str, dict[str, str]] = {f"sm-{k}": {} for k in FIXTURES}
    unchecked: dict[str, str] = {}  # "impl clause" -> its "could not be checked" messages
    for case in ET.parse(xml).getroot().iter("testcase"):
        for bad in list(case.iter("failure")) + list(case.iter("error")):
            impl = re.search(r"\[(sm-[^\]]+)\]", case.get("name", ""))
            clause = re.search(r"\[([a-z]+\.[a-z0-9-]+)\]", bad.get("message", "") + (bad.text or ""))
            assert impl and clause, f"unattributed result {case.get('name')}: {bad.get('message', '')[:300]}"
            said = (bad.text or "") + bad.get("message", "")
            who = _impl(impl.group(1))
            found, key = (unchecked, f"{who} {clause.group(1)}") if "could not be checked" in said else \
                (failing[who], clause.group(1))
            found[key] = found.get(key, "") + said
    failing["unchecked"] = unchecked
    return failing


def _impl(name: str) -> str:
    return max((f"sm-{k}" for k in FIXTURES if name.startswith(f"sm-{k}")), key=len)


def _env() -> dict[str, str]:
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.parametrize("key", list(FIXTURES))
def test_the_audit_finds_exactly_the_planted_departures(audit, key):
    assert set(audit[f"sm-{key}"]) == FIXTURES[key][1]


def test_config_parameters_says_which_size_the_model_ignores(audit):
    """The FFN fixed at 2048 is reported under config.parameters with what was found; the transplant-based checks
    could not load the d_ff-wide canonical weights into it and say so (only for that fixture)."""
    said = audit["sm-ffn-2048"]["config.parameters"]
    assert "d_ff=64 requested, the model's FFN is 2048 wide whatever d_ff says" in said
    assert "whatever d_ff says" not in audit["sm-hf"]["config.parameters"]  # biases: another reason
    for which, message in audit["unchecked"].items():
        assert which.startswith("sm-ffn-2048 ") and "shape (64, 32), expected (2048, 32)" in message, which

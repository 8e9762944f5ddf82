"""``aiayn scaffold MODULE:CLASS``: the plugin it writes for the built-in model classes loads the canonical weights
exactly where their hand-written ``load_reference_state`` puts them, and, on a conforming model, computes the
reference's outputs once its CHECK lines are accepted as written. Bad targets get one-line errors. The scaffold's code
keeps its functions short (no function over MAX_FUNCTION_LINES) and its modules in pipeline order."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from registered import builtin_module
from scaffolded import plugin_module, reproduces_the_reference

from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.transplant import visible_state
from aiayn_conformance.implementations import Registry
from aiayn_conformance.scaffold import render, scaffold
from aiayn_conformance.spec.config import TINY

ROOT = Path(__file__).resolve().parents[1]

# The classes of the built-in plugins (each has its own load_reference_state to compare with), and the layout of
# hyunwoongko/transformer's model class (keyword constructor; compared with the hyunwoongko plugin's mapping).
SEEDS = {
    "aiayn_conformance.reference.model:Transformer": None,
    builtin_module("fused:FusedTransformer"): None,
    builtin_module("hyunwoongko:Transformer"): None,
    builtin_module("jadore801120:Transformer"): None,
    builtin_module("building_blocks:Transformer"): None,
    builtin_module("annotated_notebook:AnnotatedNotebookTransformer"): None,
    builtin_module("torch_nn:TorchNNTransformer"): None,
    builtin_module("prenorm:PreNormTransformer"): None,
    "tests.fixtures.hyunwoongko_layout:Transformer": builtin_module("hyunwoongko:Transformer"),
}
CONFIGS = {"tiny": TINY,
           "untied-3-layers": TINY.replace(n_layers=3, share_embeddings=False, src_vocab=41, tgt_vocab=43)}


def hand_written(target: str, config):
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    torch.manual_seed(0)
    return cls(config)


@pytest.mark.parametrize("which", list(CONFIGS))
@pytest.mark.parametrize("target", list(SEEDS))
def test_scaffold_mapping_equals_the_hand_written_one(target, which):
    config = CONFIGS[which]
    adapter = plugin_module(target).Adapter(config)
    state = visible_state(config, seed=4)
    adapter.load_reference_state(state)
    own = hand_written(SEEDS[target] or target, config)
    own.load_reference_state(state)
    mine, theirs = adapter.model.state_dict(), own.state_dict()
    assert list(mine) == list(theirs)
    differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert not differ, f"the scaffold's mapping puts other values in {differ[:5]}"


@pytest.mark.parametrize("target", ["aiayn_conformance.reference.model:Transformer",
                                    builtin_module("fused:FusedTransformer")])
def test_scaffold_of_a_conforming_model_matches_the_reference(target):
    adapter, ref = reproduces_the_reference(target)
    with torch.no_grad():
        torch.testing.assert_close(adapter.positional_encoding(7), ref.positional_encoding(7))


def test_scaffolded_plugin_passes_the_suite_on_a_conforming_model(tmp_path):
    """The file as written, loaded with --plugin: the suite's differential check passes."""
    path = tmp_path / "fused_plugin.py"
    assert main(["scaffold", builtin_module("fused:FusedTransformer"), "--name", "fused-scaffolded", "-o",
                 str(path)]) == 0
    reg = Registry([str(path)], entry_points=False, env={}, builtins=())
    assert reg.names() == ["fused-scaffolded"]
    run = subprocess.run([sys.executable, "-m", "pytest", "conformance/", f"--plugin={path}",
                          "--impl=fused-scaffolded", "--clause=model.reference-equivalence,config.parameters",
                          "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"\b[1-9]\d* passed", run.stdout)


def test_what_cannot_be_placed_fails_in_one_line_naming_it():
    """sections-notebook keeps each layer-norm gain as one scalar: no [d_model] home for the canonical gain."""
    target = "aiayn_conformance.implementations.builtins.sections_notebook:SectionsNotebookTransformer"
    text = render(scaffold(target))
    assert re.search(r"# CHECK: no \[32\] layer-norm parameter found \(left in this layer: "
                     r"residual_connections\.0\.norm\.alpha \[1\]", text)
    adapter = plugin_module(target).Adapter(TINY)
    with pytest.raises(ValueError, match=r"^encoder\.0\.norm1\.weight is not mapped yet \(no \[32\] layer-norm"):
        adapter.load_reference_state(visible_state(TINY))


def test_uncertain_lines_are_marked_and_counted():
    text = render(scaffold(builtin_module("annotated_notebook:AnnotatedNotebookTransformer")))
    assert "q, k, v, o chosen by registration order" in text  # attention.linears.0..3: no names to go by
    assert f"Review every line marked `# CHECK:` ({text.count('# CHECK:')} of them)" in text
    keyword = render(scaffold("tests.fixtures.hyunwoongko_layout:Transformer"))
    assert "trg_sos_idx=1,  # CHECK: not in ModelConfig" in keyword
    assert "enc_voc_size=config.src_vocab," in keyword and "ffn_hidden=config.d_ff," in keyword
    assert 'get(f"encoder.layers.{i}.attention.w_q.weight")\n' in keyword  # decided from names: no CHECK


def test_output_file_and_overwrite(tmp_path, capsys):
    path = tmp_path / "plugin.py"
    assert main(["scaffold", "aiayn_conformance.reference.model:Transformer", "-o", str(path)]) == 0
    assert "marked # CHECK: to review" in capsys.readouterr().err
    assert main(["scaffold", "aiayn_conformance.reference.model:Transformer", "-o", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"aiayn scaffold: {path} exists; pass --force to overwrite it"
    assert main(["scaffold", "aiayn_conformance.reference.model:Transformer", "-o", str(path), "--force"]) == 0
    assert main(["scaffold", "aiayn_conformance.reference.model:Transformer"]) == 0
    assert capsys.readouterr().out.startswith('"""aiayn plugin for aiayn_conformance.reference.model:Transformer')


def test_a_file_path_target(tmp_path):
    text = render(scaffold(f"{ROOT / 'tests' / 'fixtures' / 'hyunwoongko_layout.py'}:Transformer"))
    assert "from hyunwoongko_layout import Transformer" in text and "# CHECK: where hyunwoongko_layout.py lives" in text


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:Model", "aiayn scaffold: cannot import module 'no_such_module_xyz': ModuleNotFoundError: "
                                 "No module named 'no_such_module_xyz'"),
    ("aiayn_conformance.reference.model", "aiayn scaffold: 'aiayn_conformance.reference.model' is not MODULE:CLASS"),
    ("aiayn_conformance.reference.model:Nope", "aiayn scaffold: module 'aiayn_conformance.reference.model' has no "
                                               "'Nope'; its nn.Module classes: DecoderLayer, EncoderLayer, LayerNorm"),
    ("aiayn_conformance.reference.model:sinusoid_table", "aiayn scaffold: aiayn_conformance.reference.model:"
                                                         "sinusoid_table is a function, not a torch.nn.Module class"),
    ("aiayn_conformance.spec.config:ModelConfig", "aiayn scaffold: aiayn_conformance.spec.config:ModelConfig is a "
                                                  "class but not a torch.nn.Module"),
    ("torch.nn:Linear", "aiayn scaffold: cannot build Linear with a ModelConfig: tried Linear(in_features=?, "
                        "out_features=?"),
    ("no/such/file.py:Model", "aiayn scaffold: cannot import no/such/file.py: no such file"),
])
def test_bad_targets_get_one_line_and_exit_2(target, message, capsys):
    assert main(["scaffold", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_cannot_build_names_every_constructor_tried(capsys):
    assert main(["scaffold", "torch.nn:Embedding"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("aiayn scaffold: cannot build Embedding with a ModelConfig: tried Embedding(num_embeddings=?, "
                   "embedding_dim=config.d_model, padding_idx=config.pad_id, device=\"cpu\"): no ModelConfig field "
                   "matches the "
                   "required parameter 'num_embeddings'")


# -- the scaffold's own code -------------------------------------------------------------------------------------
SCAFFOLD = ROOT / "aiayn_conformance" / "scaffold"
MAX_FUNCTION_LINES = 80


def function_lengths(source: str, where: str = "<source>") -> dict[str, int]:
    """Every function in ``source`` (methods and nested functions included) -> its length in lines, from its first
    decorator to its last line."""
    lengths = {}
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lengths[f"{where}:{node.lineno} {node.name}"] = (node.end_lineno or node.lineno) - start + 1
    return lengths


def test_the_module_map_lists_every_module_in_pipeline_order():
    """The package docstring lists each module once, in the order a target flows through them; each module imports
    only from modules listed above it (no stage reaches back into a later one, or returns to one already left)."""
    doc = ast.get_docstring(ast.parse((SCAFFOLD / "__init__.py").read_text())) or ""
    listed = re.findall(r"^    (\w+\.py) ", doc, re.M)
    assert sorted(listed) == sorted(p.name for p in SCAFFOLD.glob("*.py")), listed
    order = {name.removesuffix(".py"): n for n, name in enumerate(listed)}
    backwards = []
    for name, n in order.items():
        for node in ast.walk(ast.parse((SCAFFOLD / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                dep = (node.module or "") if node.level == 1 else \
                    (node.module or "").removeprefix("aiayn_conformance.scaffold.") if \
                    (node.module or "").startswith("aiayn_conformance.scaffold.") else None
                if dep is not None and order[dep.split(".")[0]] >= n:
                    backwards.append(f"{name} imports {dep}")
    assert not backwards, backwards


def test_no_scaffold_function_is_over_80_lines():
    modules = sorted(SCAFFOLD.glob("*.py"))
    assert len(modules) >= 5, f"the scaffold is split by job into a package: found {[m.name for m in modules]}"
    lengths = {k: n for m in modules for k, n in function_lengths(m.read_text(), m.name).items()}
    assert len(lengths) > 20, "the measure found too few functions to be reading the scaffold"
    over = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines in the scaffold: {over}"


def test_the_length_measure_counts_decorators_docstrings_and_nested_functions():
    def source(body_lines: int) -> str:
        body = "\n".join(f"        x{n} = {n}" for n in range(body_lines))
        return f"@decorator\ndef outer():\n    \"\"\"Doc.\"\"\"\n    def inner():\n{body}\n    return inner\n"

    lengths = function_lengths(source(MAX_FUNCTION_LINES - 1))
    assert lengths == {"<source>:2 outer": MAX_FUNCTION_LINES + 4, "<source>:4 inner": MAX_FUNCTION_LINES}
    over = {k for k, n in function_lengths(source(MAX_FUNCTION_LINES)).items() if n > MAX_FUNCTION_LINES}
    assert over == {"<source>:2 outer", "<source>:4 inner"}

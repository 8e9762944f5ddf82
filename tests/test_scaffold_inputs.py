"""``aiayn scaffold`` takes models as people write them: constructors that take built
sub-modules, factory functions, tutorial argument names, notebooks, library config objects.

The fixtures in tests/fixtures/scaffold_styles/ are written in those styles with planted departures. For each, the
plugin the scaffold writes is used as written (its ``# CHECK:`` lines accepted), and the audit finds the planted
departures under their clauses and nothing else among the clauses it runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from scaffolded import plugin_module, reproduces_the_reference
from torch import nn

from aiayn_conformance.cli import main
from aiayn_conformance.scaffold import render, scaffold
from aiayn_conformance.scaffold.construct import build_with_config
from aiayn_conformance.scaffold.synonyms import ASSUMED, SURE
from aiayn_conformance.spec.config import TINY, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
STYLES = ROOT / "tests" / "fixtures" / "scaffold_styles"
PACKAGE = "tests.fixtures.scaffold_styles"
NOTEBOOK = STYLES / "tutorial_notebook.ipynb"


# -- the synonym table: each family, every name ---------------------------------------------------------------
# A config whose fields all differ, so a name read as the wrong field shows.
DISTINCT = ModelConfig(src_vocab=41, tgt_vocab=43, d_model=32, n_heads=4, d_ff=48, n_layers=3, dropout=0.125,
                       max_len=29, pad_id=0, share_embeddings=False)
FAMILIES = {"vocab sizes (source)": "config.src_vocab", "vocab sizes (target)": "config.tgt_vocab",
            "d_model": "config.d_model", "d_ff": "config.d_ff", "h": "config.n_heads", "N": "config.n_layers",
            "max length": "config.max_len", "dropout": "config.dropout", "pad idx": "config.pad_id"}


def taking(name: str) -> type:
    """An nn.Module class whose constructor takes one required parameter called ``name`` and keeps it."""
    namespace: dict = {}
    exec(f"def __init__(self, {name}):\n    nn.Module.__init__(self)\n    self.got = {name}\n", {"nn": nn}, namespace)
    return type("Model", (nn.Module,), {"__init__": namespace["__init__"], "forward": lambda self, s, t: s})


def family_names(expr: str) -> list[str]:
    return list(SURE[expr]) + [n for n, (e, _) in ASSUMED.items() if e == expr]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_synonym_of_a_family_reads_its_field(family):
    expr = FAMILIES[family]
    names = family_names(expr)
    assert len(names) >= 3, f"{family}: too few synonyms to be a table gathered from code"
    wrong = {}
    for name in names:
        model, ctor = build_with_config(taking(name), DISTINCT)
        want = getattr(DISTINCT, expr.split(".", 1)[1])
        if model.got != want or type(model.got) is not type(want):
            wrong[name] = model.got
        (_, _, note), = ctor.args
        assert bool(note) == (name in ASSUMED), f"{name}: an ambiguous name is marked, a sure one is not ({note!r})"
    assert not wrong, f"{family}: these names passed another value than config.{expr}: {wrong}"


def test_the_tutorial_names_of_the_issue_are_in_the_table():
    tutorial = {"input_dim": "config.src_vocab", "output_dim": "config.tgt_vocab", "hid_dim": "config.d_model",
                "pf_dim": "config.d_ff", "max_length": "config.max_len", "max_len": "config.max_len",
                "src_vocab_size": "config.src_vocab", "trg_vocab": "config.tgt_vocab", "tgt_vocab": "config.tgt_vocab",
                "heads": "config.n_heads", "n_heads": "config.n_heads", "num_heads": "config.n_heads",
                "N": "config.n_layers", "n_layers": "config.n_layers", "num_layers": "config.n_layers",
                "d_inner": "config.d_ff", "d_word_vec": "config.d_model", "emb_dim": "config.d_model",
                "ffn_dim": "config.d_ff", "dim_feedforward": "config.d_ff", "nhead": "config.n_heads",
                "dropout": "config.dropout", "drop_prob": "config.dropout", "p": "config.dropout"}
    found = {n: next((e for e, names in SURE.items() if n in names), ASSUMED.get(n, ("",))[0]) for n in tutorial}
    assert found == tutorial


def test_an_ambiguous_name_is_passed_with_what_was_assumed():
    text = render(scaffold(f"{PACKAGE}.library_config:DataclassTransformer"))
    assert "hidden_dim=config.d_ff,  # CHECK: hidden_dim read as the feed-forward network's inner width" in text
    assert "dim=config.d_model,  # CHECK: dim read as d_model" in text


def test_a_name_that_could_be_either_vocabulary_takes_the_side_left_free():
    """Marian's config has vocab_size and decoder_vocab_size: the first is the source's, said so."""
    text = render(scaffold(f"{PACKAGE}.library_config:LibraryTransformer"))
    assert "vocab_size=config.src_vocab,  # CHECK: vocab_size read as the source vocabulary (decoder_vocab_size " \
           "is the target's)" in text
    assert "decoder_vocab_size=config.tgt_vocab,\n" in text


# -- constructors: sub-modules, factories, library configs ------------------------------------------------------
def test_a_constructor_that_takes_built_sub_modules():
    target = f"{PACKAGE}.tutorial_seq2seq:Seq2Seq"
    text = render(scaffold(target))
    assert f"from {PACKAGE}.tutorial_seq2seq import Seq2Seq, Encoder, Decoder\n" in text
    assert re.search(r"encoder=Encoder\(\n\s+input_dim=config\.src_vocab,  # CHECK: input_dim read as the source "
                     r"vocabulary", text)
    assert re.search(r"decoder=Decoder\(\n\s+output_dim=config\.tgt_vocab,  # CHECK: output_dim read as the target "
                     r"vocabulary", text)
    for line in ("pf_dim=config.d_ff,", "n_heads=config.n_heads,", "max_length=config.max_len,",
                 "src_pad_idx=config.pad_id,", "trg_pad_idx=config.pad_id,", 'device="cpu",'):
        assert line + "\n" in text, line
    reproduces_the_reference(target)


def test_a_sub_module_is_found_by_its_annotation_before_its_name():
    namespace: dict = {"nn": nn}
    exec("class Coder(nn.Module):\n    def __init__(self, d_model):\n        super().__init__()\n"
         "        self.lin = nn.Linear(d_model, d_model)\n"
         "class Encoder(nn.Module):\n    def __init__(self, d_model, extra):\n        super().__init__()\n"
         "class Model(nn.Module):\n    def __init__(self, encoder: Coder, pad_idx):\n        super().__init__()\n"
         "        self.encoder = encoder\n", namespace)
    module = types.ModuleType("annotated_parts")
    module.__dict__.update(namespace)
    sys.modules["annotated_parts"] = module
    try:
        for cls in ("Coder", "Encoder", "Model"):
            namespace[cls].__module__ = "annotated_parts"
        model, ctor = build_with_config(namespace["Model"], TINY)
    finally:
        del sys.modules["annotated_parts"]
    assert type(model.encoder).__name__ == "Coder" and ctor.shown() == \
        "Model(encoder=Coder(d_model=config.d_model), pad_idx=config.pad_id)"


def test_a_layer_argument_takes_the_layer_class_of_its_owner():
    """The Annotated Transformer's ``Decoder(layer, N)``: ``layer`` is a DecoderLayer, not the first *Layer class."""
    namespace: dict = {"nn": nn}
    exec("class EncoderLayer(nn.Module):\n    def __init__(self, size, h):\n        super().__init__()\n"
         "class DecoderLayer(nn.Module):\n    def __init__(self, size, h):\n        super().__init__()\n"
         "class Decoder(nn.Module):\n    def __init__(self, layer, N):\n        super().__init__()\n"
         "        self.layer = layer\n", namespace)
    module = types.ModuleType("annotated_layers")
    module.__dict__.update(namespace)
    sys.modules["annotated_layers"] = module
    try:
        for cls in ("EncoderLayer", "DecoderLayer", "Decoder"):
            namespace[cls].__module__ = "annotated_layers"
        model, ctor = build_with_config(namespace["Decoder"], TINY)
    finally:
        del sys.modules["annotated_layers"]
    assert type(model.layer).__name__ == "DecoderLayer"
    assert ctor.args[0][2] == "layer built as a DecoderLayer, the class its name suggests (others: EncoderLayer)"


def test_a_factory_function():
    target = f"{PACKAGE}.factory_model:make_model"
    text = render(scaffold(target))
    assert "self.model = make_model(\n" in text and f"from {PACKAGE}.factory_model import make_model\n" in text
    for line in ("src_vocab=config.src_vocab,", "tgt_vocab=config.tgt_vocab,", "N=config.n_layers,",
                 "d_model=config.d_model,", "d_ff=config.d_ff,", "dropout=config.dropout,",
                 "tie_embeddings=config.share_embeddings,"):
        assert line + "\n" in text, line
    assert "h=config.n_heads,  # CHECK: h read as the number of heads" in text


@pytest.mark.parametrize("cls", ["LibraryTransformer", "DataclassTransformer"])
def test_a_constructor_that_takes_a_library_config_object(cls):
    target = f"{PACKAGE}.library_config:{cls}"
    text = render(scaffold(target))
    config_class = {"LibraryTransformer": "LibraryConfig", "DataclassTransformer": "TransformerArgs"}[cls]
    assert re.search(rf"self\.model = {cls}\(\n\s+\w+={config_class}\(  # CHECK: a {config_class} filled from "
                     r"ModelConfig's fields", text)
    reproduces_the_reference(target)


def constructor_call(target: str, name: str) -> str:
    """The constructor call the scaffold's plugin for ``target`` writes (``self.model = NAME(...)``)."""
    text = render(scaffold(target))
    return text[text.index(f"self.model = {name}("):text.index("def forward")]


def test_a_constructor_that_reads_attributes_of_a_namespace():
    """``Model(args)`` reading ``args.encoder_embed_dim``: exactly the attributes it read, from their fields."""
    target = f"{PACKAGE}.library_config:ArgsTransformer"
    call = constructor_call(target, "ArgsTransformer")
    assert re.findall(r"(\w+)=config\.(\w+)", call) == [
        ("src_vocab_size", "src_vocab"), ("tgt_vocab_size", "tgt_vocab"), ("encoder_embed_dim", "d_model"),
        ("encoder_layers", "n_layers"), ("encoder_attention_heads", "n_heads"), ("encoder_ffn_embed_dim", "d_ff"),
        ("dropout", "dropout"), ("max_source_positions", "max_len"), ("pad", "pad_id")]
    assert "ConfigNamespace(  # CHECK: the attributes the constructor read" in call
    reproduces_the_reference(target)


def test_a_factory_taking_an_options_object_and_the_vocabularies():
    """``get_model(opt, src_vocab, trg_vocab)`` (SamLynnEvans'): ``opt`` gets exactly the attributes the factory read,
    each from its field, ``opt.load_weights`` (no field) None with a CHECK, and the vocabularies their fields. The
    plugin computes what the keyword factory's plugin computes on the same canonical weights."""
    from aiayn_conformance.conformance.helpers.transplant import visible_state

    target = f"{PACKAGE}.options_factory:get_model"
    call = constructor_call(target, "get_model")
    assert re.findall(r"(\w+)=(config\.\w+|None)", call) == [
        ("d_model", "config.d_model"), ("heads", "config.n_heads"), ("n_layers", "config.n_layers"),
        ("d_ff", "config.d_ff"), ("dropout", "config.dropout"), ("load_weights", "None"),
        ("src_vocab", "config.src_vocab"), ("trg_vocab", "config.tgt_vocab")]
    assert "opt=ConfigNamespace(  # CHECK: the attributes the constructor read" in call
    assert "load_weights=None,  # CHECK: load_weights is no ModelConfig field" in call
    config = TINY.replace(dropout=0.0)
    state = visible_state(config, seed=6)
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    tgt = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    outputs = []
    for each in (target, f"{PACKAGE}.factory_model:make_model"):
        adapter = plugin_module(each).Adapter(config).eval()
        adapter.load_reference_state(state)
        with torch.no_grad():
            outputs.append(adapter(src, tgt))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_a_hugging_face_model_is_built_from_its_own_config():
    pytest.importorskip("transformers")
    text = render(scaffold("transformers:MarianMTModel"))
    assert re.search(r"self\.model = MarianMTModel\(\n\s+config=MarianConfig\(", text)
    for line in ("d_model=config.d_model,", "encoder_layers=config.n_layers,", "decoder_attention_heads="
                 "config.n_heads,", "encoder_ffn_dim=config.d_ff,", "decoder_vocab_size=config.tgt_vocab,",
                 "pad_token_id=config.pad_id,"):
        assert line + "\n" in text, line
    assert re.search(r"from transformers[\w.]* import .*\bMarianConfig\b", text)


# -- notebooks ------------------------------------------------------------------------------------------------
def test_a_notebook_keeps_its_model_cells_and_lists_the_rest(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # not installed, as in the tutorial's fresh environment
    path = tmp_path / "plugin.py"
    assert main(["scaffold", f"{NOTEBOOK}:Transformer", "-o", str(path)]) == 0
    err = capsys.readouterr().err
    text = path.read_text()
    left_out = {"cell 2 `!pip install": "a shell command or magic", "cell 3 `%matplotlib inline`": "magic",
                "cell 4 `import spacy`": "cannot import", "cell 5 `spacy_de = spacy.load": "downloads or reads data",
                "cell 11 `INPUT_DIM = len(SRC.vocab)`": "uses what a statement left out defines",
                "cell 14 `for epoch in range(N_EPOCHS):`": "trains"}
    for cell, why in left_out.items():
        assert re.search(rf"aiayn scaffold: {re.escape(cell)}.*{why}", err), (cell, err)
        assert re.search(rf"#   {re.escape(cell)}.*{why}", text), cell
    assert not re.search(r"cell (7|8|9|10) ", err), "a cell that only defines the model was left out"
    assert "_notebook = load_notebook(" in text and "Transformer = _notebook.Transformer" in text
    reproduced = plugin_module(f"{NOTEBOOK}:Transformer").Adapter(TINY)
    assert sum(p.numel() for p in reproduced.parameters()) > 0


def notebook_with(tmp_path: Path, old: str, new: str) -> Path:
    nb = json.loads(NOTEBOOK.read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if old in src:
            cell["source"] = src.replace(old, new, 1).splitlines(True)
            break
    else:
        raise AssertionError(f"{old!r} is in no cell")
    path = tmp_path / "typo.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("old, new, message", [
    ("class Encoder(nn.Module):", "class Encoder(nn.Modul):",
     r"notebook typo\.ipynb: cell 9 \(`class Encoder\(nn\.Modul\):`\) raised AttributeError: module 'torch\.nn' "
     r"has no attribute 'Modul' \(accepted: a \.ipynb notebook"),
    ("BATCH_SIZE = 128", "BATCH_SIZE = 128)", r"notebook typo\.ipynb: cell 6 does not parse: SyntaxError: "),
    ("self.norm1 = nn.LayerNorm(embed_size)", "self.norm1 = nn.LayerNorm(embed_sise)",
     r"cannot build Transformer with a ModelConfig: tried Transformer\(.*NameError: name 'embed_sise'"),
])
def test_a_notebook_that_does_not_run_is_one_line_naming_the_cell(tmp_path, capsys, old, new, message):
    path = notebook_with(tmp_path, old, new)
    assert main(["scaffold", f"{path}:Transformer"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"aiayn scaffold: " + message, err), err


# -- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target, message", [
    (f"{PACKAGE}.factory_model:make_modle", rf"aiayn scaffold: module '{PACKAGE}.factory_model' has no 'make_modle'; "
                                            r"its nn\.Module classes: .* \(accepted: MODULE:NAME, where MODULE is"),
    ("aiayn_conformance.reference.model:sinusoid_table", r"aiayn scaffold: aiayn_conformance\.reference\.model:"
     r"sinusoid_table is a function, not a torch\.nn\.Module class, and no call of it as a factory returned a module"),
    ("no/such/notebook.ipynb:Model", r"aiayn scaffold: cannot read notebook no/such/notebook\.ipynb: no such file "
                                     r"\(accepted: a \.ipynb notebook"),
])
def test_bad_input_is_one_line_and_exit_2(target, message, capsys):
    assert main(["scaffold", target]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(message, err), err


def test_a_class_that_cannot_be_built_points_to_the_factory_beside_it(capsys):
    """The Annotated Transformer's EncoderDecoder takes built embeddings no class names; make_model builds it."""
    assert main(["scaffold", f"{PACKAGE}.factory_model:EncoderDecoder"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no ModelConfig field matches the required parameter 'src_embed'" in err
    assert err.rstrip().endswith("(a factory function is accepted as NAME too: make_model)"), err


def test_a_file_that_is_not_a_notebook(tmp_path, capsys):
    path = tmp_path / "broken.ipynb"
    path.write_text("{not json")
    assert main(["scaffold", f"{path}:Model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiayn scaffold: cannot read notebook broken.ipynb: "
                                                   "JSONDecodeError"), err


# -- the audit finds what was planted, and nothing else -------------------------------------------------------
# fixture target -> (implementation name, the clauses its planted departures fail)
PLANTED = {
    f"{PACKAGE}.tutorial_seq2seq:Seq2Seq": ("tutorial-seq2seq", {"embedding.shared-weights"}),
    f"{PACKAGE}.factory_model:make_model": ("factory-make-model", {"ffn.formula", "model.reference-equivalence"}),
    f"{NOTEBOOK}:Transformer": ("notebook-transformer",
                                {"attention.scale", "embedding.scale", "model.reference-equivalence"}),
}
# The planted clauses, and the clauses a wrong mapping or a wrong constructor call would fail.
CLAUSES = ["model.shape", "model.reference-equivalence", "attention.scale", "embedding.scale",
           "embedding.shared-weights", "ffn.formula", "norm.post-norm"]


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> dict[str, dict[str, set[str]]]:
    """The plugins written by the CLI, audited in one run: implementation -> clause -> outcomes."""
    tmp = tmp_path_factory.mktemp("scaffold_styles")
    plugins = []
    for target, (name, _) in PLANTED.items():
        path = tmp / f"{name}.py"
        assert main(["scaffold", target, "--name", name, "-o", str(path)]) == 0
        plugins.append(f"--plugin={path}")
    out = tmp / "results.json"
    run = subprocess.run([sys.executable, "-m", "pytest", "conformance/", *plugins,
                          f"--impl={','.join(n for n, _ in PLANTED.values())}", f"--clause={','.join(CLAUSES)}",
                          "--hypothesis-profile=smoke", f"--results-json={out}", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-2000:]
    table: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for rec in json.loads(out.read_text())["tests"]:
        table[rec["subject"].split(":", 1)[1]][rec["clause"]].add(rec["outcome"])
    return table


@pytest.mark.parametrize("target", list(PLANTED))
def test_the_audit_finds_the_planted_departures_and_nothing_else(audited, target):
    name, planted = PLANTED[target]
    per_clause = audited.get(name)
    assert per_clause, f"{name}: no results (was the plugin registered?)"
    failing = {c for c, outcomes in per_clause.items() if outcomes & {"failed", "error"}}
    assert failing == planted, f"{name}: failing {sorted(failing)}, planted {sorted(planted)}"
    unjudged = [c for c in CLAUSES if c not in planted and "passed" not in per_clause.get(c, set())]
    assert not unjudged, f"{name}: clauses that never passed (so 'nothing else' is not shown): {unjudged}"


MODEL_CELL = ("import torch\nfrom torch import nn\n\n\nclass Tiny(nn.Module):\n"
              "    def __init__(self, vocab_size, d_model):\n        super().__init__()\n"
              "        self.emb = nn.Embedding(vocab_size, d_model)\n\n"
              "    def forward(self, src, tgt):\n        return self.emb(tgt)\n")


@pytest.mark.parametrize("cell, why", [
    ("model = Tiny(10, 4)\nmodel.fit(data)", "trains"),
    ("for epoch in range(3):\n    pass", "trains"),
    ("opt = torch.optim.SGD(Tiny(10, 4).parameters(), lr=0.1)\nloss = Tiny(10, 4)(None, torch.tensor([1])).sum()\n"
     "loss.backward()\nopt.step()", "trains"),
    ("import urllib.request\nurllib.request.urlretrieve('https://example.org/data.zip', 'data.zip')",
     "downloads or reads data"),
    ("from datasets import load_dataset\nraw = load_dataset('wmt14', 'de-en')",
     "cannot import|downloads or reads data"),
    ("train_iter = torchtext.datasets.Multi30k(split='train')", "downloads or reads data"),
    ("%%bash\nwget https://example.org/data.zip", "a cell magic"),
    ("!nvidia-smi\nx = 1", "a shell command or magic"),
])
def test_a_notebook_cell_that_trains_downloads_or_runs_the_shell_is_left_out(tmp_path, cell, why):
    from aiayn_conformance.scaffold.notebook import notebook_module
    nb = {"cells": [{"cell_type": "code", "source": MODEL_CELL}, {"cell_type": "code", "source": cell}],
          "nbformat": 4, "nbformat_minor": 5, "metadata": {}}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    module, notes = notebook_module(path)
    assert module.Tiny.__name__ == "Tiny" and notes and all(n.startswith("cell 2 ") for n in notes), notes
    assert re.search(why, " ".join(notes)), notes


def test_a_dotted_module_in_the_directory_aiayn_runs_in_is_found_and_the_plugin_says_where(tmp_path, monkeypatch):
    """The ``aiayn`` script, unlike ``python -m``, does not search the current directory: the scaffold does, for a
    module found only there, and the plugin puts that folder on sys.path with a CHECK."""
    package = tmp_path / "checkout_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text((ROOT / "tests/fixtures/scaffold_styles/factory_model.py").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "checkout_pkg", raising=False)
    monkeypatch.delitem(sys.modules, "checkout_pkg.model", raising=False)
    out = tmp_path / "plugin.py"
    assert main(["scaffold", "checkout_pkg.model:make_model", "--name", "checkout", "-o", str(out)]) == 0
    text = out.read_text()
    assert f"sys.path.insert(0, {str(tmp_path)!r})  # CHECK: the folder checkout_pkg.model imports from" in text
    assert "from checkout_pkg.model import make_model" in text
    compile(text, str(out), "exec")


def test_a_forward_that_flattens_its_scores_is_probed_and_viewed_back_as_b_t_v():
    """A forward returning (B * T, V) for a loss (gordicaleksa's) no longer defeats the mask probe: the probe views
    the scores as (B, T, V), finds the model's 4-D boolean masks, and the plugin's forward views them back, with a
    CHECK on the order. The adapter returns exactly what the same model returns unflattened."""
    from tests.fixtures.scaffold_styles.factory_model import EncoderDecoder

    target = f"{PACKAGE}.flat_output:make_flat_model"
    text = render(scaffold(target, "flat"))
    assert "return self.model(src, tgt, src_mask, tgt_mask).view(src.size(0), tgt.size(1), -1)  # CHECK:" in text
    assert "masks found by probing the forward: source 4-D, boolean, True = may attend" in text
    assert "got [10, 37] (the scores flattened to (B * T, V), viewed here as (B, T, V)" in text
    adapter = plugin_module(target, "flat").Adapter(TINY.replace(dropout=0.0)).eval()
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    tgt = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    with torch.no_grad():
        flat = adapter(src, tgt)
        adapter.model.__class__ = EncoderDecoder  # the same model and weights, its scores not flattened
        plain = adapter(src, tgt)
    assert flat.shape == (2, 4, TINY.tgt_vocab)
    torch.testing.assert_close(flat, plain, rtol=0, atol=0)


def test_a_file_importing_from_its_checkouts_root_is_imported_and_the_plugin_says_where(tmp_path, monkeypatch):
    """gordicaleksa's layout: models/definitions/transformer_model.py imports ``utils.constants``, a package at the
    checkout's root. The scaffold finds it in the file's nearest ancestor that holds it; the plugin puts that folder
    on sys.path with a CHECK and imports as written, with no PYTHONPATH."""
    checkout = tmp_path / "checkout"
    (checkout / "utils").mkdir(parents=True)
    (checkout / "utils" / "__init__.py").write_text("")
    (checkout / "utils" / "constants.py").write_text("SCALE = 1.0\n")
    definitions = checkout / "models" / "definitions"
    definitions.mkdir(parents=True)
    model = (ROOT / "tests/fixtures/scaffold_styles/factory_model.py").read_text()
    importer = "\nfrom utils.constants import SCALE  # noqa: E402,F401\n"  # after the file's __future__ import
    (definitions / "root_import_model.py").write_text(model + importer)
    elsewhere = tmp_path / "elsewhere"  # aiayn runs outside the checkout: only the ancestor search finds utils
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(checkout))])
    for name in ("utils", "utils.constants"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    out = tmp_path / "plugin.py"
    target = f"{definitions / 'root_import_model.py'}:make_model"
    assert main(["scaffold", target, "--name", "rooted", "-o", str(out)]) == 0
    text = out.read_text()
    assert (f"sys.path.insert(0, {str(checkout)!r})  # CHECK: where root_import_model.py imports utils from"
            in text)
    probe = "import importlib.util, sys\n" \
            f"spec = importlib.util.spec_from_file_location('rooted_plugin', {str(out)!r})\n" \
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n" \
            "print(module.make_model.__name__)"
    res = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "make_model", res.stderr[-1500:]


def test_a_file_whose_import_is_found_nowhere_says_so_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "lonely.py"
    path.write_text("import no_such_package_anywhere\n")
    monkeypatch.chdir(tmp_path)
    from aiayn_conformance.scaffold import ScaffoldError
    from aiayn_conformance.scaffold.target import load_target
    with pytest.raises(ScaffoldError, match=r"cannot import .*lonely.py: .*no_such_package_anywhere.*not found "
                                            r"beside the file or in a folder above it; put the folder that holds "
                                            r"it on PYTHONPATH"):
        load_target(f"{path}:Model")


@pytest.mark.parametrize("name, field", [("model_dimension", "config.d_model"), ("number_of_heads", "config.n_heads"),
                                         ("number_of_layers", "config.n_layers"),
                                         ("dropout_probability", "config.dropout")])
def test_gordicaleksas_argument_names_are_read(name, field):
    from aiayn_conformance.scaffold.synonyms import meaning
    assert meaning(name) == (field, "")


@pytest.mark.parametrize("factory, shape", [("make_rows_model", [5000, 32]), ("make_batch_first_model", [1, 5000, 32]),
                                            ("make_seq_first_model", [5000, 1, 32])])
def test_a_sinusoid_buffer_is_found_in_each_layout(factory, shape):
    """[max_len, d], [1, max_len, d] (JoeyNMT) and [max_len, 1, d] (OpenNMT-py): positional_encoding returns the
    table as (length, d_model), unmarked: the value probe compared it with the sinusoid."""
    from aiayn_conformance.reference.model import sinusoid_table

    target = f"{PACKAGE}.pe_layouts:{factory}"
    text = render(scaffold(target))
    assert "        table = _attribute(self.model, 'src_embed.pe')\n" in text, text[text.find("def positional"):][:300]
    adapter = plugin_module(target).Adapter(TINY)
    assert list(adapter.model.src_embed.pe.shape) == shape
    torch.testing.assert_close(adapter.positional_encoding(9), sinusoid_table(9, TINY.d_model))

"""Components: audited alone, and composed into the reference as a whole model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from registered import builtin_module

from aiayn_conformance.implementations import Registry, UnknownComponentError, UnknownImplementationError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
INVERTED = str(FIXTURES / "inverted_kernel.py")
GOOD = str(FIXTURES / "good_kernel.py")
VALUE_SCALED = str(FIXTURES / "value_scaled_kernel.py")


def pytest_run(*args, timeout=600):
    cmd = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider", "-rfE", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def registry(*extra):
    return Registry(extra, builtins=(builtin_module("reference"), builtin_module("components")),
                    entry_points=False, env={}).load()


def test_builtin_components_are_registered():
    comps = {f"{c.kind}:{c.name}" for c in registry().components.values()}
    assert {"attention:reference", "attention:sdpa-math", "attention:sdpa-flash", "positional_encoding:reference",
            "layer_norm:torch-layernorm", "feed_forward:reference", "length_penalty:reference",
            "length_penalty:length-power", "length_penalty:none", "search:reference", "optimizer:reference",
            "optimizer:torch-adam-defaults", "lr_schedule:reference", "lr_schedule:hf-inverse-sqrt",
            "lr_schedule:annotated-rate", "criterion:reference", "criterion:torch-cross-entropy-ls",
            "criterion:torch-cross-entropy-ls-no-ignore", "criterion:torch-cross-entropy"} <= comps


def test_component_selection():
    reg = registry(GOOD)
    assert {c.kind for c in reg.select_components("reference")} == {"attention", "positional_encoding",
                                                                    "layer_norm", "feed_forward",
                                                                    "length_penalty", "search", "optimizer",
                                                                    "lr_schedule", "criterion"}
    assert [c.name for c in reg.select_components("attention:good-kernel")] == ["good-kernel"]
    assert all(c.kind == "attention" for c in reg.select_components("attention:all"))
    with pytest.raises(UnknownComponentError, match="unknown component 'attention:nope'; known:"):
        reg.select_components("attention:nope")


def test_composition_is_resolved_by_name_and_inherits_deviations():
    reg = registry()
    impl = reg.get("reference+feed_forward=gelu")
    assert "ffn.formula" in impl.deviations and impl.output == "logits"
    assert reg.get("reference+feed_forward=gelu") is impl
    assert "reference+feed_forward=gelu" not in [i.name for i in reg.select("all")]


def test_a_composed_search_and_length_penalty_run_in_generate():
    """reference+search=X+length_penalty=Y: the model's generate (beam_size > 1) calls X with Y's function;
    greedy decoding (beam_size 1) stays the reference's."""
    import torch

    from aiayn_conformance.implementations import Component, validated
    from aiayn_conformance.implementations.composition import compose, parse_composition
    from aiayn_conformance.reference.decoding import beam_search
    from aiayn_conformance.spec.config import TINY

    calls = []

    def spy_search(decoder, src, **kw):
        calls.append(kw)
        return beam_search(decoder, src, **kw)

    def halved(length, alpha):
        return length.float() / 2

    name = "reference+search=spy+length_penalty=halved"
    assert parse_composition(name) == [("search", "spy"), ("length_penalty", "halved")]
    impl = compose(name, [validated(Component("search", "spy", lambda: spy_search)),
                          validated(Component("length_penalty", "halved", lambda: halved,
                                              deviations={"decode.beam": "divides by |Y| / 2"}))])
    assert dict(impl.deviations) == {"decode.beam": "length_penalty component 'halved': divides by |Y| / 2"}
    torch.manual_seed(0)
    model = impl.build(TINY).eval()
    src = torch.tensor([[5, 6, 7], [8, 9, 0]])
    out = model.generate(src, bos_id=1, eos_id=2, beam_size=3, alpha=0.6, max_len=4)
    assert out.shape[0] == 2 and len(calls) == 1
    assert calls[0]["beam_size"] == 3 and calls[0]["length_penalty"] is halved and calls[0]["max_len"] == 4
    model.generate(src, bos_id=1, eos_id=2, beam_size=1, alpha=0.6, max_len=4)
    assert len(calls) == 1  # greedy search is not the component's


def test_composed_training_components_make_the_models_recipe():
    """reference+optimizer=X+lr_schedule=Y+criterion=Z: the model's recipe capabilities call the components'
    factories (optimizer: (params, train_config); lr_schedule: (optimizer, d_model, train_config); criterion:
    (vocab, pad_id, train_config)), and the composition inherits their declared deviations."""
    import torch

    from aiayn_conformance.spec.config import TINY
    from aiayn_conformance.spec.training import TrainConfig

    name = "reference+optimizer=torch-adam-defaults+lr_schedule=annotated-rate+criterion=torch-cross-entropy-ls"
    impl = registry().get(name)
    assert set(impl.deviations) == {"train.optimizer", "train.lr-schedule"}
    model = impl.build(TINY)
    optimizer = model.make_optimizer(model.parameters(), TrainConfig())
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    scheduler = model.make_scheduler(optimizer, TrainConfig())
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(TINY.d_model ** -0.5 * 4000 ** -1.5)  # step 0 -> 1
    criterion = model.make_criterion(TrainConfig())
    assert isinstance(criterion, torch.nn.CrossEntropyLoss)
    assert (criterion.label_smoothing, criterion.ignore_index) == (0.1, TINY.pad_id)
    plain = registry().get("reference").build(TINY)  # the paper's recipe, uncomposed
    assert plain.make_optimizer(plain.parameters(), TrainConfig()).param_groups[0]["betas"] == (0.9, 0.98)


@pytest.mark.parametrize("name, error, message", [
    ("reference+attn=sdpa", UnknownImplementationError, "kind 'attn' is not one of"),
    ("reference+attention", UnknownImplementationError, "is not KIND=NAME"),
    ("torch-nn+attention=sdpa", UnknownImplementationError, "compositions start from 'reference'"),
    ("reference+attention=sdpa+attention=sdpa-math", UnknownImplementationError, "names a kind twice"),
    ("reference+attention=nope", UnknownComponentError, "unknown attention component 'nope'"),
])
def test_bad_composition_names(name, error, message):
    with pytest.raises(error, match=message):
        registry().get(name)


def test_list_shows_components():
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "list", "--json", "--plugin", GOOD], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    comps = {(c["kind"], c["name"]) for c in json.loads(res.stdout)["components"]}
    assert ("attention", "good-kernel") in comps and ("layer_norm", "reference") in comps


def test_builtin_components_pass_or_fail_only_as_declared():
    res = pytest_run("--component=all")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "xfailed" in res.stdout  # the declared t2t / GELU deviations were observed


def test_inverted_polarity_kernel_is_caught_naming_the_polarity():
    res = pytest_run(f"--plugin={INVERTED}", "--component=attention:inverted-kernel")
    assert res.returncode == 1, res.stdout[-3000:]
    assert "mask polarity inverted" in res.stdout
    assert "FAILED conformance/test_mask.py::test_kernel_key_padding_mask_semantics_and_polarity" in res.stdout


def test_a_kernel_scaled_by_the_value_size_fails_attention_scale_only_where_d_v_is_not_d_k():
    res = pytest_run(f"--plugin={VALUE_SCALED}", "--component=attention:value-scaled-kernel")
    assert res.returncode == 1, res.stdout[-3000:]
    # the node id only: pytest appends " - <message>" to the summary line when the terminal is wide enough
    failed = [line.split(" - ")[0] for line in res.stdout.splitlines() if line.startswith("FAILED")]
    assert failed == ["FAILED conformance/test_attention.py::test_kernel_scale_is_one_over_sqrt_dk"
                      "[value-scaled-kernel-d_v!=d_k]"], res.stdout[-3000:]
    assert "1/sqrt(d_v)" in res.stdout


@pytest.mark.slow
def test_correct_kernel_passes_alone_and_composed_into_the_reference():
    alone = pytest_run(f"--plugin={GOOD}", "--component=attention:good-kernel")
    assert alone.returncode == 0, alone.stdout[-3000:]
    composed = pytest_run(f"--plugin={GOOD}", "--impl=reference+attention=good-kernel",
                          "--ignore=conformance/test_export.py")
    assert composed.returncode == 0, composed.stdout[-3000:]
    assert " passed" in composed.stdout and "failed" not in composed.stdout


@pytest.mark.slow
def test_inverted_kernel_composed_fails_the_model_level_padding_clause():
    res = pytest_run(f"--plugin={INVERTED}", "--impl=reference+attention=inverted-kernel",
                     "--ignore=conformance/test_export.py", "-x")
    assert res.returncode == 1, res.stdout[-3000:]

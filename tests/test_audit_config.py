"""``--config`` and ``--weights``: audits at the user's sizes and on the user's trained weights.

The reading of each form and each refusal is tested in process; a few short suite runs (``--clause``) show the
options at work: a model built only at its own sizes passes model.shape once audited at them, the user's weights
reach the checks (NaN weights make one error), and checks that need the suite's own weights are skipped.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn_conformance import conformance as conformance_package
from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.settings import AuditSettings
from aiayn_conformance.conformance.helpers.settings import current as current_settings
from aiayn_conformance.conformance.helpers.user_config import ConfigError, read_config
from aiayn_conformance.conformance.helpers.user_weights import (
    UserWeights,
    WeightsError,
    fit_problem,
    read_weights,
    resolve,
)
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import BASE, BIG, TINY, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tests/user_sized_models.py"
USER = ModelConfig(src_vocab=40, tgt_vocab=40, d_model=64, n_heads=4, d_ff=96, n_layers=2, max_len=32)
USER_PAIRS = "src_vocab=40,d_model=64,h=4,d_ff=96,N=2,max_len=32"


# -- --config: the forms ---------------------------------------------------------------------------------------
def test_pairs_set_the_sizes_and_one_vocabulary_sets_both_when_shared():
    assert read_config(USER_PAIRS, TINY) == USER
    assert read_config("d_model=64,h=4,src_vocab=40", TINY).tgt_vocab == 40
    separate = read_config("share_embeddings=false,src_vocab=40,tgt_vocab=50", TINY)
    assert (separate.src_vocab, separate.tgt_vocab, separate.share_embeddings) == (40, 50, False)


def test_a_preset_names_table_3s_sizes_and_pairs_change_them():
    assert read_config("base", TINY) == BASE and read_config("big", TINY) == BIG
    assert read_config("base,N=2,src_vocab=8000", TINY) == BASE.replace(n_layers=2, src_vocab=8000, tgt_vocab=8000)


def test_json_and_toml_files(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"d_model": 64, "h": 4, "src_vocab": 40, "d_ff": 96,
                                                 "n_layers": 2, "max_len": 32}))
    (tmp_path / "c.toml").write_text("d_model = 64\nn_heads = 4\nsrc_vocab = 40\nd_ff = 96\nN = 2\nmax_len = 32\n")
    assert read_config(str(tmp_path / "c.json"), TINY) == USER
    assert read_config(str(tmp_path / "c.toml"), TINY) == USER


MARIAN_LIKE = {"model_type": "marian", "d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
               "encoder_ffn_dim": 96, "decoder_ffn_dim": 96, "encoder_layers": 2, "decoder_layers": 2,
               "vocab_size": 40, "max_position_embeddings": 32, "pad_token_id": 0, "dropout": 0.1,
               "share_encoder_decoder_embeddings": True}


def test_a_hugging_face_config_maps_to_the_audit_configuration(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MARIAN_LIKE))
    assert read_config(str(tmp_path), TINY) == USER  # the model directory
    assert read_config(str(tmp_path / "config.json"), TINY) == USER  # the file: model_type marks it
    (tmp_path / "config.json").write_text(json.dumps(MARIAN_LIKE | {"decoder_layers": 3}))
    with pytest.raises(ConfigError, match="encoder_layers=2 and decoder_layers=3 differ"):
        read_config(str(tmp_path), TINY)


@pytest.mark.parametrize("spec, needle", [
    ("d_modl=64", "unknown key 'd_modl'; accepted keys: src_vocab, tgt_vocab, d_model"),
    ("huge", "huge: no such file or directory, and not key=value pairs; accepted: a preset (base, big, tiny)"),
    ("base,h=7", "d_model (512) must be divisible by n_heads (7)"),
    ("d_model=sixty", "d_model=sixty: not an int"),
    ("share_embeddings=maybe", "not a bool"),
    ("d_model=30", "must be divisible by n_heads"),
    ("h=0", "ModelConfig.n_heads must be positive, got 0"),
    ("max_len=8", "the suite needs max_len >= 12"),
    ("pad_id=1", "the suite needs a pad_id other than 1"),  # the decode witnesses' bos_id
    ("missing.toml", "missing.toml: no such file or directory"),
    ("d_model", "no such file or directory, and not key=value pairs"),
])
def test_bad_configs_are_one_line_naming_what_is_accepted(spec, needle):
    with pytest.raises(ConfigError) as exc:
        read_config(spec, TINY)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_one_head_is_accepted():
    """Table 3's row A audits h = 1 (attention.heads is then not applicable)."""
    assert read_config("h=1", TINY).n_heads == 1


def test_with_one_head_attention_heads_is_not_applicable_and_the_scale_still_judged(tmp_path):
    res, records = suite(tmp_path, "--impl=reference", "--config=h=1", "--clause=attention.heads,attention.scale")
    assert res.returncode == 0, res.stdout[-3000:]
    heads = records["attention.heads"]
    assert heads and all(r["outcome"] == "skipped" and "not applicable: h = 1" in r["detail"] for r in heads), heads
    assert any(r["outcome"] == "passed" for r in records["attention.scale"]), records["attention.scale"]


def test_model_memos_keep_only_their_recent_entries_at_large_sizes():
    """At the base model's sizes a memo of models keeps its most recently used entries only (each holds hundreds of
    megabytes); at TINY nothing is dropped."""
    from aiayn_conformance.conformance.helpers.settings import BOUNDED

    big, tiny = AuditSettings(config=BASE).cache("transplanted"), AuditSettings().cache("transplanted")
    for i in range(5):
        big[i] = tiny[i] = i
        assert big[0] == 0  # used: kept
    assert BOUNDED["transplanted"] == 2 and list(big) == [4, 0] and list(tiny) == [0, 1, 2, 3, 4]
    assert big.get(1) is None and big.get(4) == 4


def test_models_are_released_between_test_files_at_large_sizes():
    """release_models empties the memos that hold models at large sizes, keeps the canonical and initial states,
    and keeps everything at TINY."""
    from aiayn_conformance.conformance.helpers.settings import RELEASED_BETWEEN_FILES

    large, tiny = AuditSettings(config=BASE), AuditSettings()
    for audit in (large, tiny):
        for name in (*RELEASED_BETWEEN_FILES, "visible-states", "initial-states"):
            audit.cache(name)["key"] = name
    assert sorted(large.release_models()) == sorted(RELEASED_BETWEEN_FILES) and tiny.release_models() == []
    assert all(not large.cache(name) for name in RELEASED_BETWEEN_FILES)
    assert large.cache("visible-states") and large.cache("initial-states")
    assert all(tiny.cache(name) for name in RELEASED_BETWEEN_FILES)


def test_a_model_built_on_the_meta_device_is_never_handed_out_again():
    """config.parameters counts the base preset's parameters on the meta device; at an audit of the base model that
    build is the audit configuration's, and it was kept as the pristine copy every later build_model copied (every
    check then ran a meta model: "Tensor on device meta is not on the expected device cpu")."""
    from aiayn_conformance.conformance.helpers.harness import COPIED_ABOVE, build_model, checking
    from aiayn_conformance.conformance.helpers.settings import using
    from aiayn_conformance.implementations import Implementation
    from aiayn_conformance.spec.schema import parameter_count

    cfg = TINY.replace(d_model=128, n_heads=4, d_ff=256, n_layers=1, src_vocab=40_000, tgt_vocab=40_000)  # > 5M
    impl = Implementation(name="reference", build=Transformer, output="logits")
    with using(AuditSettings(config=cfg)), checking("config.parameters"):
        with torch.device("meta"):
            assert any(p.is_meta for p in build_model(impl, cfg).parameters())  # its layers (not its tables)
        model = build_model(impl, cfg)
        assert not any(p.is_meta for p in model.parameters()) and not model.pe.is_meta
        assert parameter_count(cfg) > COPIED_ABOVE  # a model the session keeps a pristine copy of
        kept = build_model(impl, cfg)  # the real build is the one kept and copied
        assert kept is not model and torch.equal(kept.src_embed.weight, model.src_embed.weight)


class ReadsAValueAtInit(Transformer):
    """Builds on the CPU, not on the meta device: its constructor reads a value (``.item()``)."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = float(self.pe[1, 0].item())


def test_shape_checks_build_on_the_meta_device_where_they_can_else_on_the_cpu():
    from aiayn_conformance.conformance.helpers.harness import build_for_shapes, checking
    from aiayn_conformance.conformance.helpers.settings import using
    from aiayn_conformance.implementations import Implementation

    cfg = TINY.replace(share_embeddings=False, tgt_vocab=50)
    with using(AuditSettings()), checking("embedding.shared-weights"):
        meta = build_for_shapes(Implementation(name="reference", build=Transformer, output="logits"), cfg)
        cpu = build_for_shapes(Implementation(name="reads", build=ReadsAValueAtInit, output="logits"), cfg)
    assert meta.encoder[0].self_attn.q.weight.is_meta and meta.generator.weight is not meta.tgt_embed.weight
    assert not any(p.is_meta for p in cpu.parameters()) and cpu.scale == pytest.approx(math.sin(1.0))


def test_canonical_states_are_kept_by_bytes_at_large_sizes():
    """The memo of canonical states keeps as many as BYTES_BOUNDED holds at the audit's size, at least BOUNDED's."""
    from aiayn_conformance.conformance.helpers.settings import BYTES_BOUNDED, memo_bound
    from aiayn_conformance.spec.schema import parameter_count

    budget = BYTES_BOUNDED["visible-states"]
    assert memo_bound("visible-states", BASE) == budget // (4 * parameter_count(BASE)) == 8
    assert memo_bound("visible-states", BIG) == 2 and memo_bound("visible-states", TINY) is None
    states = AuditSettings(config=BASE).cache("visible-states")
    for i in range(9):
        states[i] = i
    assert list(states) == list(range(1, 9))


def test_derived_configurations_follow_the_audit_configuration():
    user, suite = AuditSettings(config=USER), AuditSettings()
    assert user.others["separate-vocabularies"].src_vocab == 44 and user.others["wider"].d_model == 96
    assert user.others["longer"].max_len == 64 and suite.others["wider"].d_model == 48
    assert user.config_change(TINY) and not user.config_change(USER.replace(dropout=0.0))
    assert TINY.d_model == 32  # the preset itself never changes


class SeenByChecks:
    """A pytest plugin recording, at each check's call, the configuration its fixtures gave it and the current
    settings."""

    def __init__(self) -> None:
        self.seen: list[tuple[ModelConfig, AuditSettings]] = []

    def pytest_runtest_call(self, item):
        given = item.funcargs.get("config") or item.funcargs["settings"].config
        self.seen.append((given, current_settings()))


def test_two_sessions_in_one_process_each_audit_at_their_own_sizes(pytester):
    """Settings are passed, not patched: a session at --config sizes, then one at the suite's own, in one process;
    each check sees its session's configuration and memo, and nothing is left behind."""
    suite = Path(conformance_package.__file__).parent
    runs = []
    for extra in ([f"--config={USER_PAIRS}"], []):
        seen = SeenByChecks()
        result = pytester.inline_run(str(suite), "--impl=reference", "--clause=model.shape", "-p", "no:xdist",
                                     "-p", "no:cacheprovider", *extra, plugins=[seen])
        passed, skipped, failed = result.listoutcomes()
        assert passed and not failed, failed
        runs.append(seen.seen)
    (user_run, suite_run) = runs
    assert {cfg for cfg, _ in user_run} == {USER} and {s.config for _, s in user_run} == {USER}
    assert {cfg for cfg, _ in suite_run} == {TINY} and {s.config for _, s in suite_run} == {TINY}
    first, second = user_run[0][1], suite_run[0][1]
    assert first is not second and first.memo is not second.memo  # each session probed its own shape contract
    assert all(key[2] == USER for key in first.cache("shape-contracts"))
    assert all(key[2] == TINY for key in second.cache("shape-contracts"))
    assert current_settings().config == TINY and current_settings().weights is None  # nothing left behind


@pytest.mark.parametrize("argv, needle", [
    (["--impl", "reference", "--config", "d_modl=64"], "--config: unknown key 'd_modl'; accepted keys:"),
    (["--impl", "reference", "--config", "nowhere.json"], "--config: nowhere.json: no such file"),
    (["--weights", "w.pt"], "--weights audits one implementation: give --impl NAME"),
    (["--impl", "reference", "--weights", "nowhere.pt"], "--weights: nowhere.pt: no such file or directory"),
])
def test_audit_refuses_bad_options_with_one_line_and_exit_2(capsys, argv, needle):
    assert main(["audit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


# -- --weights: reading and fitting ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def user_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    return Transformer(USER).state_dict()


def test_weights_are_read_from_state_dicts_safetensors_and_model_directories(tmp_path, user_state):
    torch.save({"model_state_dict": {f"module.{k}": v for k, v in user_state.items()}}, tmp_path / "w.pt")
    read = read_weights(str(tmp_path / "w.pt"))
    assert set(read.state) == set(user_state)  # unwrapped, DataParallel's prefix dropped
    assert read.mismatch(Transformer(USER)) == ""
    safetensors = pytest.importorskip("safetensors.torch")
    untied = {k: v.clone() for k, v in user_state.items()}  # safetensors refuses shared tensors
    safetensors.save_file(untied, str(tmp_path / "w.safetensors"))
    assert read_weights(str(tmp_path / "w.safetensors")).mismatch(Transformer(USER)) == ""
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    safetensors.save_file(untied, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(MARIAN_LIKE))
    config, weights, sizes = resolve(None, str(model_dir), TINY)
    assert config == USER and sizes == "the weights' config.json" and weights is not None


def test_weights_load_into_the_module_an_adapter_wraps(user_state):
    class Adapter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Transformer(USER)

    weights = UserWeights("w.pt", {k: v + 1 for k, v in user_state.items()})
    adapter = Adapter()
    assert weights.mismatch(adapter) == ""
    weights.load_into(adapter)
    assert torch.equal(adapter.inner.src_embed.weight, user_state["src_embed.weight"] + 1)


def test_weights_of_the_wrong_shape_name_the_first_mismatching_key(tmp_path, user_state):
    torch.save(user_state, tmp_path / "w.pt")
    weights = read_weights(str(tmp_path / "w.pt"))
    line = weights.mismatch(Transformer(TINY))
    assert "key 'src_embed.weight' has shape [40, 64], the model's has [37, 32]" in line and "--config" in line
    less = UserWeights("w.pt", {k: v for k, v in user_state.items() if "norm" not in k})
    assert "is not in the weights; every trainable parameter must be given" in less.mismatch(Transformer(USER))
    more = UserWeights("w.pt", {**user_state, "extra.weight": torch.zeros(2)})
    assert "key 'extra.weight' [2] is not in the model" in more.mismatch(Transformer(USER))


def test_a_hugging_face_model_directory_fits_the_library_plugin_at_its_config(tmp_path):
    """hf-marian's model saved with save_pretrained: the sizes come from its config.json, and the weights fit the
    model the plugin builds at them (its sinusoid table, left out of the checkpoint, keeps the model's values)."""
    from aiayn_conformance.implementations import get_registry

    impl = get_registry().get("hf-marian")
    if impl.unavailable:
        pytest.skip(f"hf-marian is unavailable: {impl.unavailable}")
    adapter = impl.build(USER)
    library_model = next(m for m in adapter.modules() if type(m).__name__ == "MarianMTModel")
    library_model.save_pretrained(str(tmp_path))
    config, weights, sizes = resolve(None, str(tmp_path), TINY)
    assert sizes == "the weights' config.json" and config is not None and weights is not None
    assert (config.d_model, config.n_heads, config.d_ff, config.n_layers, config.src_vocab) == (64, 4, 96, 2, 40)
    assert fit_problem([impl], config, weights) == ""
    assert "has shape" in fit_problem([impl], TINY, weights)  # at the suite's own sizes they do not fit


@pytest.mark.parametrize("content, needle", [
    (b"not a checkpoint", "torch.load(weights_only=True) failed"),
])
def test_unreadable_weights_are_one_line(tmp_path, content, needle):
    (tmp_path / "w.pt").write_bytes(content)
    with pytest.raises(WeightsError, match=needle.replace("(", r"\(").replace(")", r"\)")) as exc:
        read_weights(str(tmp_path / "w.pt"))
    assert "\n" not in str(exc.value)
    (tmp_path / "w.ckpt").write_bytes(content)
    with pytest.raises(WeightsError, match="unknown kind of file; accepted: a torch state_dict"):
        read_weights(str(tmp_path / "w.ckpt"))


# -- suite runs ------------------------------------------------------------------------------------------------
def suite(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, list[dict]]]:
    """Run conformance/ with ``args``; (the process, clause -> its records)."""
    out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}.json"
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", f"--results-json={out}", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    records: dict[str, list[dict]] = {}
    if out.exists():
        for rec in json.loads(out.read_text())["tests"]:
            records.setdefault(rec["clause"], []).append(rec)
    return res, records


def test_a_model_at_its_own_sizes_passes_model_shape_audited_at_them(tmp_path):
    args = (f"--plugin={PLUGIN}", "--impl=user-sized", "--clause=model.shape")
    _, at_suite_sizes = suite(tmp_path, *args)
    assert {r["outcome"] for r in at_suite_sizes["model.shape"]} == {"error"}  # it builds only at its own sizes
    res, at_its_sizes = suite(tmp_path, *args, f"--config={USER_PAIRS}")
    outcomes = [r["outcome"] for r in at_its_sizes["model.shape"]]
    assert res.returncode == 0 and "passed" in outcomes and set(outcomes) <= {"passed", "skipped"}, res.stdout[-2000:]
    skipped = [r["message"] for r in at_its_sizes["model.shape"] if r["outcome"] == "skipped"]
    assert all(m.startswith("blocked by config.parameters: user-sized refuses") for m in skipped)  # 44/46 vocabs


def test_the_checks_run_on_the_users_weights(tmp_path, user_state):
    torch.save(user_state, tmp_path / "w.pt")
    broken = dict(user_state)
    broken["encoder.0.self_attn.q.weight"] = torch.full_like(user_state["encoder.0.self_attn.q.weight"], float("nan"))
    torch.save(broken, tmp_path / "nan.pt")
    args = ("--impl=reference", f"--config={USER_PAIRS}", "--clause=model.eval-determinism,train.learns")
    res, runs = suite(tmp_path, *args, f"--weights={tmp_path / 'w.pt'}")
    assert res.returncode == 0, res.stdout[-2000:]
    assert {r["outcome"] for r in runs["model.eval-determinism"]} == {"passed"}
    assert {r["outcome"] for r in runs["train.learns"]} == {"skipped"}
    assert all(r["message"].startswith("needs canonical weights: ") for r in runs["train.learns"])
    _, on_nan = suite(tmp_path, *args, f"--weights={tmp_path / 'nan.pt'}")  # the weights reach the checks
    errors = [r for r in on_nan["model.eval-determinism"] if r["outcome"] == "error"]
    assert errors and "non-finite" in errors[0]["detail"], on_nan


def test_weights_of_the_wrong_shape_stop_the_suite_with_one_line(tmp_path, user_state, capsys):
    torch.save(user_state, tmp_path / "w.pt")
    res, _ = suite(tmp_path, "--impl=reference", f"--weights={tmp_path / 'w.pt'}")  # the suite's own sizes
    assert res.returncode == 4  # pytest's usage error
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "key 'src_embed.weight' has shape [40, 64], the model's has [37, 32]" in line
    assert main(["audit", "--impl", "reference", "--weights", str(tmp_path / "w.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'src_embed.weight' has shape [40, 64]" in err


def test_aiayn_audit_passes_the_options_to_the_suite_with_paths_from_where_it_was_called(tmp_path, user_state):
    torch.save(user_state, tmp_path / "w.pt")
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", "--impl", "reference",
                          f"--config={USER_PAIRS}", "--weights", "w.pt",
                          "--clause", "model.eval-determinism,train.learns", "--format", "json", "--output", str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "audit configuration (sizes from --config): ModelConfig(src_vocab=40" in res.stderr
    clauses = json.loads(out.read_text())["implementations"]["reference"]["clauses"]
    assert clauses["model.eval-determinism"]["status"] == "pass"
    assert clauses["train.learns"]["status"] == "not-judged"
    assert clauses["train.learns"]["message"].startswith("needs canonical weights")


def test_ffn_dropout_is_caught_at_a_large_d_ff(tmp_path):
    """dropout.extra-sites' FFN witness at the user's d_ff: summing all d_ff / d_model inner units into each output
    feature made the levels too close to count at d_ff 2048, and the FFN's inner dropout passed."""
    res, records = suite(tmp_path, f"--plugin={ROOT / 'tests' / 'broken_models.py'}",
                         "--impl=reference,broken-ffn-inner-dropout", "--clause=dropout.extra-sites",
                         "-k", "feed_forward", "--config=d_ff=2048")
    outcome = {r["subject"].split(":", 1)[1]: r["outcome"] for r in records.get("dropout.extra-sites", [])}
    assert outcome == {"reference": "passed", "broken-ffn-inner-dropout": "xfailed"}, (outcome, res.stdout[-2000:])


# -- --weights: a toolkit's own checkpoint, read by its registration ----------------------------------------------
def test_a_toolkits_checkpoint_gives_the_sizes_the_weights_and_the_model(tmp_path, user_state):
    """toy-toolkit (tests/user_sized_models.py) reads its checkpoints: no --config, its build refuses, so every check
    that runs ran on the checkpoint's model, holding the checkpoint's weights (NaN weights make an error)."""
    sizes = dict(src_vocab=40, tgt_vocab=40, d_model=64, n_heads=4, d_ff=96, n_layers=2, max_len=32)
    torch.save({"format": "toy-toolkit", "step": 7, "sizes": sizes, "model": user_state}, tmp_path / "t.ckpt")
    key = "decoder.0.ffn.w1.weight"
    nan = {**user_state, key: torch.full_like(user_state[key], float("nan"))}
    torch.save({"format": "toy-toolkit", "step": 7, "sizes": sizes, "model": nan}, tmp_path / "nan.ckpt")
    args = (f"--plugin={PLUGIN}", "--impl=toy-toolkit", "--clause=model.eval-determinism")
    res, runs = suite(tmp_path, *args, f"--weights={tmp_path / 't.ckpt'}")
    assert res.returncode == 0 and {r["outcome"] for r in runs["model.eval-determinism"]} == {"passed"}, \
        res.stdout[-2000:]
    from aiayn_conformance.implementations import get_registry

    toy = get_registry([str(ROOT / PLUGIN)]).select("toy-toolkit")
    config, weights, where = resolve(None, str(tmp_path / "t.ckpt"), TINY, toy)
    assert (config, where) == (ModelConfig(**sizes), "the checkpoint") and weights is not None
    assert weights.describes == "toy-toolkit checkpoint, step 7" and weights.build is Transformer
    _, on_nan = suite(tmp_path, *args, f"--weights={tmp_path / 'nan.ckpt'}")
    assert "error" in {r["outcome"] for r in on_nan["model.eval-determinism"]}, on_nan


def test_a_checkpoint_of_another_format_is_one_line_naming_what_was_found(tmp_path, user_state, capsys):
    torch.save(user_state, tmp_path / "plain.pt")
    res, _ = suite(tmp_path, f"--plugin={PLUGIN}", "--impl=toy-toolkit", f"--weights={tmp_path / 'plain.pt'}")
    assert res.returncode == 4
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "not a toy-toolkit checkpoint (its 'format' is None); accepted: a file saved by toy-toolkit" in line
    assert main(["audit", f"--plugin={ROOT / PLUGIN}", "--impl", "toy-toolkit", "--weights",
                 str(tmp_path / "plain.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a toy-toolkit checkpoint" in err


USER_PLUGIN = '''
from aiayn_conformance import Implementation, Transformer, hookimpl
{guard}

@hookimpl
def register_implementations(register):
    register(Implementation(name="mine", build=Transformer, output="logits", summary="the reference, as a user's"))
'''


@pytest.mark.parametrize("plugin", ["my_plugin.py", "my_plugin"])
def test_a_plugin_named_from_the_users_folder_is_audited_there(tmp_path, plugin):
    """--plugin, as a relative file path or a module name, resolves against the folder aiayn runs in, not against
    the project's checkout where the suite runs."""
    (tmp_path / "my_plugin.py").write_text(USER_PLUGIN.format(guard=""))
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", "--plugin", plugin, "--impl", "mine",
                          "--clause", "model.shape", "--format", "json", "--output", str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    clauses = json.loads(out.read_text())["implementations"]["mine"]["clauses"]
    assert clauses["model.shape"]["status"] == "pass", clauses


def test_a_suite_run_that_cannot_audit_is_one_line_and_exit_2_not_a_departure_count(tmp_path):
    """A plugin that imports in the command but not in the suite's process: no check ran, so there is no
    finding to count: one line naming the cause, exit status 2, no report."""
    guard = "import os\nif os.environ.get('AIAYN_CALLER_DIR'):  # the suite's process\n" \
            "    raise ImportError('needs a GPU library missing here')"
    (tmp_path / "my_plugin.py").write_text(USER_PLUGIN.format(guard=guard))
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", "--plugin", "my_plugin.py",
                          "--impl", "mine", "--clause", "model.shape", "--format", "json", "--output", str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("aiayn audit: could not audit mine: the suite run ended with exit status"), last
    assert "needs a GPU library missing here" in last, last
    assert "nonconforming" not in res.stderr and not out.exists(), res.stderr[-2000:]


@pytest.mark.parametrize("d", [32, 512, 1024, 4096])
def test_the_unbiased_variance_mark_holds_at_every_width(d):
    """The biased variance of unit-norm outputs is 1 in the paper's norm and (d-1)/d in one that divides by the
    unbiased estimate: 1/d apart, under the old fixed margin of 1e-3 at the big model's d_model of 1024."""
    from aiayn_conformance.conformance.test_norm import unbiased_variance

    eps_effect = 1e-6  # the paper's epsilon lowers a unit variance by about this much
    assert unbiased_variance(torch.full((2, 5), (d - 1) / d * (1 - eps_effect)), d)
    assert not unbiased_variance(torch.full((2, 5), 1 - eps_effect), d)

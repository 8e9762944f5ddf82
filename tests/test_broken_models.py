"""The checks can fail, for the right reason: each broken model is caught by exactly the clauses it breaks.

One run of the whole conformance suite over every model of ``tests/broken_models.py`` (one bug each),
the independently written conforming model of ``tests/independent_model.py`` and the reference. Each
broken model declares the clauses its bug breaks; the per-(model, clause) outcomes read from
``--results-json`` must show every declared clause observed failing and no other clause failing, and the
two conforming models must pass everything they are checked on. The broken decoders of
``tests/broken_decoders.py`` (the reference's forward with one decoding bug) run the decoding checks only;
the broken recipes of ``tests/broken_recipes.py`` (the reference model, one recipe bug each) and the
training components run the ``train`` area only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from aiayn_conformance.conformance.helpers import threads
from aiayn_conformance.implementations import get_registry
from aiayn_conformance.spec import CLAUSES

ROOT = Path(__file__).resolve().parents[1]
BROKEN_PLUGIN = ROOT / "tests" / "broken_models.py"
RECIPES_PLUGIN = ROOT / "tests" / "broken_recipes.py"
INDEPENDENT_PLUGIN = ROOT / "tests" / "independent_model.py"
DECODERS_PLUGIN = ROOT / "tests" / "broken_decoders.py"


def _load_table(path: Path, table: str):
    spec = importlib.util.spec_from_file_location(f"_{path.stem}_listing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, table)


BROKEN = _load_table(BROKEN_PLUGIN, "BROKEN")
LEARNS_MODELS = _load_table(BROKEN_PLUGIN, "LEARNS_MODELS")
BROKEN_RECIPES = _load_table(RECIPES_PLUGIN, "BROKEN_RECIPES")
LEARNS_RECIPES = sorted({n for n, (_, _, clauses) in BROKEN_RECIPES.items() if "train.learns" in clauses}
                        | set(_load_table(RECIPES_PLUGIN, "LEARNS_CONTROLS")))
BROKEN_DECODERS = _load_table(DECODERS_PLUGIN, "BROKEN_DECODERS")
BROKEN_SEARCHES = _load_table(DECODERS_PLUGIN, "BROKEN_SEARCHES")
# The conforming control of these runs. The reference is not run here: the README's test command runs the whole
# suite on it (its ``conformance/`` half, with more hypothesis examples), and so does ``aiayn audit``.
CONFORMING = ["independent"]
HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None


# Here (2 CPUs) the main run takes about 4 minutes, the train-area runs (train.learns on LEARNS_MODELS and
# LEARNS_RECIPES, the broken recipes) a few more (12 minutes in all measured on a busy machine); the limit only
# bounds a run gone wrong.
TIMEOUT = 1800


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_suite(impls, tmp: Path, *extra: str, env=None, suite: str | None = "conformance/"):
    out = tmp / "results.json"
    # The smoke profile: 3 examples, no shrinking. Each check's fixed witness shows its bug deterministically.
    cmd = [sys.executable, "-m", "pytest", *([suite] if suite else []), "-q", "-p", "no:cacheprovider",
           "--hypothesis-profile=smoke",
           f"--plugin={BROKEN_PLUGIN}", f"--plugin={INDEPENDENT_PLUGIN}", f"--plugin={DECODERS_PLUGIN}",
           f"--plugin={RECIPES_PLUGIN}",
           f"--impl={','.join(impls)}",
           f"--results-json={out}", *extra]
    # Its own xdist workers when this test runs alone; under the README's test command (``-n auto``) every CPU is
    # already busy with a worker of the outer run, and two more processes per run would only add their start-up
    # (torch, hypothesis and the plugins imported again: about 5 s of CPU each, 14 workers over the six runs).
    if (importlib.util.find_spec("xdist") is not None and threads.available_cpus() > 1
            and not os.environ.get("PYTEST_XDIST_WORKER")):
        cmd += ["-n", str(min(4, threads.available_cpus()))]
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:  # say how far it got, not only that it timed out
        done = _lines(out.with_name(out.name + ".progress")).count("done")
        pytest.fail(f"the suite run over {len(impls)} model(s) did not finish in {TIMEOUT} s ({done} tests done; "
                    f"{threads.ENV}={os.environ.get(threads.ENV)}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})"
                    f":\n{_text(exc.stdout)[-3000:]}{_text(exc.stderr)[-2000:]}")
    assert out.exists(), \
        f"the suite wrote no results (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-2000:]}"
    return res, json.loads(out.read_text())


# Exporting to ONNX takes seconds per model and only one bug here shows in it: the ONNX checks run on the
# models for which they can tell something, the rest of the suite on every model.
ONNX_TEST = "conformance/test_export.py"
# (the conforming control is the reference's own export.onnx check, in the conformance/ half of the same command)
ONNX_MODELS = ["broken-dropout-in-eval", "broken-vendor-onnx-op"]
# train.learns trains two tiny models per implementation (seconds): it runs on the conforming models, on
# LEARNS_MODELS and on LEARNS_RECIPES (the bugs it must catch and some it must not accuse); the rest of the train
# area runs on every broken recipe, whose model is the reference's.
TRAIN_TESTS = "conformance/test_train.py"
LEARNS = "learns"
# The broken decoders compute the reference's forward pass: only the decoding checks can tell them apart. The
# decoding components (length penalties, beam searches) run there too, alone and composed into the reference.
DECODE_TEST = "conformance/test_decode.py"
DECODE_COMPONENTS = "length_penalty:all,search:all"
# Built-in and broken decoding components that depart from §6.1, with the clauses they declare.
DEPARTING_COMPONENTS = {"length_penalty:length-power": {"decode.beam"}, "length_penalty:none": {"decode.beam"},
                        **{f"search:broken-{n}": set(c) for n, (_, _, c) in BROKEN_SEARCHES.items()}}
CONFORMING_COMPONENTS = ["length_penalty:reference", "search:reference"]
# Searches whose bug only the random score tables reach (conformance.helpers.decoding.RandomTables, driven alone):
# composed
# into the reference, the model witnesses' distributions never meet the regime where it decides (the early stop by
# lp(current length) changed no output on the sharpened witness model for any end symbol at max_len 8 or 20).
SEEN_ALONE_ONLY = {"search:broken-early-stop-current-length"}
COMPOSED = {f"reference+{kind}={name}": clauses for (kind, _, name), clauses in
            ((c.partition(":"), cl) for c, cl in DEPARTING_COMPONENTS.items() if c not in SEEN_ALONE_ONLY)}
COMPOSED_CONFORMING = "reference+search=reference+length_penalty=reference"
# The training components (optimizers, schedules, criteria) run the train area alone and composed into the
# reference; the built-ins that depart from §5 declare it (registry), so no table repeats their clauses here.
TRAIN_KINDS = ("optimizer", "lr_schedule", "criterion")
TRAIN_COMPONENTS = ",".join(f"{kind}:all" for kind in TRAIN_KINDS)
_TRAINING = [c for c in get_registry().components.values() if c.kind in TRAIN_KINDS]
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
TRAIN_DEPARTING = {f"{c.kind}:{c.name}": set(c.deviations) for c in _TRAINING if c.deviations
                   and (HAVE_TRANSFORMERS or c.name != "hf-inverse-sqrt")}  # its checks skip without the library
TRAIN_CONFORMING = [f"{c.kind}:{c.name}" for c in _TRAINING if not c.deviations]
TRAIN_COMPOSED = {f"reference+{kind}={name}": clauses for (kind, _, name), clauses in
                  ((c.partition(":"), cl) for c, cl in TRAIN_DEPARTING.items())}
TRAIN_COMPOSED_CONFORMING = "reference+optimizer=reference+lr_schedule=reference+criterion=reference"


# The suite runs this module makes, each its own fixture. The tests that read the recipes, decoders and training runs
# are methods of a class of their own: pytest-xdist's ``--dist loadscope`` (the README's test command) sends a module's
# functions to one worker and each class to one worker, so the four groups of runs can go to different workers and
# each run is made once. Without xdist the runs happen one after the other.


def _run_plan() -> dict[str, tuple[list[str], tuple[str, ...], str | None]]:
    """Run name -> (implementations, extra pytest arguments, suite path or None for the arguments' own)."""
    plan = {
        "main": (CONFORMING + [f"broken-{n}" for n in BROKEN], (f"--ignore={ONNX_TEST}", "-k", f"not {LEARNS}"),
                 "conformance/"),
        "learns": (CONFORMING + [f"broken-{n}" for n in LEARNS_MODELS] + [f"broken-recipe-{n}" for n in LEARNS_RECIPES],
                   (TRAIN_TESTS, "-k", LEARNS), None),
        "recipes": ([f"broken-recipe-{n}" for n in BROKEN_RECIPES], (TRAIN_TESTS, "-k", f"not {LEARNS}"), None),
        "decoders": ([f"broken-decoder-{n}" for n in BROKEN_DECODERS] + list(COMPOSED) + [COMPOSED_CONFORMING],
                     (DECODE_TEST, f"--component={DECODE_COMPONENTS}"), None),
        # train.learns on a composition would train with the component (seconds each): the recipe clauses say it
        "training": (list(TRAIN_COMPOSED) + [TRAIN_COMPOSED_CONFORMING],
                     (TRAIN_TESTS, f"--component={TRAIN_COMPONENTS}", "-k", f"not {LEARNS}"), None),
    }
    if HAVE_ORT:
        plan["onnx"] = (ONNX_MODELS, (ONNX_TEST,), None)
    return plan


def _tabulate(tests: list[dict]) -> dict[str, dict[str, list[dict]]]:
    table: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for rec in tests:
        if rec["subject"]:
            table[rec["subject"].split(":", 1)[1]][rec["clause"]].append(rec)
    return table


def _suite_run(name: str, tmp_path_factory):
    impls, args, suite = _run_plan()[name]
    res, data = run_suite(impls, tmp_path_factory.mktemp(name), *args, suite=suite)
    return res, _tabulate(data["tests"])


def _run_fixture(name: str):
    """A module-scoped fixture ``<name>_run`` making the plan's run ``name`` once: (process result, table)."""
    @pytest.fixture(name=f"{name}_run", scope="module")
    def run(tmp_path_factory):
        if name == "onnx" and not HAVE_ORT:
            return None, {}
        return _suite_run(name, tmp_path_factory)
    return run


main_run, learns_run, onnx_run, recipes_run, decoders_run, training_run = (
    _run_fixture(n) for n in ("main", "learns", "onnx", "recipes", "decoders", "training"))


def _problems(per_clause: dict[str, list[dict]], declared: set[str]) -> list[str]:
    problems = []
    for clause, recs in sorted(per_clause.items()):
        bad = [r for r in recs if r["outcome"] in ("failed", "error")]
        if bad:
            problems.append(f"{clause} {bad[0]['outcome']} (not declared): {bad[0]['message'][:300]}")
    for clause in sorted(declared):
        recs = per_clause.get(clause, [])
        if not any(r["outcome"] == "xfailed" for r in recs):
            seen = sorted({r["outcome"] for r in recs}) or ["no test ran"]
            problems.append(f"{clause} declared but not caught (outcomes: {', '.join(seen)})")
    return problems


def _caught_exactly(table: dict, name: str, declared: set[str]) -> None:
    """A departing component (alone or composed) fails exactly the clauses it declares."""
    per_clause = table.get(name)
    assert per_clause, f"{name}: no results (was it registered?)"
    problems = _problems(per_clause, declared)
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


def _passes_everything(table: dict, name: str) -> None:
    per_clause = table.get(name)
    assert per_clause, f"{name}: no results"
    outcomes_seen = {r["outcome"] for recs in per_clause.values() for r in recs}
    assert outcomes_seen == {"passed"}, f"{name}: {sorted(outcomes_seen)} in {dict(per_clause)}"


def _unproven_component_checks(table: dict, names: list[str]) -> tuple[dict[str, set[str]], list[str]]:
    """(each component check run on ``names`` -> the outcomes seen, the checks no departing component fails)."""
    runs: dict[str, set[str]] = defaultdict(set)
    for name in names:
        for recs in table.get(name, {}).values():
            for r in recs:
                runs[r["nodeid"].split("[")[0]].add(r["outcome"])
    return runs, sorted(check for check, seen in runs.items() if "xfailed" not in seen)



# The clauses each run of the broken models covers: the learns run only train.learns, the ONNX run only
# export.onnx, the main run everything else (each run's green test checks its records keep to its share).
LEARNS_CLAUSES = {"train.learns"}
ONNX_CLAUSES = {"export.onnx"}


def _clauses_seen(table: dict[str, dict[str, list[dict]]]) -> set[str]:
    return {clause for per_clause in table.values() for clause in per_clause}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_model_is_caught_by_exactly_its_clauses(main_run, name):
    """The main run (every area but train.learns and export.onnx, which their own runs check below)."""
    build, output, bug, clauses = BROKEN[name]
    assert set(clauses) <= set(CLAUSES), f"broken-{name} declares unknown clauses {set(clauses) - set(CLAUSES)}"
    per_clause = main_run[1].get(f"broken-{name}")
    assert per_clause, f"broken-{name}: no results (was it registered?)"
    problems = _problems(per_clause, set(clauses) - LEARNS_CLAUSES - ONNX_CLAUSES)
    assert not problems, f"broken-{name} ({bug}):\n  " + "\n  ".join(problems)


def test_only_the_models_train_learns_runs_on_declare_it():
    declaring = {n for n, (_, _, _, clauses) in BROKEN.items() if "train.learns" in clauses}
    assert declaring <= set(LEARNS_MODELS), f"declare train.learns but are not in LEARNS_MODELS: {declaring}"


def test_the_learns_controls_are_recipes_that_must_learn():
    controls = _load_table(RECIPES_PLUGIN, "LEARNS_CONTROLS")
    assert set(controls) <= set(BROKEN_RECIPES), sorted(set(controls) - set(BROKEN_RECIPES))
    assert not [n for n in controls if "train.learns" in BROKEN_RECIPES[n][2]], "a control declares train.learns"


def test_only_the_models_the_onnx_run_exports_declare_export_onnx():
    declaring = {f"broken-{n}" for n, (_, _, _, clauses) in BROKEN.items() if ONNX_CLAUSES & set(clauses)}
    assert declaring <= set(ONNX_MODELS), f"declare export.onnx but are not in ONNX_MODELS: {declaring}"


def test_every_decode_clause_is_proven_by_a_broken_decoder():
    proven = {c for *_, clauses in BROKEN_DECODERS.values() for c in clauses}
    assert proven == {c for c in CLAUSES if c.startswith("decode.")}


def _no_false_alarm(per_clause: dict[str, list[dict]] | None, name: str) -> set[str]:
    """Assert a conforming model fails nothing and is excused nothing; return the clauses it passed."""
    assert per_clause, f"{name}: no results"
    problems = _problems(per_clause, set())
    problems += [f"{c}: {r['outcome']}" for c, recs in per_clause.items() for r in recs
                 if r["outcome"] in ("xfailed", "xpassed")]
    assert not problems, f"{name} is accused:\n  " + "\n  ".join(problems)
    return {c for c, recs in per_clause.items() if any(r["outcome"] == "passed" for r in recs)}


@pytest.mark.parametrize("name", CONFORMING)
def test_conforming_models_raise_no_false_alarm(main_run, name):
    ran = _no_false_alarm(main_run[1].get(name), name)
    expected = set(CLAUSES) - {"device.parity"} - LEARNS_CLAUSES - ONNX_CLAUSES
    assert ran >= expected, f"{name}: clauses never passed: {sorted(expected - ran)}"


def test_a_skip_names_its_real_cause(main_run):
    """train.equivalence cannot be judged on a model whose attention dropout ignores the configuration's rate of 0:
    its skip names that (model.eval-determinism), not model.reference-equivalence, which the model passes."""
    recs = main_run[1]["broken-attention-dropout-hard-coded"]
    equivalence = recs["model.reference-equivalence"]
    assert any(r["outcome"] == "passed" for r in equivalence), equivalence
    skips = [r["detail"] for r in recs["train.equivalence"] if r["outcome"] == "skipped"]
    assert skips and all("blocked by model.eval-determinism" in m and "dropout stays on" in m for m in skips), skips


# Models that cannot hold the canonical weights (no load_reference_state): every transplant-based check skips, and
# the own-weights probes (conformance.helpers.traces, the checks named ``*_on_own_weights``) judge these clauses.
OWN_WEIGHT_CLAUSES = ("attention.scale", "attention.heads", "mask.causal", "mask.source-padding", "mask.target-padding",
                      "embedding.scale", "position.formula", "position.added")
NO_TRANSPLANT = sorted(n for n in BROKEN if n.startswith("no-transplant") or n == "shared-heads-scale-d-model")
# Declared departures an own-weights probe must NOT see, because they happen after what it reads: with the heads
# merged without the transpose, every attention's weights are masked as the paper says (the mask probes read them
# and pass); positions leak afterwards, in W^O's input, which the black-box mask witnesses catch.
PAST_THE_PROBE = {"no-transplant-heads-no-transpose": {"mask.causal", "mask.source-padding", "mask.target-padding"}}


def _own_weight_problems(per_clause: dict[str, list[dict]], declared: set[str], past: frozenset[str] = frozenset()
                         ) -> list[str]:
    """Each of OWN_WEIGHT_CLAUSES judged by its own-weights probes: where ``declared``, failed (xfailed) by at least
    one of them (the others may pass: the plain trace does not see a finite fill the sharpened one shows); passed
    by every probe elsewhere (xpassed where the declared departure is ``past`` the probes); a skip (the clause not
    judged) is a problem."""
    problems = []
    for clause in OWN_WEIGHT_CLAUSES:
        seen = sorted({r["outcome"] for r in per_clause.get(clause, []) if "_on_own_weights" in r["nodeid"]})
        if clause in past:
            ok, wanted = seen == ["xpassed"], "xpassed"
        elif clause in declared:
            ok, wanted = "xfailed" in seen and set(seen) <= {"xfailed", "xpassed"}, "xfailed by at least one"
        else:
            ok, wanted = seen == ["passed"], "passed"
        if not ok:
            problems.append(f"{clause}: own-weights probes {', '.join(seen) or 'did not run'}, expected {wanted}")
    return problems


@pytest.mark.parametrize("name", NO_TRANSPLANT)
def test_a_model_without_the_transplant_is_judged_on_its_own_weights(main_run, name):
    """A model that cannot hold the reference's weights is still judged: its own-weights probes fail exactly the
    clauses it declares among OWN_WEIGHT_CLAUSES and pass the others, none skipped (not judged); the checks that
    need the transplant skip naming load_reference_state, not model.reference-equivalence."""
    _, _, bug, clauses = BROKEN[name]
    per_clause = main_run[1].get(f"broken-{name}")
    assert per_clause, f"broken-{name}: no results (was it registered?)"
    problems = _own_weight_problems(per_clause, set(clauses), frozenset(PAST_THE_PROBE.get(name, ())))
    problems += [f"{r['clause']} skipped as blocked by another clause: {r['detail'][:200]}"
                 for recs in per_clause.values() for r in recs
                 if r["outcome"] == "skipped" and "blocked by model.reference-equivalence" in (r["detail"] or "")]
    assert not problems, f"broken-{name} ({bug}):\n  " + "\n  ".join(problems)


def test_the_main_run_is_green(main_run):
    res, table = main_run
    assert res.returncode == 0, res.stdout[-4000:]
    assert not _clauses_seen(table) & (LEARNS_CLAUSES | ONNX_CLAUSES), "the main run ran another run's clauses"


@pytest.mark.slow  # twenty implementations trained on two tasks each; tests/test_train_learns.py has the fast proof
class TestLearnsRun:
    """train.learns on the conforming models and on the broken models that must (or must not) fail it."""

    @pytest.mark.parametrize("name", sorted(LEARNS_MODELS))
    def test_broken_model_is_caught_by_exactly_its_clauses(self, learns_run, name):
        build, output, bug, clauses = BROKEN[name]
        per_clause = learns_run[1].get(f"broken-{name}")
        assert per_clause, f"broken-{name}: no results (was it registered?)"
        problems = _problems(per_clause, set(clauses) & LEARNS_CLAUSES)
        assert not problems, f"broken-{name} ({bug}):\n  " + "\n  ".join(problems)

    @pytest.mark.parametrize("name", LEARNS_RECIPES)
    def test_broken_recipe_learns_as_declared(self, learns_run, name):
        _, bug, clauses = BROKEN_RECIPES[name]
        per_clause = learns_run[1].get(f"broken-recipe-{name}")
        assert per_clause, f"broken-recipe-{name}: no results (was it registered?)"
        problems = _problems(per_clause, set(clauses) & LEARNS_CLAUSES)
        assert not problems, f"broken-recipe-{name} ({bug}):\n  " + "\n  ".join(problems)

    @pytest.mark.parametrize("name", CONFORMING)
    def test_conforming_models_learn(self, learns_run, name):
        assert _no_false_alarm(learns_run[1].get(name), name) >= LEARNS_CLAUSES

    def test_the_run_is_green(self, learns_run):
        res, table = learns_run
        assert res.returncode == 0, res.stdout[-4000:]
        assert _clauses_seen(table) <= LEARNS_CLAUSES, sorted(_clauses_seen(table))


@pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed: no ONNX run")
class TestOnnxRun:
    """export.onnx on the models for which it can tell something (ONNX_MODELS)."""

    @pytest.mark.parametrize("name", ONNX_MODELS)
    def test_each_model_fails_exactly_its_declared_export_clause(self, onnx_run, name):
        clauses = set(BROKEN[name.removeprefix("broken-")][3]) if name.startswith("broken-") else set()
        per_clause = onnx_run[1].get(name)
        assert per_clause, f"{name}: no results (was it registered?)"
        problems = _problems(per_clause, clauses & ONNX_CLAUSES)
        assert not problems, f"{name}:\n  " + "\n  ".join(problems)

    def test_the_run_is_green(self, onnx_run):
        res, table = onnx_run
        assert res.returncode == 0, res.stdout[-4000:]
        assert _clauses_seen(table) <= ONNX_CLAUSES, sorted(_clauses_seen(table))


class TestRecipesRun:
    """The broken training recipes (the train area on the reference's model)."""

    @pytest.mark.parametrize("name", sorted(BROKEN_RECIPES))
    def test_broken_recipe_is_caught_by_exactly_its_clauses(self, recipes_run, name):
        _, table = recipes_run
        _, bug, clauses = BROKEN_RECIPES[name]
        assert set(clauses) <= {c for c in CLAUSES if c.startswith("train.")}, f"broken-recipe-{name}: {set(clauses)}"
        per_clause = table.get(f"broken-recipe-{name}")
        assert per_clause, f"broken-recipe-{name}: no results (was it registered?)"
        problems = _problems(per_clause, set(clauses) - LEARNS_CLAUSES)
        assert not problems, f"broken-recipe-{name} ({bug}):\n  " + "\n  ".join(problems)

    def test_the_run_is_green(self, recipes_run):
        res, table = recipes_run
        assert res.returncode == 0, res.stdout[-4000:]
        assert not _clauses_seen(table) & LEARNS_CLAUSES, "the recipes run ran the learns run's clause"


class TestDecodersRun:
    """The broken decoders and the decoding components, alone and composed into the reference."""

    @pytest.mark.parametrize("name", sorted(BROKEN_DECODERS))
    def test_broken_decoder_is_caught_by_exactly_its_clauses(self, decoders_run, name):
        _, table = decoders_run
        build, output, bug, clauses = BROKEN_DECODERS[name]
        assert set(clauses) <= {c for c in CLAUSES if c.startswith("decode.")}, \
            f"broken-decoder-{name} declares clauses outside the decode area: {sorted(clauses)}"
        per_clause = table.get(f"broken-decoder-{name}")
        assert per_clause, f"broken-decoder-{name}: no results (was it registered?)"
        problems = _problems(per_clause, set(clauses))
        assert not problems, f"broken-decoder-{name} ({bug}):\n  " + "\n  ".join(problems)

    def test_a_cache_failing_between_judged_steps_is_traced_to_its_first_step(self, decoders_run):
        """decode.incremental judges a sample of the steps (all of them would cost T^2 at max_len 512); a window of
        20 positions first shows at step 20, between the judged steps 17 and 24, and the message names step 20."""
        recs = decoders_run[1]["broken-decoder-self-window-20"]["decode.incremental"]
        message = next(r["detail"] for r in recs if r["outcome"] == "xfailed")
        assert "at step 20 (the first, found by bisection between the judged steps 17 and 24)" in message, message
        assert "a self-attention cache that keeps only the last 20 positions" in message, message

    @pytest.mark.parametrize("name", sorted(DEPARTING_COMPONENTS) + sorted(COMPOSED))
    def test_decoding_component_is_caught_by_exactly_its_clauses(self, decoders_run, name):
        """Alone (``--component``) and composed into the reference (``reference+KIND=NAME``, inheriting its
        declarations), a departing length penalty or search fails exactly the clauses it declares."""
        _caught_exactly(decoders_run[1], name, DEPARTING_COMPONENTS.get(name) or COMPOSED[name])

    @pytest.mark.parametrize("name", CONFORMING_COMPONENTS + [COMPOSED_CONFORMING])
    def test_the_reference_decoding_components_pass_alone_and_composed(self, decoders_run, name):
        _passes_everything(decoders_run[1], name)

    def test_every_decoding_component_check_fails_for_some_departing_component(self, decoders_run):
        """Each length-penalty and search check is proven able to fail: a departing component fails it."""
        runs, unproven = _unproven_component_checks(decoders_run[1], list(DEPARTING_COMPONENTS) + CONFORMING_COMPONENTS)
        assert len(runs) == 6, sorted(runs)  # two length-penalty checks, four search checks
        assert not unproven, f"component checks no departing component fails: {unproven}"

    def test_the_run_is_green(self, decoders_run):
        res, _ = decoders_run
        assert res.returncode == 0, res.stdout[-4000:]


class TestTrainingRun:
    """The training components, alone and composed into the reference."""

    @pytest.mark.parametrize("name", sorted(TRAIN_DEPARTING) + sorted(TRAIN_COMPOSED))
    def test_training_component_is_caught_by_exactly_its_clauses(self, training_run, name):
        """Alone (``--component``) and composed into the reference (``reference+KIND=NAME``), a departing optimizer,
        schedule or criterion fails exactly the clauses it declares."""
        _caught_exactly(training_run[1], name, TRAIN_DEPARTING.get(name) or TRAIN_COMPOSED[name])

    @pytest.mark.parametrize("name", TRAIN_CONFORMING + [TRAIN_COMPOSED_CONFORMING])
    def test_the_conforming_training_components_pass_alone_and_composed(self, training_run, name):
        _passes_everything(training_run[1], name)

    def test_every_training_component_check_fails_for_some_departing_component(self, training_run):
        """Each optimizer, schedule and criterion check is proven able to fail: a departing component fails it."""
        runs, unproven = _unproven_component_checks(training_run[1], list(TRAIN_DEPARTING) + TRAIN_CONFORMING)
        assert len(runs) == 4, sorted(runs)  # optimizer, schedule, and two criterion checks
        assert not unproven, f"component checks no departing component fails: {unproven}"

    def test_the_run_is_green(self, training_run):
        res, _ = training_run
        assert res.returncode == 0, res.stdout[-4000:]


class TestNegativeControl:
    """Its own run, so that it can go to another worker."""

    def test_without_its_declaration_a_bug_fails_its_clause(self, tmp_path):
        """The negative control: the same model, undeclared, fails the clause with its diagnostic."""
        res, data = run_suite(["broken-scale-d-model"], tmp_path, "--clause=attention.scale",
                              env={"AIAYN_BROKEN_UNDECLARED": "1"})
        assert res.returncode == 1, res.stdout[-3000:]
        failed = [r for r in data["tests"] if r["outcome"] == "failed"]
        assert failed and all(r["clause"] == "attention.scale" for r in failed), data["tests"]
        assert "[attention.scale]" in failed[0]["detail"] and "measured:" in failed[0]["detail"]

"""``aiayn train`` and the train area in the audit's records and reports (notes, learning curves)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

from aiayn_conformance.audit import AuditResult, SubjectResult, fold, report
from aiayn_conformance.audit.figures import learning_curves_figure
from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.learning import TASKS, LearningCurve

PNG = b"\x89PNG"


def curve(task: str = "copy", accuracy: float = 0.95) -> dict:
    c = LearningCurve(task, 0, "the reference's recipe", TASKS[task].threshold, loss=[2.2, 1.5, 0.7],
                      teacher_forced=[0.1, 0.5, 0.9], lr=[1e-3, 2e-3, 3e-3], eval_steps=[3], greedy=[accuracy],
                      accuracy=accuracy, seconds=1.0)
    return c.to_json()


# -- aiayn train -----------------------------------------------------------------------------------------------
def test_train_runs_the_check_budget_and_saves_the_plot(tmp_path, capsys):
    plot = tmp_path / "curves" / "copy.png"
    code = main(["train", "--impl", "reference", "--task", "copy", "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "recipe: the implementation's own recipe" in out
    assert "reaches the train.learns threshold of 50%" in out
    assert "] 150/150" in err  # the progress line
    assert plot.read_bytes()[:4] == PNG and f"plot: {plot}" in out


def test_train_says_which_recipe_it_uses(capsys):
    code = main(["train", "--impl", "torch-nn", "--steps", "2", "--no-plot"])
    out, _ = capsys.readouterr()
    assert "recipe: the reference's recipe (the paper's" in out  # torch-nn exposes none
    assert code == 1  # 2 updates do not reach the threshold: exit 1, as documented
    main(["train", "--impl", "hyunwoongko", "--steps", "2", "--no-plot", "--recipe", "reference"])
    assert "the reference's recipe (the paper's §5.3-5.4), as asked" in capsys.readouterr().out


def test_train_at_a_larger_vocabulary_scores_over_the_model_s_vocabulary(tmp_path, capsys):
    """--config with a vocabulary larger than the task's: the paper's criterion (used for a model that exposes no
    recipe) scores over the model's vocabulary, not the task's few symbols."""
    saved = tmp_path / "w.pt"
    code = main(["train", "--impl", "torch-nn", "--config", "d_model=32,h=4,N=2,d_ff=64,src_vocab=50", "--steps", "2",
                 "--no-plot", "--save", str(saved)])
    out, err = capsys.readouterr()
    assert "recipe: the reference's recipe (the paper's" in out and "vocab 50" in out, out
    assert code == 1 and saved.exists(), err  # trained (2 updates do not reach the threshold) and saved


def test_train_usage_errors_are_one_line(capsys, monkeypatch):
    assert main(["train", "--impl", "no-such-model", "--no-plot"]) == 2
    assert "unknown implementation 'no-such-model'" in capsys.readouterr().err
    assert main(["train", "--steps", "0", "--no-plot"]) == 2
    assert "--steps must be at least 1" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the report extra were not installed
    assert main(["train", "--impl", "reference"]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "aiayn-conformance[report]" in err and len(err.strip().splitlines()) == 1


def test_train_reports_an_implementation_that_crashes(tmp_path, capsys):
    plugin = tmp_path / "crashing.py"
    plugin.write_text("from aiayn_conformance.implementations import Implementation, hookimpl\n\n"
                      "def build(config):\n    raise RuntimeError('no weights for you')\n\n"
                      "@hookimpl\ndef register_implementations(register):\n"
                      "    register(Implementation(name='crashing-train', build=build))\n")
    assert main(["train", "--impl", "crashing-train", "--plugin", str(plugin), "--no-plot"]) == 1
    assert "crashing-train failed" in capsys.readouterr().err


# -- records and reports ---------------------------------------------------------------------------------------
def test_a_pass_keeps_its_note_and_the_reports_show_it():
    recs = [{"nodeid": f"t::{i}", "subject": "impl:x", "clause": "train.label-smoothing", "outcome": "passed",
             "declared": False, "message": "", "detail": "", "duration": 0.1, "note": "eps/(V-1)"} for i in range(2)]
    got = fold(recs, {})["train.label-smoothing"]
    assert got.status == "pass" and got.message == "eps/(V-1)"
    s = SubjectResult("x", "implementation")
    s.clauses = {"train.label-smoothing": got}
    result = AuditResult([s])
    assert "## Notes" in report.markdown(result) and "eps/(V-1)" in report.markdown(result)
    assert "eps/(V-1)" in report.as_html(result)


def test_learning_curves_reach_the_json_and_the_html():
    s = SubjectResult("x", "implementation")
    s.learning_curves = [curve("copy"), curve("reverse", 0.2)]
    assert s.to_json()["learning_curves"][1]["accuracy"] == 0.2
    figures = learning_curves_figure("x", s.learning_curves)
    (title, png), = figures.items()
    assert "train.learns" in title and base64.b64decode(png)[:4] == PNG
    s.figures = figures
    assert "data:image/png;base64," in report.as_html(AuditResult([s]))


@pytest.mark.parametrize("nan_at", [1])
def test_curves_with_a_nan_loss_still_serialize_and_draw(nan_at):
    c = curve()
    c["loss"][nan_at] = None  # to_json writes non-finite values as null
    assert learning_curves_figure("x", [c])


@pytest.mark.slow
def test_the_audit_collects_the_curves_of_train_learns(tmp_path):
    """A real suite run with --results-json records the curves; run_job folds them into the subject."""
    from aiayn_conformance.audit import Job, Progress, run_job

    subject = SubjectResult("reference", "implementation")
    job = Job("reference", ["--impl=reference", "--clause=train.learns"], [subject])
    run_job(job, plugins=[], extra=[], workdir=tmp_path, timeout=600, progress=Progress(enabled=False))
    assert subject.clauses["train.learns"].status == "pass", subject.clauses
    assert sorted(c["task"] for c in subject.learning_curves) == ["copy", "reverse"]
    assert all(len(c["loss"]) == TASKS[c["task"]].steps for c in subject.learning_curves)
    assert "held-out sequences after 150 updates" in subject.clauses["train.learns"].message


def test_learning_curve_json_round_trips(tmp_path):
    import json

    path = Path(tmp_path) / "c.json"
    path.write_text(json.dumps(curve()))
    assert json.loads(path.read_text())["threshold"] == 0.5

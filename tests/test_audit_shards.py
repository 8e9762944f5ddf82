"""Audits beyond one machine: ``aiayn audit --shard I/N``, ``--merge``, and the CI formats (junit, github)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from aiayn_conformance import spec
from aiayn_conformance.audit import plan, report, take_shard
from aiayn_conformance.audit.ci_report import where
from aiayn_conformance.audit.locations import locate
from aiayn_conformance.audit.merge import MergeError, merge_files
from aiayn_conformance.audit.results import AuditResult, ClauseResult, SubjectResult
from aiayn_conformance.audit.shards import Shard, parse_shard, shard_of
from aiayn_conformance.cli import main
from aiayn_conformance.implementations import get_registry
from aiayn_conformance.spec import CLAUSES

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tests/fixtures/ci_plugin.py"


# -- shards ------------------------------------------------------------------------------------------------------
def registered_names() -> list[str]:
    reg = get_registry()
    return [*reg.implementations, *(f"{k}:{n}" for k, n in reg.components)]


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_every_subject_lands_in_exactly_one_shard(count):
    names = registered_names()
    held = {i: [n for n in names if Shard(i, count).holds(n)] for i in range(1, count + 1)}
    assert sorted(n for ns in held.values() for n in ns) == sorted(names)
    if count > 1:
        assert all(len(ns) < len(names) for ns in held.values()), "a hash that puts everything in one shard"


def test_a_subject_added_later_moves_no_other():
    names = registered_names()
    before = {n: shard_of(n, 4) for n in names}
    after = {n: shard_of(n, 4) for n in [*names, "a-new-plugin", "attention:a-new-kernel"]}
    assert {n: after[n] for n in names} == before
    assert before == {n: shard_of(n, 4) for n in reversed(names)}  # nor does the order of registration


def test_shards_partition_the_planned_jobs_and_cut_the_component_run():
    jobs = plan(get_registry(), "all", "all")
    every = [s.name for j in jobs for s in j.subjects]
    parts = [take_shard(jobs, Shard(i, 3)) for i in (1, 2, 3)]
    assert sorted(s.name for p in parts for j in p for s in j.subjects) == sorted(every)
    for part in parts:
        comp = [j for j in part if j.label == "components"]
        if comp:
            names = [s.name for s in comp[0].subjects]
            assert comp[0].args == [f"--component={','.join(names)}"]


@pytest.mark.parametrize("text, needle", [
    ("3/2", "I must lie between 1 and N=2"),
    ("0/2", "I must lie between 1 and N=2"),
    ("1/0", "N must be at least 1"),
    ("2", "is not of the form I/N"),
    ("a/b", "is not of the form I/N"),
])
def test_a_bad_shard_is_one_line_and_exit_2(capsys, text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_shard(text)
    assert main(["audit", "--impl", "reference", "--shard", text]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "I counted from 1" in err and len(err.splitlines()) == 1


def test_an_empty_shard_writes_an_empty_report(capsys, tmp_path):
    assert shard_of("reference", 2) == 1
    out = tmp_path / "empty.json"
    assert main(["audit", "--impl", "reference", "--shard", "2/2", "--format", "json", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["shard"] == "2/2" and data["implementations"] == {} and data["components"] == {}
    assert "shard 2/2 holds 0 of the 1 subjects selected" in capsys.readouterr().err
    assert merge_files([str(out)])[0].subjects == []


# -- merging -----------------------------------------------------------------------------------------------------
def subject(name: str, statuses: dict[str, str], kind: str = "implementation") -> SubjectResult:
    s = SubjectResult(name, kind, source=f"{name}.py", summary=f"the {name} model",
                      location={"file": f"plugins/{name}.py", "line": 10, "deviations": {"mask.causal": 14}})
    s.clauses = {c: ClauseResult(st, f"{c} {st} message", f"{c} detail") for c, st in statuses.items()}
    return s


def write(path: Path, *subjects: SubjectResult, shard: str = "", **fields) -> str:
    result = AuditResult(list(subjects), seconds=2.0, command="aiayn audit", shard=shard)
    data = result.to_json() | fields
    path.write_text(json.dumps(data))
    return str(path)


def test_merge_builds_one_matrix_in_the_registry_order(tmp_path):
    a = write(tmp_path / "a.json", subject("zeta", {"attention.scale": "fail", "mask.causal": "deviation"}),
              subject("attention:k", {"attention.scale": "pass"}, "component"), shard="1/2")
    b = write(tmp_path / "b.json", subject("alpha", {"attention.scale": "pass"}), shard="2/2")
    result, notes = merge_files([a, b], order=["zeta"])
    assert [s.name for s in result.subjects] == ["zeta", "alpha", "attention:k"]
    assert notes == [] and result.exit_code == 1 and result.seconds == 4.0
    assert [m["shard"] for m in result.merged] == ["1/2", "2/2"]
    zeta = result.subjects[0]
    assert zeta.verdict == "nonconforming (2 must, 0 should)" and zeta.location["line"] == 10
    assert zeta.clauses["mask.causal"] == ClauseResult("deviation", "mask.causal deviation message",
                                                       "mask.causal detail", 0)


def test_a_missing_shard_is_named(tmp_path):
    a = write(tmp_path / "a.json", subject("x", {"attention.scale": "pass"}), shard="1/3")
    _, notes = merge_files([a])
    assert notes == ["shards of 3: 2/3, 3/3 missing; the matrix lacks their subjects"]


def test_an_identical_duplicate_is_kept_once_and_a_different_one_refused(tmp_path):
    a = write(tmp_path / "a.json", subject("x", {"attention.scale": "pass", "mask.causal": "fail"}))
    same = write(tmp_path / "same.json", subject("x", {"attention.scale": "pass", "mask.causal": "fail"}))
    result, notes = merge_files([a, same])
    assert [s.name for s in result.subjects] == ["x"] and "the first kept" in notes[0]
    other = write(tmp_path / "other.json", subject("x", {"attention.scale": "pass", "mask.causal": "pass"}))
    with pytest.raises(MergeError, match=r"subject 'x' is in .*a.json and .*other.json with different results "
                                         r"\(clause mask.causal: fail vs pass\)"):
        merge_files([a, other])


BAD_FILES = [
    ("missing.json", None, "cannot read it (No such file or directory)"),
    ("text.json", "not json {", "not JSON"),
    ("records.json", {"tests": []}, "not an aiayn audit (no 'schema' and 'implementations' fields)"),
    ("schema1.json", {"schema": 1, "spec": spec.SPEC_VERSION, "implementations": {}},
     "audit schema 1, this aiayn reads schema 3 only"),
    ("spec.json", {"schema": 3, "spec": "0-other", "implementations": {}},
     "clause catalogue (spec) version '0-other'"),
    ("clause.json", {"schema": 3, "spec": spec.SPEC_VERSION,
                     "implementations": {"x": {"kind": "implementation", "clauses": {"no.such": {"status": "pass"}}}}},
     "subject 'x' has clause 'no.such', unknown to this catalogue"),
    ("status.json", {"schema": 3, "spec": spec.SPEC_VERSION,
                     "implementations": {"x": {"kind": "implementation",
                                               "clauses": {"attention.scale": {"status": "great"}}}}},
     "subject 'x' clause 'attention.scale' has no valid status"),
]


@pytest.mark.parametrize("name, content, needle", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_file_that_is_not_a_usable_audit_is_one_line_and_exit_2(capsys, tmp_path, name, content, needle):
    good = write(tmp_path / "good.json", subject("x", {"attention.scale": "pass"}))
    path = tmp_path / name
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["audit", "--merge", good, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and str(path) in err and len(err.splitlines()) == 1, err


def test_merge_conflicts_and_options_that_run_an_audit_exit_2(capsys, tmp_path):
    a = write(tmp_path / "a.json", subject("x", {"attention.scale": "pass"}))
    b = write(tmp_path / "b.json", subject("x", {"attention.scale": "error"}))
    assert main(["audit", "--merge", a, b]) == 2
    err = capsys.readouterr().err.strip()
    assert "with different results (clause attention.scale: pass vs error)" in err and len(err.splitlines()) == 1
    assert main(["audit", "--merge", a, "--impl", "reference", "--shard", "1/2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "aiayn audit: --merge reads audits and runs none; --impl, --shard cannot be given with it"


def test_merge_renders_every_format_with_the_figures_carried(tmp_path):
    drawn = subject("drawn", {"attention.scale": "pass"})
    drawn.figures = {"the positional table": "iVBORw0KGgo="}
    a = write(tmp_path / "a.json", drawn, subject("bare", {"attention.scale": "fail"}))
    out = tmp_path / "merged"
    for fmt in report.FORMATS:
        assert main(["audit", "--merge", a, "--format", fmt, "--output", f"{out}.{fmt}"]) == 1
    html = (tmp_path / "merged.html").read_text()
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in html
    assert "carries no pictures of this implementation" in html.split('id="bare"')[1]
    assert json.loads((tmp_path / "merged.json").read_text())["implementations"]["drawn"]["figures"] == drawn.figures
    assert "bare" in (tmp_path / "merged.text").read_text() and "| drawn |" in (tmp_path / "merged.md").read_text()


def test_merge_draws_the_learning_curves_from_the_records(tmp_path):
    pytest.importorskip("matplotlib")
    s = subject("learner", {"train.learns": "pass"})
    s.learning_curves = [{"task": "copy", "seed": 0, "recipe": "the reference's recipe", "threshold": 0.5,
                          "loss": [2.0, 1.0, 0.5], "teacher_forced": [0.1, 0.5, 0.9], "lr": [1e-4, 2e-4, 3e-4],
                          "eval_steps": [2, 3], "greedy": [0.2, 0.8], "accuracy": 0.8, "seconds": 1.0,
                          "stopped": ""}]
    a = write(tmp_path / "a.json", s)
    assert main(["audit", "--merge", a, "--format", "html", "--output", str(tmp_path / "m.html")]) == 0
    html = (tmp_path / "m.html").read_text()
    assert html.count("<img") == 1 and 'alt="train.learns' in html


# -- CI formats: the adapter's line --------------------------------------------------------------------------------
def test_locate_finds_the_build_and_each_declaration():
    impl = get_registry().get("prenorm")
    loc = locate(impl.build, impl.deviations, cwd=str(ROOT))
    assert loc["file"] == "implementations/builtins/prenorm.py"
    lines = (ROOT / loc["file"]).read_text().splitlines()
    assert lines[loc["line"] - 1].lstrip().startswith(("class ", "def "))
    assert set(loc["deviations"]) == set(impl.deviations)
    for clause, line in loc["deviations"].items():
        assert f'"{clause}"' in lines[line - 1], (clause, lines[line - 1])


def test_junit_has_one_case_per_clause_with_the_finding_on_its_line():
    s = subject("x", {"attention.scale": "fail", "mask.causal": "deviation", "device.parity": "not-judged",
                      "model.shape": "pass", "norm.epsilon": "error", "norm.post-norm": "unexpected-pass"})
    s.location["deviations"]["norm.post-norm"] = 15
    s.clauses["model.shape"] = ClauseResult("pass")  # a pass with nothing to say: an empty case
    root = ET.fromstring(report.render(AuditResult([s], command="aiayn audit"), "junit").split("\n", 1)[1])
    assert root.attrib | {"time": ""} == {"name": "aiayn audit", "tests": "6", "failures": "2", "errors": "1",
                                          "skipped": "1", "time": ""}
    cases = {c.attrib["name"]: c for c in root.iter("testcase")}
    assert set(cases) == set(s.clauses) and {c.attrib["classname"] for c in cases.values()} == {"x"}
    assert [c.tag for c in cases["attention.scale"]] == ["failure"]
    assert (cases["attention.scale"].attrib["file"], cases["attention.scale"].attrib["line"]) == ("plugins/x.py", "10")
    assert cases["mask.causal"].attrib["line"] == "14" and [c.tag for c in cases["mask.causal"]] == ["system-out"]
    assert cases["norm.post-norm"].attrib["line"] == "15" and cases["norm.post-norm"][0].attrib["type"] == \
        "unexpected-pass"
    assert [c.tag for c in cases["norm.epsilon"]] == ["error"] and [c.tag for c in cases["device.parity"]] == \
        ["skipped"]
    assert list(cases["model.shape"]) == []


def test_github_annotations_escape_and_point_at_the_line():
    s = subject("x", {"attention.scale": "fail", "mask.causal": "deviation", "model.shape": "pass"})
    s.clauses["attention.scale"] = ClauseResult("fail", "50% off, by: a lot", "line 1\nline 2")
    out = report.render(AuditResult([s]), "github").splitlines()
    assert out[0] == ("::error file=plugins/x.py,line=10,title=x attention.scale (§3.2.1%2C Eq. (1))%3A fail::"
                      "x attention.scale (§3.2.1, Eq. (1), must) fail: 50%25 off, by: a lot%0Aline 1%0Aline 2")
    assert out[1].startswith("::notice file=plugins/x.py,line=14,")
    assert len(out) == 3 and out[2] == report.summary_line(AuditResult([s]))


def test_a_subject_without_a_location_is_annotated_without_a_file():
    s = subject("x", {"attention.scale": "fail"})
    s.location = {}
    assert where(s, "attention.scale", s.clauses["attention.scale"]) is None
    assert report.render(AuditResult([s]), "github").startswith("::error title=")


# -- end to end: the merged shards are the unsharded audit --------------------------------------------------------
SELECTION = ["--plugin", PLUGIN, "--impl", "reference,ci-unscaled", "--component", "attention:sdpa-math",
             "--clause", "model.shape,attention.scale,embedding.scale"]


def aiayn_audit(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", *SELECTION, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shards")
    assert {shard_of(n, 2) for n in ("reference", "ci-unscaled", "attention:sdpa-math")} == {1, 2}
    runs = {"all": aiayn_audit("--format", "json", "--output", str(tmp / "all.json"))}
    for i in (1, 2):  # shard 1 (the reference) draws the HTML report's pictures into its JSON
        figures = ["--figures"] if i == 1 else []
        runs[f"{i}/2"] = aiayn_audit("--shard", f"{i}/2", "--jobs", "1", "--format", "json", *figures,
                                     "--output", str(tmp / f"shard{i}.json"))
    return tmp, runs


@pytest.mark.slow
def test_the_merged_shards_equal_the_unsharded_audit(sharded, capsys):
    tmp, runs = sharded
    for name, run in runs.items():  # ci-unscaled (shard 2/2) fails a clause; the reference (1/2) none
        assert run.returncode == (0 if name == "1/2" else 1), run.stderr[-3000:]
    merged = tmp / "merged.json"
    assert main(["audit", "--merge", str(tmp / "shard1.json"), str(tmp / "shard2.json"), "--format", "json",
                 "--output", str(merged)]) == 1
    whole, parts = json.loads((tmp / "all.json").read_text()), json.loads(merged.read_text())

    def matrix(data):
        return {name: (entry["verdict"], {c: r["status"] for c, r in entry["clauses"].items()})
                for group in ("implementations", "components") for name, entry in data[group].items()}

    assert matrix(parts) == matrix(whole)
    assert set(matrix(whole)) == {"reference", "ci-unscaled", "attention:sdpa-math"}
    assert matrix(whole)["ci-unscaled"][1] == {"model.shape": "pass", "attention.scale": "unexpected-pass",
                                               "embedding.scale": "fail"}
    assert [json.loads((tmp / f"shard{i}.json").read_text())["shard"] for i in (1, 2)] == ["1/2", "2/2"]


@pytest.mark.slow
def test_the_github_annotations_point_at_the_plugin_file(sharded, capsys):
    tmp, _ = sharded
    assert main(["audit", "--merge", str(tmp / "shard1.json"), str(tmp / "shard2.json"), "--format", "github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    source = (ROOT / PLUGIN).read_text().splitlines()
    at = {ln.split(",title=")[1].split("%3A")[0]: ln.split(" ", 1)[1].split(",title=")[0] for ln in lines
          if ln.startswith("::")}
    assert set(at) == {"ci-unscaled embedding.scale (§3.4)", "ci-unscaled attention.scale (§3.2.1%2C Eq. (1))"}
    fail_line = int(at["ci-unscaled embedding.scale (§3.4)"].split("line=")[1])
    declared_line = int(at["ci-unscaled attention.scale (§3.2.1%2C Eq. (1))"].split("line=")[1])
    assert all(v.startswith(f"file={PLUGIN},") for v in at.values())
    assert source[fail_line - 1].startswith("def build(")
    assert '"attention.scale"' in source[declared_line - 1]
    assert CLAUSES["embedding.scale"].citation == "§3.4"


@pytest.mark.slow
def test_the_merged_html_shows_the_pictures_a_shard_drew(sharded):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    tmp, _ = sharded
    out = tmp / "merged.html"
    assert main(["audit", "--merge", str(tmp / "shard1.json"), str(tmp / "shard2.json"), "--format", "html",
                 "--output", str(out)]) == 1
    page = out.read_text()
    reference, unscaled = page.split('<section id="reference">')[1].split("</section>")[0], \
        page.split('<section id="ci-unscaled">')[1].split("</section>")[0]
    assert reference.count('<img alt="') == 3 and reference.count('src="data:image/png;base64,') == 3
    assert "<img" not in unscaled and "carries no pictures of this implementation" in unscaled

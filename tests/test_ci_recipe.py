"""The CI recipe (examples/github-actions, docs/ci.md): the workflow parses, runs the README's commands, and
each command is one the tools accept."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn_conformance.audit.shards import parse_shard
from aiayn_conformance.cli import build_parser
from aiayn_conformance.spec import CLAUSES

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "github-actions"
WORKFLOW = EXAMPLE / "aiayn-audit.yml"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def run_lines(data: dict) -> dict[str, list[str]]:
    """Per job, the lines of its `run:` steps."""
    return {name: [ln.strip() for step in job["steps"] if "run" in step for ln in step["run"].splitlines()
                   if ln.strip()] for name, job in data["jobs"].items()}


def tool_commands(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith(("aiayn ", "python3 -m pytest "))]


def readme_ci_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Beyond one machine, and in your own CI", 1)[1]
    block = section.split("```", 2)[1]
    return [ln.strip() for ln in block.splitlines() if ln.strip()]


def test_the_workflow_has_a_suite_job_a_shard_matrix_and_a_merging_report_job():
    data = workflow()
    assert data["name"] and set(data[True] if True in data else data["on"]) >= {"push", "pull_request"}
    jobs = data["jobs"]
    assert set(jobs) == {"suite", "audit", "report"}
    shards = jobs["audit"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and jobs["audit"]["strategy"]["fail-fast"] is False
    audit_cmd = next(ln for ln in run_lines(data)["audit"] if ln.startswith("aiayn audit"))
    assert f"--shard ${{{{ matrix.shard }}}}/{len(shards)} " in audit_cmd
    upload = [s for s in jobs["audit"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert upload and upload[0]["with"]["path"] in audit_cmd and upload[0]["if"] == "${{ !cancelled() }}"
    assert jobs["report"]["needs"] == "audit" and jobs["report"]["if"] == "${{ !cancelled() }}"
    download = next(s for s in jobs["report"]["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "audit-*" and download["with"]["merge-multiple"] is True
    published = next(s for s in jobs["report"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert "audit.html" in published["with"]["path"]
    assert any(" -n auto" in ln for ln in run_lines(data)["suite"]), "the suite job runs pytest-xdist"


def test_the_workflow_runs_exactly_the_commands_the_readme_documents():
    ran = [c for lines in run_lines(workflow()).values() for c in tool_commands(lines)]
    assert sorted(set(ran)) == sorted(readme_ci_block())


def test_docs_show_the_workflow_and_the_example_test_file_verbatim():
    doc = (ROOT / "docs" / "ci.md").read_text()
    assert f"```yaml\n{WORKFLOW.read_text()}```" in doc
    assert f"```python\n{(EXAMPLE / 'test_paper_conformance.py').read_text()}```" in doc


def aiayn_argv(command: str, shard: int) -> list[str]:
    words = shlex.split(command.replace("${{ matrix.shard }}", str(shard)))
    return words[1:words.index(">>")] if ">>" in words else words[1:]


@pytest.mark.parametrize("shard", [1, 4])
def test_every_aiayn_command_of_the_workflow_is_accepted(shard):
    parser = build_parser()
    for command in (c for c in readme_ci_block() if c.startswith("aiayn ")):
        args = parser.parse_args(aiayn_argv(command, shard))
        if args.shard:
            assert parse_shard(args.shard).index == shard
        if args.merge:
            assert args.format in ("html", "md", "junit", "github") and not (args.impl or args.shard)


def test_the_suite_command_names_options_the_suite_has():
    suite_cmd = next(c for c in readme_ci_block() if c.startswith("python3 -m pytest"))
    options = {w.split("=")[0] for w in shlex.split(suite_cmd) if w.startswith("--")}
    plugin_src = (ROOT / "conformance" / "plugin.py").read_text()
    ours = {o for o in options if o not in ("--pyargs", "--junitxml")}
    assert ours and all(f'"{o}"' in plugin_src for o in ours), ours
    assert "--pyargs aiayn_conformance.conformance " in suite_cmd


def test_the_example_test_file_collects_one_test_per_clause():
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          str(EXAMPLE / "test_paper_conformance.py")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ids = re.findall(r"test_paper_conformance\[(.+?)\]", res.stdout)
    assert ids == [f"mine-{c}" for c in CLAUSES]

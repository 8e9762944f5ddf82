"""``aiayn export`` reads its targets from ``export.TARGETS``: the ``--format`` choices are the table's names, a
target's options and functions are what the command runs, an unknown target or another target's option is a
one-line usage error (exit 2). And the export modules share their helpers publicly (no private cross-imports)."""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn_conformance import export
from aiayn_conformance.cli import build_parser, main
from aiayn_conformance.export import TARGETS, Target

ROOT = Path(__file__).resolve().parents[1]


def export_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["export"]


def format_action(parser: argparse.ArgumentParser) -> argparse.Action:
    return next(a for a in parser._actions if a.dest == "format")


def test_the_format_choices_are_the_tables_names():
    parser = export_parser()
    action = format_action(parser)
    assert action.metavar == "{" + ",".join(TARGETS) + "}"
    assert action.default == next(iter(TARGETS)) == "onnx"
    assert set(TARGETS) == {"onnx", "ctranslate2"}
    assert all(name == target.name for name, target in TARGETS.items())
    assert all(f"{name}: {target.description}" in action.help for name, target in TARGETS.items())


@dataclass(frozen=True)
class Written:
    ok: bool = True

    def describe(self) -> str:
        return "fake runtime agrees"


def test_the_command_runs_what_the_table_holds(monkeypatch, capsys):
    calls: list[str] = []

    def add_options(parser):
        parser.add_argument("--fake-level", type=int, default=0)

    def export_fake(model, output, config, args, progress):
        calls.append(f"export {type(model).__name__} {output} level {args.fake_level}")
        return "the fake thing"

    def verify_fake(model, output, config, args, progress):
        calls.append("verify")
        return [Written()]

    fake = Target(name="fake", description="a target only this test knows", missing=lambda: "",
                  export=export_fake, verify=verify_fake, add_options=add_options,
                  usage=lambda args: "" if args.fake_level >= 0 else "--fake-level must be >= 0")
    monkeypatch.setitem(TARGETS, "fake", fake)
    assert "fake" in str(format_action(export_parser()).metavar)
    assert main(["export", "--preset", "tiny", "--format", "fake", "--fake-level", "3", "--verify"]) == 0
    assert calls == ["export Transformer logits level 3", "verify"]
    out = capsys.readouterr().out
    assert "wrote the fake thing" in out and "verified: fake runtime agrees" in out
    assert main(["export", "--preset", "tiny", "--format", "fake", "--fake-level", "-1"]) == 2
    assert capsys.readouterr().err == "aiayn export: --fake-level must be >= 0\n"
    # Another target's option with this one, and this one's option with another target: refused, nothing built.
    assert main(["export", "--preset", "tiny", "--format", "fake", "--out", "m.onnx"]) == 2
    assert capsys.readouterr().err == "aiayn export: --format fake does not take --out (options of --format onnx)\n"
    assert main(["export", "--preset", "tiny", "--fake-level", "2", "--out", "m.onnx"]) == 2
    assert capsys.readouterr().err == ("aiayn export: --format onnx does not take --fake-level "
                                       "(options of --format fake)\n")
    monkeypatch.setitem(TARGETS, "fake", Target(name="fake", description="", missing=lambda: "fake is not here",
                                                export=export_fake, verify=verify_fake, add_options=add_options))
    assert main(["export", "--preset", "tiny", "--format", "fake"]) == 2
    assert capsys.readouterr().err == "aiayn export: fake is not here\n"
    assert len(calls) == 2


def test_an_unknown_target_is_one_line_naming_the_known_ones(capsys):
    assert main(["export", "--preset", "tiny", "--format", "tensorrt", "--out", "m.plan"]) == 2
    err = capsys.readouterr().err
    assert err == f"aiayn export: unknown export target 'tensorrt'; known: {', '.join(TARGETS)}\n"


def test_ctranslate2_refuses_the_onnx_options(capsys):
    assert main(["export", "--preset", "tiny", "--format", "ctranslate2", "--out-dir", "d", "--generation"]) == 2
    assert capsys.readouterr().err == ("aiayn export: --format ctranslate2 does not take --generation "
                                       "(options of --format onnx)\n")


def test_no_export_module_imports_another_ones_private_names():
    private = []
    for path in sorted((ROOT / "export").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                private += [f"{path.name}: from .{node.module} import {a.name}" for a in node.names
                            if a.name.startswith("_")]
    assert private == []


@pytest.mark.parametrize("name", list(TARGETS))
def test_each_target_lives_in_its_own_module(name):
    assert getattr(export, name).TARGET is TARGETS[name]

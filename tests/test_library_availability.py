"""Plugins of libraries that are not installed: listed as unavailable with the install command, skipped by the
suite with that reason, reported by the audit; nothing crashes. And a plugin whose declarations were written for
another release of its library still runs, and every report says which release the declarations describe."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from registered import builtin_module, library_module, library_plugins

from aiayn_conformance.implementations import Implementation, Registry, validated
from aiayn_conformance.implementations.availability import INSTALL, installed_version, unavailable_reason, version_note
from aiayn_conformance.reference.model import build as reference_build

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
LIBRARIES = tuple(library_plugins())  # read from the registry
MODULES = tuple(sorted({library_module(name) for name in LIBRARIES}))  # transformers, x_transformers, onmt, ...

# Run a command as if none of the wrapped libraries were installed: their imports fail.
BLOCK = f"""
import importlib.abc, runpy, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocked())
"""


def without_libraries(*args: str, module: str) -> subprocess.CompletedProcess:
    code = BLOCK + f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def builtin_registry_written_for(name: str) -> str:
    """The distribution a library plugin's declarations were written for (its name in the unavailable reason)."""
    from registered import builtin_registry

    return builtin_registry().get(name).written_for.split()[0]


def test_reason_names_the_package_and_the_install_command():
    why = unavailable_reason("no_such_module_xyz", "no-such-dist", at_least="1.0", below="2")
    assert why == f"no-such-dist is not installed (needs no-such-dist>=1.0,<2): {INSTALL}"
    old = unavailable_reason("torch", "torch", at_least="99", below="100")
    assert old.startswith(f"torch {installed_version('torch')} is installed; this plugin needs torch>=99,<100")
    assert unavailable_reason("torch", "torch", at_least="2.0", below="3") == ""


def test_version_note_only_when_the_release_differs():
    assert version_note("") == ""
    assert version_note(f"torch {installed_version('torch')}") == ""
    assert version_note("torch 0.4.1") == f"declarations written for torch 0.4.1; {installed_version('torch')} is " \
                                          "installed"
    assert version_note("no-such-dist 1.0") == "declarations written for no-such-dist 1.0; it is not installed"


@pytest.mark.parametrize("bad", ["transformers", "transformers 5.x", "5.24.0 transformers", "a b c"])
def test_written_for_is_validated(bad):
    with pytest.raises(ValueError, match="written_for .* is not 'DISTRIBUTION VERSION'"):
        validated(Implementation(name="x", build=reference_build, written_for=bad))


def test_unavailable_is_a_string():
    with pytest.raises(ValueError, match="unavailable must be a string"):
        validated(Implementation(name="x", build=reference_build, unavailable=None))  # type: ignore[arg-type]


def test_the_library_plugins_register_without_importing_their_library():
    """Loading the registry (every aiayn and pytest process does) imports none of the wrapped libraries."""
    code = ("import sys; from aiayn_conformance.implementations import Registry; "
            "Registry(entry_points=False, env={}).load(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {MODULES!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_list_shows_the_unavailable_libraries_with_the_install_command():
    text = without_libraries("list", module="aiayn_conformance")
    assert text.returncode == 0, text.stderr
    assert f"{len(LIBRARIES)} unavailable here" in text.stdout
    for name in LIBRARIES:
        line = next(i for i, ln in enumerate(text.stdout.splitlines()) if ln.strip().startswith(name + " "))
        detail = text.stdout.splitlines()[line + 2]
        assert "UNAVAILABLE:" in detail and "is not installed" in detail and "pip install" in detail, detail
    listed = json.loads(without_libraries("list", "--json", module="aiayn_conformance").stdout)
    flags = {i["name"]: i["available"] for i in listed["implementations"]}
    assert not any(flags[n] for n in LIBRARIES) and flags["reference"]
    assert listed["errors"] == []


@pytest.mark.slow
def test_suite_skips_them_with_the_reason_and_runs_the_rest():
    """``--impl=all`` still works (one clause, to keep it short); an explicit name is skipped, not an error; the
    header also shows a version note for a plugin written for another release."""
    run = without_libraries("conformance/", "--impl=all", "--clause=config.parameters", "-rs", "-q", "-p",
                            "no:cacheprovider", f"--plugin={FIXTURES / 'old_release_plugin.py'}", module="pytest")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for name in LIBRARIES:
        assert f"{name} is unavailable: " in run.stdout, run.stdout[-3000:]
    assert re.search(r"\b\d+ passed", run.stdout) and not re.search(r"\b\d+ (failed|error)", run.stdout)
    header = without_libraries("conformance/", "--impl=hf-bart,written-for-old-torch", "--clause=config.parameters",
                               "-p", "no:cacheprovider", f"--plugin={FIXTURES / 'old_release_plugin.py'}",
                               module="pytest")
    assert header.returncode == 0, header.stdout[-3000:]
    assert "unavailable, skipped: transformers is not installed" in header.stdout
    assert f"declarations written for torch 0.4.1; {installed_version('torch')} is installed" in header.stdout


def test_audit_reports_them_unavailable_without_running_the_suite():
    run = without_libraries("audit", "--impl", ",".join(LIBRARIES), "--format", "json", module="aiayn_conformance")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    for name in LIBRARIES:
        subject = report["implementations"][name]
        distribution = builtin_registry_written_for(name)
        assert subject["verdict"].startswith(f"unavailable: {distribution} is not installed"), subject["verdict"]
        assert subject["clauses"] == {} and not subject["conforming"]


def test_export_refuses_them_in_one_line(tmp_path):
    run = without_libraries("export", "--impl", "hf-marian", "--out", str(tmp_path / "m.onnx"),
                            module="aiayn_conformance")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("aiayn export: hf-marian is unavailable here: transformers "
                                                          "is not installed"), run.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_list_notes_a_plugin_written_for_another_release():
    out = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "list", "--plugin", str(FIXTURES / "old_release_plugin.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"note: declarations written for torch 0.4.1; {installed_version('torch')} is installed" in out.stdout


def test_registry_keeps_an_unavailable_registration():
    reg = Registry(entry_points=False, env={}, builtins=(builtin_module("reference"),)).load()
    assert reg.get("reference").unavailable == ""
    impl = validated(Implementation(name="gone", build=reference_build, unavailable="libx is not installed"))
    assert impl.unavailable == "libx is not installed"


def test_another_release_of_a_library_still_runs_with_a_note(monkeypatch):
    """transformers 5.99 installed: hf-marian is still available (5.x), and its declarations say 5.24.0."""
    from aiayn_conformance.implementations import availability
    from aiayn_conformance.implementations.builtins import hf_marian

    monkeypatch.setattr(availability, "installed_version", lambda dist: "5.99.0" if dist == "transformers" else None)
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    assert availability.unavailable_reason("transformers", "transformers", at_least="5.0", below="6") == ""
    assert availability.version_note(hf_marian.WRITTEN_FOR) == "declarations written for transformers 5.24.0; " \
                                                               "5.99.0 is installed"
    monkeypatch.undo()  # the real find_spec again (the stand-in says every module exists); 5.99.0 installed:
    monkeypatch.setattr(availability, "installed_version", lambda dist: "5.99.0" if dist == "transformers" else None)
    pytest.importorskip("transformers")
    impl = Registry(entry_points=False, env={}).load().get("hf-marian")  # registered under the patched release
    assert impl.unavailable == "" and impl.written_for == "transformers 5.24.0"
    from aiayn_conformance.spec.config import TINY

    model = impl.build(TINY).eval()  # it still runs
    src = torch.tensor([[5, 6, 7, 0]])
    assert model(src, torch.tensor([[1, 8, 9]])).shape == (1, 3, TINY.tgt_vocab)
    monkeypatch.setattr(availability, "installed_version", lambda dist: "6.0.0")
    assert availability.unavailable_reason("transformers", "transformers", at_least="5.0", below="6") == (
        f"transformers 6.0.0 is installed; this plugin needs transformers>=5.0,<6: {INSTALL}")

"""One installed namespace (aiayn_conformance), and the import names of 0.1 kept for one release.

Each case runs in a fresh interpreter from a directory outside the checkout, so that only the installed
package is importable, as for a user's plugin.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiayn_conformance._compat import OLD_NAMES, new_name

ROOT = Path(__file__).resolve().parents[1]


def run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_new_names_map_each_old_package():
    assert new_name("spec.config") == "aiayn_conformance.spec.config"
    assert new_name("aiayn.cli") == "aiayn_conformance.cli"
    assert new_name("implementations.fused") == "aiayn_conformance.implementations.builtins.fused"
    assert new_name("implementations.registry") == "aiayn_conformance.implementations.registry"
    assert new_name("torch") is None and new_name("specs") is None
    assert set(OLD_NAMES) == {"spec", "reference", "implementations", "conformance", "export", "aiayn"}


def test_a_plugin_written_for_0_1_imports_and_is_warned(tmp_path):
    """The old names give the very same modules (no second copy of a class) and warn, naming the new import."""
    res = run("""
        import aiayn_conformance
        from implementations import Implementation, hookimpl
        from spec.config import ModelConfig
        import implementations.fused as fused
        import aiayn_conformance.implementations as new
        import aiayn_conformance.spec.config as config
        import aiayn_conformance.implementations.builtins.fused as new_fused
        assert Implementation is new.Implementation and ModelConfig is config.ModelConfig and fused is new_fused
        print("ok")
    """, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert "'implementations' is the import name of aiayn-conformance 0.1; import " \
           "'aiayn_conformance.implementations' instead (the old names are removed in 0.3)" in res.stderr
    assert "import 'aiayn_conformance.implementations.builtins.fused' instead" in res.stderr
    assert "import 'aiayn_conformance.spec.config' instead" in res.stderr
    # the warning points at the plugin's own import line, not at the import machinery
    assert '<string>:3: DeprecationWarning' in res.stderr


def test_a_users_own_module_of_an_old_name_wins(tmp_path):
    """A research repository's own spec.py or export/ shadows nothing of ours and is not shadowed."""
    (tmp_path / "spec.py").write_text("MINE = True\n")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "__init__.py").write_text("MINE = 'package'\n")
    res = run("""
        import aiayn_conformance.implementations  # installs the finder
        import spec, export
        from aiayn_conformance.spec import ModelConfig
        from aiayn_conformance.export import onnx
        assert spec.MINE is True and export.MINE == "package", (spec, export)
        print("ok")
    """, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert "DeprecationWarning" not in res.stderr


def test_nothing_is_installed_at_the_top_level_but_the_namespace():
    """The wheel's top-level packages: aiayn_conformance only (setuptools' package list)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {"aiayn_conformance"}
    assert set(project["tool"]["setuptools"]["package-dir"].values()) == {
        "aiayn_conformance", "spec", "reference", "implementations", "conformance", "export"}
    assert project["project"]["scripts"]["aiayn"] == "aiayn_conformance.cli:main"


@pytest.mark.parametrize("module", ["aiayn_conformance.spec", "aiayn_conformance.reference.model",
                                    "aiayn_conformance.implementations",
                                    "aiayn_conformance.conformance.helpers.harness",
                                    "aiayn_conformance.export", "aiayn_conformance.cli"])
def test_each_part_imports_from_outside_the_checkout(module, tmp_path):
    res = run(f"import {module}; print({module}.__name__)", tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == module, res.stderr
    assert "DeprecationWarning" not in res.stderr


def test_every_sub_package_is_in_the_wheel():
    """setuptools' packages list is explicit (package-dir maps folders): a new sub-package must be named there."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(project["packages"])
    found = set()
    for name, folder in project["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if any((ROOT / folder / part).is_symlink() for part in rel.parents) or (ROOT / folder / rel).is_symlink():
                continue  # aiayn_conformance/spec -> ../spec: the mapped folder itself
            found.add(".".join((name, *rel.parts)))
    assert found == listed, f"in the tree but not in pyproject's packages: {sorted(found - listed)}; " \
                            f"listed but not in the tree: {sorted(listed - found)}"

"""A third-party plugin installed as a distribution is found through the ``aiayn`` entry-point group.

The example package ``examples/aiayn-example-plugin`` is built and installed (offline, no
dependencies fetched) by the running interpreter's own pip and setuptools into a directory of its
own; this interpreter, with that directory on its path, must then list the plugin's implementation
and component, and the suite must run on them, with no ``--plugin`` and no ``AIAYN_PLUGINS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "aiayn-example-plugin"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("AIAYN_PLUGINS", "PYTHONPATH")}


def cannot_build_wheels() -> str | None:
    """Why this interpreter cannot build the example's wheel offline, or None when it can."""
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed (the 'test' extra asks for setuptools>=70.1)"
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
        return "setuptools older than 70.1 has no bdist_wheel and 'wheel' is not installed " \
               "(the 'test' extra asks for setuptools>=70.1)"
    return None


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """An environment for subprocesses of *this* interpreter in which the example plugin is installed.

    Built offline by this interpreter's pip and setuptools into a ``--target`` directory, the
    subprocesses' only PYTHONPATH entry; everything else they import is what this interpreter sees.
    Not a separate virtual environment: that would take its packages from the *base* interpreter.
    Entry points are read from every ``*.dist-info`` on ``sys.path``, so the target directory is as
    real an installation as site-packages.
    """
    if reason := cannot_build_wheels():
        pytest.skip(f"the example plugin cannot be built offline: {reason}")
    work = tmp_path_factory.mktemp("example-plugin")
    source, target = work / "source", work / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(target), str(source)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert list(target.glob("aiayn_example_plugin-*.dist-info")), f"no dist-info installed in {target}"
    return {**clean_env(), "PYTHONPATH": str(target)}


def test_installed_plugin_is_listed(plugin_env):
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "list", "--json"], capture_output=True, text=True,
                         timeout=300, env=plugin_env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    impl = {i["name"]: i for i in data["implementations"]}
    assert impl["example-transformer"]["plugin"] == "example", impl["example-transformer"]
    assert ("attention", "example-sdpa") in {(c["kind"], c["name"]) for c in data["components"]}
    assert data["errors"] == []


def test_not_found_without_the_installation():
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "list", "--json"], capture_output=True, text=True,
                         timeout=300, env=clean_env(), cwd=ROOT)
    names = {i["name"] for i in json.loads(res.stdout)["implementations"]}
    if "example-transformer" in names:
        pytest.skip("the example plugin is installed in this interpreter too")
    assert "reference" in names


def test_suite_runs_on_the_installed_plugin(plugin_env):
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-v", "-p", "no:cacheprovider",
                          "--impl=example-transformer,reference+attention=example-sdpa",
                          "--component=attention:example-sdpa", "--clause=mask.source-padding,attention.scale"],
                         capture_output=True, text=True, timeout=600, env=plugin_env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "implementation under test: example-transformer" in res.stdout
    assert "component under test: attention:example-sdpa" in res.stdout
    for subject in ("[example-transformer]", "[reference+attention=example-sdpa]", "[example-sdpa]"):
        assert subject + " PASSED" in res.stdout, f"no passing test for {subject}:\n{res.stdout[-3000:]}"
    assert "FAILED" not in res.stdout

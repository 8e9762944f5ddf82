"""A third-party plugin installed as a distribution is found through the ``aiayn`` entry-point group.

The example package ``examples/aiayn-example-plugin`` is installed (offline, no dependencies
fetched) into a fresh virtual environment that sees this machine's packages; the registry of
that environment must then list its implementation and component, and the suite must run on them,
with no ``--plugin`` and no ``AIAYN_PLUGINS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "aiayn-example-plugin"


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: the example plugin cannot be built offline")
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    exe = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # The venv has no pip of its own: this interpreter's pip installs into it (pip >= 22.3, --python).
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(exe), "install", "--quiet", "--no-deps",
                          "--no-build-isolation", "--no-index", str(EXAMPLE)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return exe


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("AIAYN_PLUGINS", "PYTHONPATH")}


def test_installed_plugin_is_listed(python):
    res = subprocess.run([str(python), "-m", "aiayn", "list", "--json"], capture_output=True, text=True,
                         timeout=300, env=clean_env(), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    impl = {i["name"]: i for i in data["implementations"]}
    assert impl["example-transformer"]["plugin"] == "example", impl["example-transformer"]
    assert ("attention", "example-sdpa") in {(c["kind"], c["name"]) for c in data["components"]}
    assert data["errors"] == []


def test_not_found_without_the_installation():
    res = subprocess.run([sys.executable, "-m", "aiayn", "list", "--json"], capture_output=True, text=True,
                         timeout=300, env=clean_env(), cwd=ROOT)
    names = {i["name"] for i in json.loads(res.stdout)["implementations"]}
    if "example-transformer" in names:
        pytest.skip("the example plugin is installed in this interpreter too")
    assert "reference" in names


def test_suite_runs_on_the_installed_plugin(python):
    res = subprocess.run([str(python), "-m", "pytest", "conformance/", "-v", "-p", "no:cacheprovider",
                          "--impl=example-transformer,reference+attention=example-sdpa",
                          "--component=attention:example-sdpa", "--clause=mask.source-padding,attention.scale"],
                         capture_output=True, text=True, timeout=600, env=clean_env(), cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "implementation under test: example-transformer" in res.stdout
    assert "component under test: attention:example-sdpa" in res.stdout
    for subject in ("[example-transformer]", "[reference+attention=example-sdpa]", "[example-sdpa]"):
        assert subject + " PASSED" in res.stdout, f"no passing test for {subject}:\n{res.stdout[-3000:]}"
    assert "FAILED" not in res.stdout

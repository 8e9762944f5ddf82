"""device.portable's meta-device check fails a forward that puts a tensor on a device fixed in advance, naming the
tensor and the line, and skips a forward that cannot run there for another reason, naming that reason: one run of
``conformance/test_device.py``'s meta check over ``tests/meta_device_models.py``, the broken model
``broken-constructor-device`` (``tests/broken_models.py``, registered undeclared) and the reference."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "meta_device_models.py"
BROKEN_PLUGIN = ROOT / "tests" / "broken_models.py"
_spec = importlib.util.spec_from_file_location("_meta_device_models_listing", PLUGIN)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
META_MODELS = _module.META_MODELS
CHECK = "test_forward_on_the_meta_device"


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("meta") / "results.json"
    impls = ["reference", "broken-constructor-device"] + [f"meta-{n}" for n in META_MODELS]
    cmd = [sys.executable, "-m", "pytest", "conformance/test_device.py", "-q", "-p", "no:cacheprovider",
           "-k", CHECK, f"--plugin={PLUGIN}", f"--plugin={BROKEN_PLUGIN}", f"--impl={','.join(impls)}",
           f"--results-json={out}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AIAYN_BROKEN_UNDECLARED": "1"})
    assert out.exists(), f"no results (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-2000:]}"
    found = {}
    for rec in json.loads(out.read_text())["tests"]:
        if CHECK in rec["nodeid"]:
            found[rec["subject"].split(":", 1)[1]] = rec
    return found


def test_the_reference_passes(records):
    assert records["reference"]["outcome"] == "passed", records["reference"]


def test_a_mask_moved_to_the_constructors_device_fails_naming_the_move(records):
    rec = records["broken-constructor-device"]
    assert rec["outcome"] == "failed" and rec["clause"] == "device.portable", rec
    for words in ("tensor.to(device(type='cpu')) on a meta tensor", "put a tensor on cpu",
                  "tests/broken_models.py", "tgt_mask.to(self.device)", "Cannot copy out of meta tensor"):
        assert words in rec["detail"], f"{words!r} not in the message:\n{rec['detail']}"


@pytest.mark.parametrize("name", sorted(META_MODELS))
def test_each_model_gets_its_outcome_and_cause(records, name):
    _, outcome, words = META_MODELS[name]
    rec = records[f"meta-{name}"]
    assert rec["outcome"] == outcome and rec["clause"] == "device.portable", rec
    text = rec["detail"] or rec["message"]
    for w in words + ["tests/meta_device_models.py"]:
        assert w in text, f"meta-{name}: {w!r} not in the message:\n{text}"

"""The reference through ``aiayn audit`` at a configuration: shared by tests/test_sizes.py (the paper's sizes) and
tests/test_head_sizes.py (Table 3's row B)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Clauses a CPU-only machine cannot judge (no accelerator to compare with).
NEEDS_ACCELERATOR = {"device.parity"}


def reference_audit(tmp_path: Path, config: str, timeout: int = 3600) -> tuple[dict, dict[str, tuple[str, str]]]:
    """(the reference's record in the audit's JSON, its clauses not passed: {clause: (status, message)}), the
    accelerator's clause left out on a machine without one. Fails the calling test when the audit exits non-zero."""
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance", "audit", "--impl", "reference", "--config", config,
                          "--format", "json", "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    ref = json.loads(out.read_text())["implementations"]["reference"]
    off = {c: (r["status"], r["message"]) for c, r in ref["clauses"].items()
           if r["status"] != "pass" and not (c in NEEDS_ACCELERATOR and r["status"] == "not-judged")}
    return ref, off

"""``--device``: refused in one line where the device is missing; every adapter method crosses ``OnDevice``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn_conformance.cli import main
from aiayn_conformance.conformance.helpers.devices import OnDevice, device_problem
from aiayn_conformance.reference.decoding import generate
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: nothing to refuse")
def test_cuda_is_refused_in_one_line_where_it_is_missing(capsys):
    assert "CUDA is not available here" in device_problem("cuda") and "accepted: cpu, cuda" in device_problem("cuda")
    assert main(["audit", "--impl", "reference", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda: CUDA is not available here" in err
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "--impl=reference", "--device=cuda", "-q",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 4  # pytest's usage error
    assert [ln for ln in res.stderr.splitlines() if ln.strip()] == [
        f"ERROR: {device_problem('cuda')}"], res.stderr


@pytest.mark.parametrize("device, needle", [("mps", "the audit runs on cpu or cuda"), ("gpu", "not a device name")])
def test_other_devices_are_refused_naming_what_is_accepted(device, needle):
    assert needle in device_problem(device) and "accepted: cpu, cuda or cuda:N" in device_problem(device)
    assert device_problem("cpu") == ""


def test_every_method_crosses_the_contract_as_on_the_cpu():
    torch.manual_seed(0)
    inner = Transformer(TINY.replace(max_len=64)).eval()
    wrapped = OnDevice(inner, torch.device("cpu")).eval()
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    tgt = torch.tensor([[1, 4, 5], [1, 6, 0]])
    assert torch.equal(wrapped(src, tgt), inner(src, tgt))
    assert torch.equal(wrapped.encode(src), inner.encode(src))
    assert torch.equal(wrapped.positional_encoding(7), inner.positional_encoding(7))
    state = wrapped.begin_decoding(src)
    scores, state = wrapped.decode_step(state, torch.tensor([1, 1]))
    assert scores.shape == (2, TINY.tgt_vocab) and scores.device.type == "cpu"
    assert torch.equal(generate(wrapped, src, pad_id=0).tokens, generate(inner, src, pad_id=0).tokens)
    assert [n for n, _ in wrapped.named_parameters()] == [f"model.{n}" for n, _ in inner.named_parameters()]


@pytest.mark.slow
def test_the_suite_judges_a_model_behind_on_device_as_the_reference(tmp_path):
    """Every check builds its models through OnDevice under --device: on the CPU it must change no verdict."""
    out = tmp_path / "results.json"
    clauses = "model.shape,model.reference-equivalence,mask.causal,norm.post-norm,decode.incremental,decode.beam," \
              "train.equivalence,train.gradients,dropout.residual"
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "--plugin=tests/on_device_model.py", "--impl=reference-on-device",
                          f"--clause={clauses}", f"--results-json={out}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    outcomes = {(r["clause"], r["outcome"]) for r in json.loads(out.read_text())["tests"]}
    assert {c for c, o in outcomes if o == "passed"} == set(clauses.split(",")), outcomes


class MixesDevices(torch.nn.Module):
    """A forward that fails as a causal mask made on the CPU fails on CUDA (torch's own message)."""

    def forward(self, src, tgt):
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
                           "and cpu!")


def test_recipe_methods_cross_nothing():
    """make_optimizer gets the caller's parameters as they are (a copy to the device would be a non-leaf tensor
    that no optimizer takes) and make_batch's batch stays where the target is."""
    from aiayn_conformance.reference.model import Transformer
    from aiayn_conformance.spec.training import TrainConfig

    inner = Transformer(TINY)
    wrapped = OnDevice(inner, torch.device("cpu"))
    assert wrapped.make_batch == inner.make_batch and wrapped.make_optimizer == inner.make_optimizer
    probe = torch.nn.Parameter(torch.zeros(3))
    assert wrapped.make_optimizer([probe], TrainConfig()).param_groups[0]["params"][0] is probe


def test_a_forward_that_mixes_devices_is_device_portables_finding():
    """On the audit's device a forward that mixes devices blocks the other clauses' checks on device.portable
    (skipped, naming it) and is a failure of device.portable itself; another crash stays the check's own error."""
    from aiayn_conformance.conformance.helpers.harness import ImplementationError, call_forward, checking

    wrapped = OnDevice(MixesDevices(), torch.device("cpu"))
    src, tgt = torch.tensor([[5, 6]]), torch.tensor([[1, 4]])
    with checking("mask.causal"), pytest.raises(pytest.skip.Exception, match="blocked by device.portable: on cpu"):
        call_forward(wrapped, src, tgt)
    with checking("device.portable"), pytest.raises(ImplementationError, match="same device"):
        call_forward(wrapped, src, tgt)
    with checking("mask.causal"), pytest.raises(ImplementationError, match="raised"):
        call_forward(MixesDevices(), src, tgt)  # not on the audit's device: the check's own error


def test_a_check_that_meets_mixed_devices_on_the_audit_device_is_blocked_by_device_portable():
    """The plugin skips any check whose exception, or its cause, is torch refusing to mix devices while the audit
    runs on an accelerator (harness.device_blocking), except device.portable's own checks; on the CPU it does not."""
    from aiayn_conformance.conformance.helpers.harness import ImplementationError, checking, device_blocking
    from aiayn_conformance.conformance.helpers.settings import AuditSettings, using

    mixed = RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
                         "and cpu!")
    wrapped = ImplementationError("[train.learns] could not be checked: training raised")
    wrapped.__cause__ = mixed
    with using(AuditSettings(device="cuda")):
        with checking("train.learns"):
            assert device_blocking(wrapped).startswith("blocked by device.portable: on cuda, RuntimeError: Expected")
            assert device_blocking(ValueError("shapes do not match")) == ""
        with checking("device.portable"):
            assert device_blocking(mixed) == ""
    with using(AuditSettings(device="cpu")), checking("train.learns"):
        assert device_blocking(mixed) == ""


class _ClauseItem:
    """What the plugin's phase wrappers read of a collected check: its clause marker."""

    def __init__(self, clause: str) -> None:
        self.mark = pytest.mark.clause(clause).mark

    def iter_markers(self, name: str):
        return iter([self.mark] if name == "clause" else [])


def _phase_raising(exc: BaseException):
    """A pytest phase (setup or call, as the hook wrapper sees it) whose check raises ``exc``."""
    yield
    raise exc


def test_the_plugin_skips_a_phase_that_meets_mixed_devices_on_the_audit_device():
    """The wrapper around each check's setup and call (plugin._device_blocked) turns an error caused by mixed devices
    on the audit's accelerator into a skip blocked by device.portable, so a fixture's build or a training run that
    crashes there is not an error of its own clause; device.portable's checks, another exception and a CPU audit keep
    the exception."""
    from aiayn_conformance.conformance.helpers.harness import ImplementationError, checking
    from aiayn_conformance.conformance.helpers.settings import AuditSettings, using
    from aiayn_conformance.conformance.plugin import _device_blocked

    def wrapped() -> ImplementationError:
        exc = ImplementationError("[train.learns] could not be checked: training raised")
        exc.__cause__ = RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                     "cuda:0 and cpu!")
        return exc

    def run(clause: str, exc: BaseException) -> None:
        phase = _device_blocked(_ClauseItem(clause), _phase_raising(exc))
        next(phase)  # the wrapper yields to pytest, which runs the phase
        phase.send(None)

    with using(AuditSettings(device="cuda")):
        with checking("train.learns"), pytest.raises(pytest.skip.Exception,
                                                     match="^blocked by device.portable: on cuda, RuntimeError"):
            run("train.learns", wrapped())
        with checking("train.learns"), pytest.raises(ValueError, match="shapes"):
            run("train.learns", ValueError("shapes do not match"))
        with checking("device.portable"), pytest.raises(ImplementationError):
            run("device.portable", wrapped())
    with using(AuditSettings(device="cpu")), checking("train.learns"), pytest.raises(ImplementationError):
        run("train.learns", wrapped())

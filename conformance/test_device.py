"""Devices and dtypes: device.portable everywhere, device.parity where an accelerator exists."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import compare

from .helpers import devices, settings
from .helpers.harness import (
    CheckTimeout,
    ImplementationError,
    build_model,
    could_not_check,
    describe_call,
    first_line,
    run_forward,
    violation,
)
from .helpers.inputs import witness_batch
from .helpers.outputs import compare_real, log_probs


def plain_tensor_attributes(model: torch.nn.Module) -> list[str]:
    """Tensors stored as plain attributes: ``module.to(device)`` does not move them."""
    found = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.numel() > 1:
                found.append(f"{name + '.' if name else ''}{attr} {list(value.shape)}")
    return found


@pytest.mark.clause("device.portable")
def test_no_tensor_is_left_behind_by_to(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config, place=False)
    stranded = plain_tensor_attributes(model)
    if stranded:
        violation(measured=f"tensors kept as plain attributes: {', '.join(stranded[:4])}",
                  expected="every tensor the model uses is a parameter or a registered buffer, so .to(device) and "
                           ".half() move it", call=f"{impl.name}.build(config); vars() of every sub-module",
                  hint="self.register_buffer('pe', table, persistent=False) instead of self.pe = table")


# Factory functions: a tensor they make lands on their device= argument, or on the default device (the CPU) without it.
FACTORIES = {"tensor", "as_tensor", "ones", "zeros", "full", "empty", "arange", "eye", "linspace", "rand", "randn",
             "randint", "randperm", "tril_indices", "triu_indices", "from_numpy"}
# Errors that say a tensor was on another device than the meta inputs: the forward moved or made one there.
DEVICE_ERRORS = ("cannot copy out of meta tensor", *devices.DEVICE_ERRORS)
_HERE = (__file__.rsplit(".", 1)[0], "/torch/", "/contextlib.py", "/unittest/mock.py")


def _raised(exc: BaseException) -> tuple[str, str]:
    """(the first line of ``exc``'s message, 'Type: that line (raised at the model's frame)')."""
    text = first_line(exc)[:200]
    return text, f"{type(exc).__name__}: {text} (raised at {_caller(traceback.extract_tb(exc.__traceback__))})"


def _caller(frames: list[traceback.FrameSummary]) -> str:
    """'file:line in function: code' of the innermost frame outside torch and this module (the model's code)."""
    for frame in reversed(frames):
        if not any(part in frame.filename for part in _HERE):
            code = (frame.line or "").split("  #")[0].strip()  # the statement, without a trailing comment
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {code[:120]}"
    return "inside torch"


@dataclass
class Placement:
    """A tensor the forward moved off the meta device or made on a fixed device, and where."""

    what: str
    device: str
    where: str

    def describe(self) -> str:
        return f"{self.what} put a tensor on {self.device} (at {self.where})"


class PlacementRecorder(TorchFunctionMode):
    """Records, during a forward on the meta device, every tensor copied from a meta tensor to another device
    (``.to(device)``, ``.cpu()``, ``.cuda()``) and every tensor of one or more dimensions a factory function
    made on another device (``device='cpu'``, or no ``device=`` and the CPU default)."""

    def __init__(self) -> None:
        super().__init__()
        self.placements: list[Placement] = []

    def _note(self, what: str, device: Any) -> None:
        self.placements.append(Placement(what, str(device), _caller(traceback.extract_stack()[:-2])))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        this = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if this is not None and this.is_meta and name in ("to", "cpu", "cuda"):
            target: Any = "cpu" if name == "cpu" else "cuda" if name == "cuda" else None
            if name == "to":
                with contextlib.suppress(Exception):
                    target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            if target is not None and torch.device(target).type != "meta":
                arg = ", ".join([repr(a) if not isinstance(a, torch.Tensor) else f"tensor on {a.device}"
                                 for a in args[1:]] + [f"{k}={v!r}" for k, v in kwargs.items()])
                self._note(f"tensor.{name}({arg}) on a meta tensor {list(this.shape)}", target)
        out = func(*args, **kwargs)
        if (name in FACTORIES or name.endswith("_like")) and isinstance(out, torch.Tensor) and not out.is_meta \
                and out.dim() > 0:
            given = kwargs.get("device")
            how = f"device={given!r}" if given is not None else "no device= (the default device)"
            self._note(f"torch.{name}(..., {how}) {list(out.shape)}", out.device)
        return out


@pytest.mark.clause("device.portable")
def test_forward_on_the_meta_device(impl: Implementation, config: ModelConfig) -> None:
    """module.to('meta') and meta inputs: a tensor met on the CPU was left behind, created in forward on a fixed
    device (torch.ones(T, T) for the causal mask, device=self.device captured at construction) or moved there
    (.to(self.device), .cpu(), .cuda()). A forward that cannot run on the meta device for another reason (an
    operation without a meta kernel, data-dependent control flow) skips, naming the cause and where it arose."""
    model = build_model(impl, config, place=False).to("meta")
    src, tgt = witness_batch(config)
    recorder = PlacementRecorder()
    try:
        with torch.no_grad(), recorder:
            model(src.to("meta"), tgt.to("meta"))
    except CheckTimeout:
        raise
    except Exception as exc:
        text, raised = _raised(exc)
        lowered = text.lower()
        # Copying a meta tensor out is this clause's finding when the forward moved one to a device; .tolist() or
        # .numpy() (data the meta device does not have) raise the same error and are not.
        copied_out = "cannot copy out of meta tensor" in lowered
        mismatch = any(e in lowered for e in DEVICE_ERRORS[1:]) or (
            "meta" in lowered and ("cpu" in lowered or "device" in lowered) and not copied_out
            and "could not run" not in lowered)
        stranded = plain_tensor_attributes(model)
        if mismatch or copied_out and any(p.what.startswith("tensor.") for p in recorder.placements):
            copies = [p for p in recorder.placements if p.what.startswith("tensor.")]
            candidates = copies if copied_out else recorder.placements
            first = candidates[0] if candidates else None
            violation(measured=(f"the forward on the meta device: {first.describe()}; then {raised}" if first
                                else f"forward on the meta device met a tensor on another device: {raised}")
                      + (f"; {len(recorder.placements) - 1} more such tensor(s)" if len(recorder.placements) > 1
                         else "")
                      + (f"; plain tensor attributes: {', '.join(stranded[:3])}" if stranded else ""),
                      expected="every tensor follows module.to(device); tensors made in forward use the input's "
                               "device, and nothing is moved to a device fixed in advance",
                      call=f"{impl.name}.to('meta')(src.to('meta'), tgt.to('meta'))",
                      hint="create masks with device=src.device (torch.ones(T, T, device=...)); do not move tensors "
                           "to a device saved at construction (.to(self.device)), .cpu() or .cuda() in forward; "
                           "register tables as buffers")
        pytest.skip(f"the model cannot run on the meta device for a reason other than a tensor's device ({raised}); "
                    "device.portable is judged by the other checks")


@pytest.mark.clause("device.portable")
def test_forward_runs_on_the_audit_device(impl: Implementation, config: ModelConfig) -> None:
    """On the audit's device (``--device cuda``) the model, moved there, runs the witness without mixing devices
    (the checks of the other clauses skip as blocked by this one where it does not). On the CPU there is no other
    device to meet: the meta-device check stands in."""
    device = settings.current().device
    if torch.device(device).type == "cpu":
        pytest.skip("the audit runs on the CPU (--device cpu): the meta-device check judges portability instead")
    model = build_model(impl, config)
    src, tgt = witness_batch(config)
    try:
        with torch.no_grad():
            model(src, tgt)
    except CheckTimeout:
        raise
    except Exception as exc:
        _, raised = _raised(exc)
        if not devices.is_device_error(exc):
            could_not_check(f"{describe_call(src, tgt, config.pad_id)} on {device} raised", exc)
        violation(measured=f"moved to {device}, the forward mixes devices: {raised}",
                  expected="every tensor follows module.to(device); tensors made in forward use the input's device",
                  call=f"{impl.name}.to({device!r})({describe_call(src, tgt, config.pad_id)} on {device})",
                  hint="create masks with device=src.device; do not keep tensors as plain attributes or move them "
                       "to a device saved at construction")


@pytest.mark.clause("device.portable")
def test_float64_agrees_with_float32(impl: Implementation, config: ModelConfig) -> None:
    """The same model after model.double(): a crash there (in the conversion or in the forward after it) is this
    clause's failure, not an unchecked clause, since running in another dtype is the property under test."""
    model = build_model(impl, config, place=False)
    src, tgt = witness_batch(config)
    a = log_probs(model, impl, src, tgt, config)
    call = f"{describe_call(src, tgt, config.pad_id)} in float32, then after model.double()"
    try:
        model64 = model.double()
        b = log_probs(model64, impl, src, tgt, config)
    except CheckTimeout:
        raise
    except Exception as exc:  # ImplementationError included: the forward after the conversion crashed
        error = (exc.reason or str(exc)) if isinstance(exc, ImplementationError) else f"{type(exc).__name__}: {exc}"
        violation(measured=f"after model.double(): {error.strip().splitlines()[0][:300]}",
                  expected="the model converts to float64 and runs there", call=call,
                  hint="a tensor kept or cast to a fixed dtype (x.float(), torch.float32 tables or masks, a norm "
                       "computed in float32 and not cast back to the input's dtype)")
    cmp = compare_real(a, b, tgt, config.pad_id, kind=impl.output)
    if not cmp.ok:
        violation(measured=f"float64 differs from float32 beyond rounding: {cmp.describe()}",
                  expected="float64 and float32 agree within the float32 model tolerance",
                  call=call,
                  hint="a table or mask kept in float32 and mixed in, or a finite mask fill that depends on dtype")


def accelerators() -> list[str]:
    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


@contextlib.contextmanager
def tf32_off(device: str) -> Iterator[None]:
    """TF32 matmuls and convolutions off on CUDA while open (float32 means float32), restored afterwards."""
    if device != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def gradients(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient (None where it got none) after one backward pass of a scalar loss."""
    model.zero_grad()
    with torch.random.fork_rng(devices=[]):
        out = model(src, tgt)
    out.float().logsumexp(-1).mean().backward()
    return {n: (p.grad.detach().cpu() if p.grad is not None else None) for n, p in model.named_parameters()}


@pytest.mark.clause("device.parity")
@pytest.mark.parametrize("device", accelerators() or [pytest.param("none", marks=pytest.mark.skip(
    reason="no CUDA or MPS device on this machine: CPU/accelerator parity cannot be checked here"))])
def test_accelerator_matches_cpu(impl: Implementation, device: str, config: ModelConfig) -> None:
    cfg = config.replace(dropout=0.0)  # the training step below must be deterministic
    with tf32_off(device):
        model = build_model(impl, cfg, place=False)
        accel = build_model(impl, cfg, place=False)
        accel.load_state_dict(model.state_dict())
        accel = accel.to(device)
        src, tgt = witness_batch(config)
        a = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
        b = run_forward(accel, src.to(device), tgt.to(device), vocab=config.tgt_vocab, pad_id=config.pad_id)
        cmp = compare_real(torch.log_softmax(a.double(), -1), torch.log_softmax(b.cpu().double(), -1), tgt,
                           config.pad_id)
        if not cmp.ok:
            violation(measured=f"{device} differs from CPU: {cmp.describe()}",
                      expected="the same outputs within the float32 model tolerance (TF32 off)",
                      call=f"{describe_call(src, tgt, config.pad_id)} on cpu and {device}",
                      hint="device-dependent kernels or masks")
        on_cpu = gradients(model.train(), src, tgt)
        on_device = gradients(accel.train(), src.to(device), tgt.to(device))
    call = "one training step (dropout off): logsumexp of the outputs, backward()"
    one_sided = [n for n in on_cpu if (on_cpu[n] is None) != (on_device.get(n) is None)]
    if one_sided:
        n = one_sided[0]
        has, lacks = ("cpu", device) if on_cpu[n] is not None else (device, "cpu")
        violation(measured=f"{len(one_sided)} parameter(s) get a gradient on {has} but none on {lacks}, e.g. {n}",
                  expected="the same parameters get gradients on every device", call=call,
                  hint="a device-dependent code path (a fused kernel, or a branch on the device type)")
    compared = [(n, g, d) for n, g in on_cpu.items() if g is not None and (d := on_device.get(n)) is not None]
    if not compared:
        pytest.skip("no parameter gets a gradient on either device, so there are no gradients to compare "
                    "(train.gradients judges that)")
    for name, g_cpu, g_dev in compared:
        if not compare(g_dev, g_cpu, dtype=torch.float32, scope="model").ok:
            violation(measured=f"gradient of {name} differs between cpu and {device}",
                      expected="the same gradients within tolerance", call=call,
                      hint="device-dependent backward kernels")

"""Devices and dtypes: device.portable everywhere, device.parity where an accelerator exists."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import compare

from .helpers.harness import CheckTimeout, ImplementationError, build_model, describe_call, run_forward, violation
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


@pytest.mark.clause("device.portable")
def test_forward_on_the_meta_device(impl: Implementation, config: ModelConfig) -> None:
    """module.to('meta') and meta inputs: a tensor met on the CPU was left behind or created in forward
    without the input's device (e.g. torch.ones(T, T) for the causal mask)."""
    model = build_model(impl, config, place=False).to("meta")
    src, tgt = witness_batch(config)
    try:
        with torch.no_grad():
            model(src.to("meta"), tgt.to("meta"))
    except (NotImplementedError, RuntimeError) as exc:
        text = str(exc)
        if "meta" in text and ("cpu" in text.lower() or "device" in text.lower()):
            stranded = plain_tensor_attributes(model)
            violation(measured=f"forward on the meta device met a CPU tensor: "
                      f"{text.strip().splitlines()[0][:200]}"
                      + (f"; plain tensor attributes: {', '.join(stranded[:3])}" if stranded else ""),
                      expected="every tensor follows module.to(device); tensors made in forward use the input's device",
                      call=f"{impl.name}.to('meta')(src.to('meta'), tgt.to('meta'))",
                      hint="pass device=src.device when creating masks (torch.ones(T, T, device=...)), register "
                           "tables as buffers")
        pytest.skip(f"the model cannot run on the meta device ({text.strip().splitlines()[0][:120]}); "
                    "device.portable is judged by the other checks")


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

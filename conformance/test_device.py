"""Devices and dtypes: device.portable everywhere, device.parity where an accelerator exists."""

from __future__ import annotations

import pytest
import torch

from spec.tolerance import compare

from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, witness_batch
from .probes import compare_real, log_probs

PAD = CONFIG.pad_id


def plain_tensor_attributes(model: torch.nn.Module) -> list[str]:
    """Tensors stored as plain attributes: ``module.to(device)`` does not move them."""
    found = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.numel() > 1:
                found.append(f"{name + '.' if name else ''}{attr} {list(value.shape)}")
    return found


@pytest.mark.clause("device.portable")
def test_no_tensor_is_left_behind_by_to(impl):
    model = build_model(impl, CONFIG, "device.portable")
    stranded = plain_tensor_attributes(model)
    if stranded:
        violation("device.portable", measured=f"tensors kept as plain attributes: {', '.join(stranded[:4])}",
                  expected="every tensor the model uses is a parameter or a registered buffer, so .to(device) and "
                           ".half() move it", call=f"{impl.name}.build(config); vars() of every sub-module",
                  hint="self.register_buffer('pe', table, persistent=False) instead of self.pe = table")


@pytest.mark.clause("device.portable")
def test_forward_on_the_meta_device(impl):
    """module.to('meta') and meta inputs: a tensor met on the CPU was left behind or created in forward
    without the input's device (e.g. torch.ones(T, T) for the causal mask)."""
    model = build_model(impl, CONFIG, "device.portable").to("meta")
    src, tgt = witness_batch()
    try:
        with torch.no_grad():
            model(src.to("meta"), tgt.to("meta"))
    except (NotImplementedError, RuntimeError) as exc:
        text = str(exc)
        if "meta" in text and ("cpu" in text.lower() or "device" in text.lower()):
            stranded = plain_tensor_attributes(model)
            violation("device.portable", measured=f"forward on the meta device met a CPU tensor: "
                      f"{text.strip().splitlines()[0][:200]}"
                      + (f"; plain tensor attributes: {', '.join(stranded[:3])}" if stranded else ""),
                      expected="every tensor follows module.to(device); tensors made in forward use the input's device",
                      call=f"{impl.name}.to('meta')(src.to('meta'), tgt.to('meta'))",
                      hint="pass device=src.device when creating masks (torch.ones(T, T, device=...)), register "
                           "tables as buffers")
        pytest.skip(f"the model cannot run on the meta device ({text.strip().splitlines()[0][:120]}); "
                    "device.portable is judged by the other checks")


@pytest.mark.clause("device.portable")
def test_float64_agrees_with_float32(impl):
    model = build_model(impl, CONFIG, "device.portable")
    src, tgt = witness_batch()
    a = log_probs(model, impl, src, tgt, "device.portable", CONFIG)
    try:
        model64 = model.double()
    except Exception as exc:  # pragma: no cover - nn.Module.double() does not raise for plain modules
        violation("device.portable", measured=f"model.double() raised {type(exc).__name__}: {exc}",
                  expected="the model converts to float64", call=f"{impl.name}.double()", hint="")
    b = log_probs(model64, impl, src, tgt, "device.portable", CONFIG)
    cmp = compare_real(a, b, tgt, PAD)
    if not cmp.ok:
        violation("device.portable", measured=f"float64 differs from float32 beyond rounding: {cmp.describe()}",
                  expected="float64 and float32 agree within the float32 model tolerance",
                  call=f"{describe_call(src, tgt, PAD)} in float32, then after model.double()",
                  hint="a table or mask kept in float32 and mixed in, or a finite mask fill that depends on dtype")


def accelerators() -> list[str]:
    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


@pytest.mark.clause("device.parity")
@pytest.mark.parametrize("device", accelerators() or [pytest.param("none", marks=pytest.mark.skip(
    reason="no CUDA or MPS device on this machine: CPU/accelerator parity cannot be checked here"))])
def test_accelerator_matches_cpu(impl, device):
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cfg = CONFIG.replace(dropout=0.0)  # the training step below must be deterministic
    model = build_model(impl, cfg, "device.parity")
    accel = build_model(impl, cfg, "device.parity")
    accel.load_state_dict(model.state_dict())
    accel = accel.to(device)
    src, tgt = witness_batch()
    a = run_forward(model, src, tgt, "device.parity", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    b = run_forward(accel, src.to(device), tgt.to(device), "device.parity", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    cmp = compare_real(torch.log_softmax(a.double(), -1), torch.log_softmax(b.cpu().double(), -1), tgt, PAD)
    if not cmp.ok:
        violation("device.parity", measured=f"{device} differs from CPU: {cmp.describe()}",
                  expected="the same outputs within the float32 model tolerance (TF32 off)",
                  call=f"{describe_call(src, tgt, PAD)} on cpu and {device}", hint="device-dependent kernels or masks")
    model.train()
    accel.train()
    grads = []
    for m, dev in ((model, "cpu"), (accel, device)):
        m.zero_grad()
        with torch.random.fork_rng(devices=[]):
            out = m(src.to(dev), tgt.to(dev))
        out.float().logsumexp(-1).mean().backward()
        grads.append({n: p.grad.detach().cpu() for n, p in m.named_parameters() if p.grad is not None})
    for name, g in grads[0].items():
        if name in grads[1] and not compare(grads[1][name], g, dtype=torch.float32, scope="model").ok:
            violation("device.parity", measured=f"gradient of {name} differs between cpu and {device}",
                      expected="the same gradients within tolerance", call="one training step (dropout off)",
                      hint="device-dependent backward kernels")

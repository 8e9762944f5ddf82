"""train.gradients (§5): every parameter learns from a loss on a padded batch."""

from __future__ import annotations

import pytest
import torch

from implementations import Implementation

from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, witness_batch

PAD = CONFIG.pad_id


def differentiable_log_probs(out: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "logits":
        return torch.log_softmax(out, dim=-1)
    if kind == "probs":
        return torch.log(out.clamp_min(1e-30))
    return out


@pytest.mark.clause("train.gradients")
def test_every_parameter_gets_a_finite_nonzero_gradient(impl: Implementation) -> None:
    model = build_model(impl, CONFIG.replace(dropout=0.0), train=True)
    src, tgt = witness_batch()
    labels = torch.roll(tgt, shifts=-1, dims=1).masked_fill(tgt == PAD, -100)  # next tokens; pads ignored
    out = run_forward(model, src, tgt, vocab=CONFIG.tgt_vocab, pad_id=PAD, grad=True)
    logp = differentiable_log_probs(out.float(), impl.output)
    loss = torch.nn.functional.nll_loss(logp.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    call = f"NLL of the next token at real positions of {describe_call(src, tgt, PAD)}, backward()"
    missing, nonfinite, zero = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            missing.append(name)
        elif not bool(torch.isfinite(p.grad).all()):
            nonfinite.append(name)
        elif not bool((p.grad != 0).any()):
            zero.append(name)
    if nonfinite:
        violation(measured=f"non-finite gradients in {', '.join(nonfinite[:5])}",
                  expected="finite gradients for every parameter", call=call,
                  hint="NaN from fully masked softmax rows or an overflowing mask constant")
    if missing or zero:
        names = ", ".join((missing + zero)[:6]) + (" ..." if len(missing + zero) > 6 else "")
        violation(measured=f"{len(missing)} parameter(s) get no gradient and {len(zero)} an "
                  f"all-zero gradient: {names}", expected="every parameter takes part in the computation",
                  call=call, hint="a module built but never called (e.g. a layer norm that is defined but another "
                                  "one reused), or a path cut by detach()")

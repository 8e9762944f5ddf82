"""ONNX export and onnxruntime against PyTorch eager, for the reference model.

For each preset (default: base, Table 3): export time (``export_onnx``: dynamo, dynamic batch and
lengths, ``onnx.checker``) and file size; ``verify`` on shapes other than the export example; one
eval forward (source and target length 32) at batch 1 and batch 8 in onnxruntime (CPU provider)
and in PyTorch eager under ``torch.no_grad``, median of the repeats, and their ratio (target:
onnxruntime at or below 0.7 times eager at batch 1); greedy decoding of 32 new tokens for a batch of
1 source sentence of length 32 entirely in onnxruntime (encoder + decoder-step graphs) and with
the reference's ``greedy_decode``, as tokens per second, and whether both emit the same tokens.

Usage: ``python -m benchmarks.onnx_bench [--presets base,small] [--repeats N]`` (``small``: see ``benchmarks.perf``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

TARGET_RATIO_B1 = 0.7
LENGTH = 32
NEW_TOKENS = 32


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(preset: str, repeats: int) -> list[str]:
    import torch

    from aiayn_conformance.export.common import session
    from aiayn_conformance.export.onnx import (
        export_generation,
        export_onnx,
        ort_greedy_decode,
        torch_greedy_decode,
        verify,
    )
    from aiayn_conformance.implementations import get_registry
    from benchmarks.perf import config_for

    cfg = config_for(preset, 128)
    torch.manual_seed(0)
    model = get_registry().get("reference").build(cfg).eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        t0 = time.perf_counter()
        export_onnx(model, path, cfg)
        export_s = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20
        check = verify(path, model, cfg)
        sess = session(path)
        rows.append(f"- {preset}: export {export_s:.1f} s, {size:.0f} MiB; onnxruntime agrees with PyTorch: "
                    f"{'yes' if check.ok else 'NO'} ({check.describe()})")
        g = torch.Generator().manual_seed(1)
        for batch in (1, 8):
            src = torch.randint(1, cfg.src_vocab, (batch, LENGTH), generator=g)
            tgt = torch.randint(1, cfg.tgt_vocab, (batch, LENGTH), generator=g)
            feeds = {"src": src.numpy(), "tgt": tgt.numpy()}

            def eager(src=src, tgt=tgt):
                with torch.no_grad():
                    model(src, tgt)

            ort_s = _median_s(lambda feeds=feeds: sess.run(None, feeds), repeats)
            pt_s = _median_s(eager, repeats)
            ratio = ort_s / pt_s
            verdict = ""
            if batch == 1:
                verdict = (f" (target <= {TARGET_RATIO_B1}: met)" if ratio <= TARGET_RATIO_B1 else
                           f" (target <= {TARGET_RATIO_B1}: missed by {ratio - TARGET_RATIO_B1:.2f})")
            rows.append(f"- {preset}, one forward, batch {batch}, lengths {LENGTH}: onnxruntime {ort_s * 1e3:.1f} ms, "
                        f"eager {pt_s * 1e3:.1f} ms, ratio {ratio:.2f}{verdict}")
        gen = Path(tmp) / "gen"
        t0 = time.perf_counter()
        enc, dec = export_generation(model, gen, cfg)
        gen_export_s = time.perf_counter() - t0
        src = torch.randint(1, cfg.src_vocab, (1, LENGTH), generator=g)
        # eos_id = -1: never emitted, so both decoders produce exactly NEW_TOKENS tokens.
        kw = dict(bos_id=1, eos_id=-1, max_new_tokens=NEW_TOKENS)
        ort_tokens = ort_greedy_decode(enc, dec, src, pad_id=cfg.pad_id, **kw)
        with torch.no_grad():
            pt_tokens = torch_greedy_decode(model, src, **kw)
        same = torch.equal(ort_tokens, pt_tokens)
        ort_s = _median_s(lambda: ort_greedy_decode(enc, dec, src, pad_id=cfg.pad_id, **kw), max(1, repeats // 2))

        def pt_decode():
            with torch.no_grad():
                torch_greedy_decode(model, src, **kw)

        pt_s = _median_s(pt_decode, max(1, repeats // 2))
        rows.append(f"- {preset}, greedy decoding ({NEW_TOKENS} tokens, batch 1, source length {LENGTH}; "
                    f"generation export {gen_export_s:.1f} s): onnxruntime {NEW_TOKENS / ort_s:.1f} tokens/s, "
                    f"eager {NEW_TOKENS / pt_s:.1f} tokens/s; same tokens: {'yes' if same else 'NO'}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.onnx_bench", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--presets", default="base")
    args = p.parse_args(argv)
    for preset in args.presets.split(","):
        for row in bench(preset.strip(), args.repeats):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

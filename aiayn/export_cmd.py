"""``aiayn export``: write an implementation to ONNX, optionally verified by onnxruntime.

    aiayn export --impl reference --preset base --out model.onnx [--verify]
    aiayn export --impl reference --preset tiny --generation --out-dir onnx/ [--verify]
"""

from __future__ import annotations

import argparse
import sys
import time

from implementations import PluginError, UnknownNameError, get_registry
from spec import preset


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export an implementation to ONNX (and verify it with onnxruntime)")
    p.add_argument("--impl", default="reference", help="a registered implementation (default: reference)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH", help="load an extra plugin")
    p.add_argument("--preset", default="base", help="configuration preset: base, big or tiny (default: base)")
    p.add_argument("--out", default=None, help="output .onnx file (forward(src, tgt) -> scores)")
    p.add_argument("--generation", action="store_true",
                   help="export encoder.onnx and decoder.onnx for greedy decoding instead (needs --out-dir)")
    p.add_argument("--out-dir", default=None, help="output folder for --generation")
    p.add_argument("--verify", action="store_true",
                   help="compare onnxruntime with PyTorch (other shapes; greedy tokens with --generation)")
    p.set_defaults(func=run)


def _say(message: str) -> None:
    print(f"aiayn export: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        config = preset(args.preset)
        impl = get_registry(args.plugin).get(args.impl)
    except (ValueError, PluginError, UnknownNameError) as exc:
        _say(str(exc))
        return 2
    if impl.unavailable:
        _say(f"{impl.name} is unavailable here: {impl.unavailable}")
        return 2
    if args.generation and not args.out_dir:
        _say("--generation needs --out-dir DIR (it writes encoder.onnx and decoder.onnx)")
        return 2
    if not args.generation and not args.out:
        _say("--out PATH is required (or --generation --out-dir DIR)")
        return 2
    try:
        import export
    except ImportError as exc:
        _say(f"the onnx extra is not installed ({exc}); pip install 'aiayn-conformance[onnx]'")
        return 2
    from export import ExportError

    started = time.perf_counter()
    try:
        model, _ = export.resolve_model(impl, config)
        if args.generation:
            enc, dec = export.export_generation(model, args.out_dir, config, progress=_say)
            print(f"wrote {enc} and {dec}")
            if args.verify:
                _say("verifying greedy decoding in onnxruntime against PyTorch ...")
                check = export.verify_generation(enc, dec, model, config)
                print(("verified: " if check.ok else "MISMATCH: ") + check.describe())
                if not check.ok:
                    return 1
        else:
            path = export.export_onnx(model, args.out, config, progress=_say)
            print(f"wrote {path}")
            if args.verify:
                _say("verifying with onnxruntime on other shapes ...")
                result = export.verify(path, model, config)
                print(("verified: " if result.ok else "MISMATCH: ") + result.describe())
                if not result.ok:
                    return 1
    except ExportError as exc:
        _say(str(exc))
        return 1
    _say(f"done in {time.perf_counter() - started:.1f} s")
    return 0

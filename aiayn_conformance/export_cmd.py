"""``aiayn export``: write an implementation to ONNX or CTranslate2, optionally verified by its runtime.

    aiayn export --impl reference --preset base --out model.onnx [--verify]
    aiayn export --impl reference --preset tiny --generation --out-dir onnx/ [--verify]             (KV cache)
    aiayn export --impl reference --preset tiny --generation --no-cache --out-dir onnx/ [--verify]  (full prefix)
    aiayn export --format ctranslate2 --impl reference --preset tiny --out-dir ct2/ [--verify]
"""

from __future__ import annotations

import argparse
import sys
import time

from aiayn_conformance.implementations import PluginError, UnknownNameError, get_registry
from aiayn_conformance.spec import preset


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export an implementation to ONNX or CTranslate2 (and verify it)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="reference", help="a registered implementation (default: reference)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH", help="load an extra plugin")
    p.add_argument("--preset", default="base", help="configuration preset: base, big or tiny (default: base)")
    p.add_argument("--format", choices=("onnx", "ctranslate2"), default="onnx",
                   help="onnx (default) or ctranslate2 (a TransformerSpec model folder; needs --out-dir and the "
                        "ctranslate2 extra)")
    p.add_argument("--out", default=None, help="output .onnx file (forward(src, tgt) -> scores)")
    p.add_argument("--generation", action="store_true",
                   help="export graphs for decoding instead of forward (needs --out-dir): by default an encoder "
                        "computing the cross-attention keys/values and a decoder step with the key/value cache as "
                        "inputs and outputs")
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                   help="with --generation: the key/value-cache step (encoder_kv.onnx, decoder_step.onnx, "
                        "generation.json; default) or, with --no-cache, the full-prefix step (encoder.onnx, "
                        "decoder.onnx), which reruns the decoder over the whole prefix at every step")
    p.add_argument("--out-dir", default=None, help="output folder for --generation and --format ctranslate2")
    p.add_argument("--verify", action="store_true",
                   help="compare the runtime with PyTorch: other shapes for forward; whole greedy and beam "
                        "decodings (tokens and per-step log-probabilities) for --generation; greedy tokens and "
                        "per-step logits for ctranslate2")
    p.set_defaults(func=run)


def _say(message: str) -> None:
    print(f"aiayn export: {message}", file=sys.stderr, flush=True)


def _print_checks(checks) -> bool:
    ok = True
    for check in checks:
        print(("verified: " if check.ok else "MISMATCH: ") + check.describe(), flush=True)
        ok = ok and check.ok
    return ok


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
    if args.format == "ctranslate2":
        if not args.out_dir:
            _say("--format ctranslate2 needs --out-dir DIR (it writes a CTranslate2 model folder)")
            return 2
        if args.out or args.generation:
            _say("--format ctranslate2 takes --out-dir only (a CTranslate2 model is always a generation model)")
            return 2
    elif args.generation and not args.out_dir:
        _say("--generation needs --out-dir DIR (it writes the encoder and decoder-step graphs)")
        return 2
    elif not args.generation and not args.out:
        _say("--out PATH is required (or --generation --out-dir DIR)")
        return 2
    try:
        from aiayn_conformance import export
    except ImportError as exc:
        _say(f"the onnx extra is not installed ({exc}); pip install 'aiayn-conformance[onnx]'")
        return 2
    from aiayn_conformance.export import ExportError

    started = time.perf_counter()
    try:
        model, output = export.resolve_model(impl, config)
        if args.format == "ctranslate2":
            code = _ctranslate2(model, output, config, args)
            if code:
                return code
        elif args.generation and args.cache:
            twin = export.reference_twin(model, config)
            if twin is not model:
                _say(f"{impl.name} is not the reference: the graphs hold the reference's computation with "
                     f"{impl.name}'s weights (canonical state), verified against {impl.name}'s own decoding")
            written = export.export_cached_generation(twin, args.out_dir, config, progress=_say)
            print(f"wrote {written.describe()}")
            if args.verify:
                _say("verifying greedy and beam decoding in onnxruntime against PyTorch ...")
                if not _print_checks(export.verify_cached_generation(args.out_dir, model, config,
                                                                    output_kind=output)):
                    return 1
        elif args.generation:
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


def _ctranslate2(model, output: str, config, args: argparse.Namespace) -> int:
    try:
        from aiayn_conformance.export import ctranslate2 as ct2
    except ImportError as exc:  # pragma: no cover - the module itself imports ctranslate2 lazily
        _say(f"cannot load the CTranslate2 exporter ({exc})")
        return 2
    if not ct2.available():
        _say("the ctranslate2 package is not installed; pip install 'aiayn-conformance[ctranslate2]'")
        return 2
    if not ct2.is_reference(model):
        _say(f"{args.impl} is not the reference: its canonical state is converted (load_reference_state), "
             f"verified against {args.impl}'s own decoding")
    out = ct2.export_ctranslate2(model, args.out_dir, config, progress=_say)
    print(f"wrote {out}")
    if args.verify:
        _say("verifying greedy decoding in CTranslate2 against PyTorch ...")
        if not _print_checks(ct2.verify_ctranslate2(args.out_dir, model, config, output_kind=output)):
            return 1
    return 0

"""`diffill compile`: compile the embedded model's layers for this CPU into the cache (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from infill_engine.commands import UsageError
from infill_engine.interface import add_model_options, model_spec_from_args

HELP = "compile the model's layers for this CPU (once; --compiled-layers auto then runs them)"


def add_arguments(compile_parser: argparse.ArgumentParser) -> None:
    """The options of `diffill compile`."""
    add_model_options(compile_parser, threads="torch threads while compiling (default: 1)")
    compile_parser.add_argument("--cache-dir", type=Path, metavar="DIR",
                                help="where packages are kept (default: $DIFFILL_CACHE/compiled-layers, else "
                                     "~/.cache/diffill/compiled-layers)")
    compile_parser.add_argument("--background", action="store_true",
                                help="run at the lowest CPU priority (what a server's background compile does)")
    compile_parser.add_argument("--expect-key", metavar="NAME", help=argparse.SUPPRESS)  # a server's check


def run(args: argparse.Namespace) -> int:
    """Compile (or find cached) the package of the model's layers; print its path. 1 where it cannot be compiled."""
    if args.background and hasattr(os, "nice"):
        os.nice(19)
    try:
        spec = model_spec_from_args(args, compiled_layers="off")
    except ValueError as error:
        raise UsageError(str(error)) from None
    import torch

    from infill_engine.compiled_layers import compile_layers, compile_refusal, package_key
    from infill_engine.loading import ModelLoadError, load_denoiser

    torch.set_num_threads(spec.threads or 1)
    try:
        # "auto": `--dtype auto` then picks what a server running compiled layers picks (mixed on a CPU with
        # bfloat16 arithmetic)
        denoiser = load_denoiser(spec.path, family=spec.family, device=spec.device, dtype=spec.dtype,
                                 trust_remote_code=spec.trust_remote_code, compiled_layers="auto")
    except ModelLoadError as error:
        raise UsageError(str(error)) from None
    model = denoiser.model
    refusal = compile_refusal(model)
    if refusal is not None:
        print(f"diffill compile: nothing to compile: {refusal}", file=sys.stderr)
        return 1
    key = package_key(model)
    if args.expect_key and key != args.expect_key:
        print(f"diffill compile: the model loaded here ({key}) is not the server's ({args.expect_key})",
              file=sys.stderr)
        return 1
    start = time.perf_counter()
    try:
        path = compile_layers(model, args.cache_dir)
    except Exception as error:  # noqa: BLE001 - export or the C++ compiler: the layers then run eagerly
        print(f"diffill compile: could not compile the layers ({type(error).__name__}: {error}); fills run them "
              "eagerly", file=sys.stderr)
        return 1
    path.with_suffix(".failed").unlink(missing_ok=True)  # a server may try it again
    print(f"{path} ({time.perf_counter() - start:.1f} s)")
    return 0

"""`diffill bench KIND`: the engine's benchmarks and the editor-side ones under one command.

Each side exports `add_kinds(subparsers) -> {kind: run}`; the engine's kinds live in `infill_engine.commands.bench`
(it knows nothing of LSP), the ones that drive a language server would live in `lsp_server`. Benchmarks measure;
tests never assert timings.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from infill_engine.commands import bench as engine_bench
from infill_engine.commands import bench_cache, bench_vs_ar
from infill_engine.http import bench as http_bench
from lsp_server import bench as lsp_bench

HELP = "measure what fills cost on this machine"
# modules with add_kinds(subparsers) -> {kind: run}
SIDES = (engine_bench, bench_vs_ar, bench_cache, http_bench, lsp_bench)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """The kinds of `diffill bench` and their options."""
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="KIND")
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    for side in SIDES:
        runners.update(side.add_kinds(kinds))
    bench.set_defaults(bench_runners=runners)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark and print its table (or JSON)."""
    return args.bench_runners[args.bench](args)

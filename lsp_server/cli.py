"""`diffill serve`: its options, and a start-up path that imports neither torch nor transformers.

`infill_engine.cli.build_parser` imports the engine (and with it torch) to list model families and sampler rules.
The language server must answer `initialize` before any of that is loaded, so `diffill serve` is recognised first
and parsed by the small parser here; both parsers take the serve options from `add_serve_arguments`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence



def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The options of `diffill serve`."""
    serve.add_argument("--stdio", action="store_true",
                       help="talk over standard input/output (the default; accepted because clients pass it)")
    serve.add_argument("--tcp", metavar="[HOST:]PORT",
                       help="listen on a TCP port instead of standard input/output (host: 127.0.0.1 unless named)")
    serve.add_argument("--model", metavar="PATH",
                       help="model directory used when the editor's settings name none (default: the embedded model)")
    serve.add_argument("--engine-factory", metavar="MODULE:FUNCTION",
                       help="build the engine by calling FUNCTION(settings) from MODULE, not from a checkpoint")


def run_serve(argv: Sequence[str]) -> int:
    """Parse `[-v] serve [options]` and run the language server."""
    from infill_engine.cli import parse_own_command

    parser, args = parse_own_command(list(argv), "serve", "The diffill language server.", add_serve_arguments)
    logging.getLogger("pygls").setLevel(logging.WARNING)  # pygls logs every message at INFO
    from lsp_server.server import parse_tcp, serve

    if args.tcp is not None:
        try:
            parse_tcp(args.tcp)
        except ValueError as error:
            parser.error(str(error))
    return serve(tcp=args.tcp, model=args.model, engine_factory=args.engine_factory)

"""`diffill serve`: the language server's options, and a start that imports neither torch nor transformers.

The server must answer `initialize` before any model is loaded: building the `diffill` command table imports no
torch, and the model loads on the model thread after `initialized`.
"""

from __future__ import annotations

import argparse
import logging

from infill_engine.commands import UsageError
from infill_engine.interface import ENGINE_MODES, add_model_options, model_spec_from_args

HELP = "run the language server for editors (stdio or --tcp)"


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """The options of `diffill serve`."""
    serve.add_argument("--stdio", action="store_true",
                       help="talk over standard input/output (the default; accepted because clients pass it)")
    serve.add_argument("--tcp", metavar="[HOST:]PORT",
                       help="listen on a TCP port instead of standard input/output (host: 127.0.0.1 unless named)")
    serve.add_argument("--engine-mode", choices=ENGINE_MODES,
                       help="where the model runs when the editor's settings do not say (`engine.mode`, default auto)")
    add_model_options(serve, factory=True,
                      threads="CPU threads for torch (default 0: half the cores); the `model.threads` setting wins")


def run(args: argparse.Namespace) -> int:
    """Run the language server until the client exits."""
    from infill_engine.service.address import parse_tcp
    from lsp_server.server import serve

    logging.getLogger("pygls").setLevel(logging.WARNING)  # pygls logs every message at INFO
    try:
        tcp = parse_tcp(args.tcp, allow_non_loopback=True) if args.tcp is not None else None
        spec = model_spec_from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return serve(tcp=tcp, model=spec, engine_mode=args.engine_mode)

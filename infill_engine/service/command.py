"""`diffill engine [serve|status|stop]`: the options, and a path that imports torch only to serve.

`status` and `stop` talk to a running engine and never load the model; `serve` loads it once and listens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
from pathlib import Path

from infill_engine.commands import UsageError
from infill_engine.interface import ModelSpec, add_model_options, half_the_cores, model_spec_from_args
from infill_engine.service.address import parse_tcp, runtime_dir, socket_path
from infill_engine.service.api import EngineClient, EngineError
from infill_engine.service.launcher import IDLE_TIMEOUT

logger = logging.getLogger(__name__)
TOKEN_ENV = "DIFFILL_ENGINE_TOKEN"
HELP = "the shared engine: serve one model to many language servers"


def add_arguments(engine: argparse.ArgumentParser) -> None:
    """The options of `diffill engine`."""
    engine.add_argument("action", nargs="?", choices=("serve", "status", "stop"), default="serve",
                        help="serve (default): load the model and listen; status; stop a running engine")
    add_model_options(engine, factory=True, threads="CPU threads for torch (default 0: half the cores)")
    engine.add_argument("--socket", metavar="PATH",
                        help="Unix socket (default: engine-<model hash>.sock in $XDG_RUNTIME_DIR/diffill or "
                             "/tmp/diffill-$UID)")
    engine.add_argument("--tcp", metavar="[HOST:]PORT", help="also listen on TCP (127.0.0.1 unless HOST is named)")
    engine.add_argument("--allow-non-loopback", action="store_true",
                        help="allow --tcp to bind a HOST that is not a loopback address")
    engine.add_argument("--token-file", metavar="PATH",
                        help=f"TCP token (default: ${TOKEN_ENV}, else a new one written beside the socket)")
    engine.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT, metavar="S",
                        help=f"exit after S seconds without clients (default: {IDLE_TIMEOUT:g})")
    engine.add_argument("--max-tokens", type=int, default=1024, help="span positions per request at most")
    engine.add_argument("--max-queued", type=int, default=8, help="queued requests per client at most")
    engine.add_argument("--max-frame-bytes", type=int, default=8 * 1024 * 1024, help="bytes per msgpack frame")


def run(args: argparse.Namespace) -> int:
    """Serve the model, or ask a running engine for its status or to stop."""
    try:
        spec = model_spec_from_args(args, threads=args.threads or half_the_cores())
        tcp = parse_tcp(args.tcp, args.allow_non_loopback) if args.tcp else None
    except ValueError as failure:
        raise UsageError(str(failure)) from None
    socket = Path(args.socket) if args.socket else socket_path(spec.key)
    if args.action == "serve":
        return _serve(args, spec, socket, tcp)
    address, token = (f"tcp://{tcp[0]}:{tcp[1]}", _token(args, tcp, create=False)) if tcp else (str(socket), None)
    try:
        client = EngineClient.connect(address, token=token, timeout=5.0)
        if args.action == "status":
            print(json.dumps(client.status(), indent=2))
        else:
            client.shutdown()
            print(f"diffill: asked the engine at {address} to stop")
        client.close()
    except EngineError as failure:
        print(f"diffill: {failure}", file=sys.stderr)
        return 1
    return 0


def _token(args: argparse.Namespace, tcp: tuple[str, int], create: bool) -> str | None:
    """The TCP token: --token-file, else the environment, else the file beside the socket (made when serving)."""
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = runtime_dir() / f"engine-tcp-{tcp[1]}.token"
    if create:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
        print(f"diffill engine: TCP token written to {path}", file=sys.stderr)
        return token
    return path.read_text().strip() if path.exists() else None


def _serve(args: argparse.Namespace, spec: ModelSpec, socket: Path, tcp: tuple[str, int] | None) -> int:
    from infill_engine.interface import load_engine
    from infill_engine.service.server import EngineService, ServiceLimits, listen_tcp, listen_unix, serve

    try:
        listener, lock = listen_unix(socket)
    except FileExistsError as failure:
        print(f"diffill engine: {failure}", file=sys.stderr)
        return 0  # not an error: the one running serves the same socket
    listeners = [listener]
    token = None
    if tcp is not None:
        token = _token(args, tcp, create=True)
        listeners.append(listen_tcp(*tcp))
    try:
        engine = load_engine(spec, serving=True)
    except Exception as failure:  # noqa: BLE001 - reported to whoever started us, through the log
        logger.exception("the model could not be loaded")
        print(f"diffill engine: the model could not be loaded: {failure}", file=sys.stderr)
        socket.unlink(missing_ok=True)
        return 1
    info = engine.describe()
    model = {"key": spec.key, "path": info.path, "family": info.family, "device": info.device, "dtype": info.dtype}
    limits = ServiceLimits(max_frame_bytes=args.max_frame_bytes, max_tokens=args.max_tokens,
                           max_queued=args.max_queued)
    service = EngineService(engine, model, limits, idle_timeout=args.idle_timeout, token=token)
    service.address = str(socket) + (f" tcp://{tcp[0]}:{tcp[1]}" if tcp else "")
    logger.info("engine ready at %s (pid %d)", service.address, os.getpid())
    try:
        serve(service, listeners)
    finally:
        socket.unlink(missing_ok=True)
        lock.close()
    return 0

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
from collections.abc import Sequence
from pathlib import Path

from infill_engine.service.address import parse_tcp, runtime_dir, socket_path
from infill_engine.service.api import EngineClient, EngineError
from infill_engine.service.launcher import IDLE_TIMEOUT, EngineSpec

logger = logging.getLogger(__name__)
TOKEN_ENV = "DIFFILL_ENGINE_TOKEN"


def add_engine_arguments(engine: argparse.ArgumentParser) -> None:
    """The options of `diffill engine`."""
    engine.add_argument("action", nargs="?", choices=("serve", "status", "stop"), default="serve",
                        help="serve (default): load the model and listen; status; stop a running engine")
    engine.add_argument("--model", metavar="PATH", help="model directory (default: the embedded model)")
    engine.add_argument("--family", help="override the family read from config.json")
    engine.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    engine.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    engine.add_argument("--trust-remote-code", action="store_true", help="allow a checkpoint's own modelling code")
    engine.add_argument("--engine-factory", metavar="MODULE:FUNCTION", help="build the engine with FUNCTION(None)")
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
    engine.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: half the cores)")


def run_engine(argv: Sequence[str]) -> int:
    """Parse `[-v] engine [action] [options]` and run it."""
    from infill_engine.cli import parse_own_command

    parser, args = parse_own_command(list(argv), "engine", "The shared diffill engine.", add_engine_arguments)
    spec = EngineSpec(path=args.model, family=args.family, device=args.device, dtype=args.dtype,
                      trust_remote_code=args.trust_remote_code, factory=args.engine_factory)
    try:
        tcp = parse_tcp(args.tcp, args.allow_non_loopback) if args.tcp else None
    except ValueError as failure:
        parser.error(str(failure))
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


def _serve(args: argparse.Namespace, spec: EngineSpec, socket: Path, tcp: tuple[str, int] | None) -> int:
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
        engine = _load(args, spec)
    except Exception as failure:  # noqa: BLE001 - reported to whoever started us, through the log
        logger.exception("the model could not be loaded")
        print(f"diffill engine: the model could not be loaded: {failure}", file=sys.stderr)
        socket.unlink(missing_ok=True)
        return 1
    denoiser = engine.denoiser
    model = {"key": spec.key, "path": str(getattr(denoiser, "path", spec.path)),
             "family": str(getattr(denoiser, "family", spec.family)), "device": str(getattr(denoiser, "device", "?"))}
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


def _load(args: argparse.Namespace, spec: EngineSpec):  # noqa: ANN202 - InfillEngine, imported here with torch
    import importlib

    import torch

    from infill_engine.engine import InfillEngine

    if spec.factory:
        module, _, name = spec.factory.partition(":")
        engine = getattr(importlib.import_module(module), name)(None)
    else:
        engine = InfillEngine.load(spec.path, family=spec.family, device=spec.device, dtype=spec.dtype,
                                   trust_remote_code=spec.trust_remote_code)
    if getattr(engine.denoiser.device, "type", "cpu") == "cpu":
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 2) // 2))
    return engine

"""`diffill http`: serve the engine over HTTP with uvicorn on this machine, or on a Ray Serve cluster with `--ray`.

The model loads once (the embedded one when none is named) and the application of `infill_engine.http.app` serves
it. It listens on loopback unless `--host` names another address, and then only with an API key (`--api-key`,
`--api-key-file` or $DIFFILL_API_KEY): a team server that anyone on the network could use unasked is refused.
uvicorn (and ray for `--ray`) are optional dependencies, imported when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infill_engine.commands import UsageError
from infill_engine.interface import DEFAULT_MAX_BATCH_SIZE, add_model_options, half_the_cores, model_spec_from_args
from infill_engine.service.address import is_loopback

if TYPE_CHECKING:
    from infill_engine.http.app import HttpLimits
    from infill_engine.interface import ModelSpec

logger = logging.getLogger(__name__)
HELP = "the team server: the engine over HTTP (llama.cpp's /infill and diffill's endpoints), optionally on Ray Serve"
KEY_ENV = "DIFFILL_API_KEY"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8012  # llama.vim's and llama.vscode's default endpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `diffill http`."""
    add_model_options(parser, factory=True, threads="CPU threads for torch (default 0: half the cores)")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default: {DEFAULT_HOST}); any other than loopback needs a key")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT})")
    parser.add_argument("--api-key", metavar="KEY",
                        help=f"require `Authorization: Bearer KEY` (default: --api-key-file, else ${KEY_ENV}, else "
                             "none; a key on the command line is visible to other local users in `ps`)")
    parser.add_argument("--api-key-file", metavar="PATH", help="read the key from the first line of PATH")
    parser.add_argument("--engine", choices=("inprocess", "shared", "auto"), default="inprocess",
                        help="where the model runs: inprocess (default), shared (the machine's shared engine), auto")
    parser.add_argument("--max-tokens", type=int, default=1024, help="span positions per request at most "
                        "(default: 1024; /infill's n_predict is lowered to it)")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                        help="request body size at most (default: 8 MiB); larger bodies get 413")
    parser.add_argument("--max-queued", type=int, default=64,
                        help="requests waiting for the model at most, all clients together (default: 64); "
                             "more get 503")
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help="fills that share forward passes at once (default: 8): here, concurrent fills denoised "
                             "together (the diffill family; others one at a time); with --ray, the requests Ray "
                             "Serve hands a replica together")
    ray = parser.add_argument_group("Ray Serve (pip install 'diffill[cluster]')")
    ray.add_argument("--ray", action="store_true", help="deploy on Ray Serve instead of serving with uvicorn here")
    ray.add_argument("--address", metavar="ADDR",
                     help="Ray cluster to join, e.g. ray://head:10001 or auto (default: start a local Ray)")
    ray.add_argument("--replicas", type=int, default=1, help="model replicas (default: 1)")
    ray.add_argument("--max-replicas", type=int, default=0,
                     help="autoscale between --replicas and this many replicas (default 0: no autoscaling)")
    ray.add_argument("--batch-wait-ms", type=float, default=10.0,
                     help="how long a replica waits to fill a batch (default: 10)")
    ray.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (default: 0)")


def api_key(args: argparse.Namespace) -> str | None:
    """The key: --api-key, else --api-key-file, else $DIFFILL_API_KEY; None when none is given."""
    if args.api_key:
        return str(args.api_key).strip() or None
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).expanduser().read_text().splitlines()
        except OSError as error:
            raise UsageError(f"cannot read the API key file {args.api_key_file}: {error.strerror}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise UsageError(f"the API key file {args.api_key_file} is empty")
        return key
    return os.environ.get(KEY_ENV, "").strip() or None


def checked_address(host: str, port: int, key: str | None) -> tuple[str, int]:
    """The address to listen on; UsageError for a bad port, or another host than loopback without a key."""
    if not 0 < port < 65536:
        raise UsageError(f"--port must be from 1 to 65535 (got {port})")
    if not is_loopback(host) and key is None:
        raise UsageError(f"refusing to listen on {host}, which is not a loopback address, without an API key: "
                         f"give --api-key, --api-key-file or ${KEY_ENV} as well (clients send it as "
                         "`Authorization: Bearer KEY`)")
    return host, port


def run(args: argparse.Namespace) -> int:
    """Load the model and serve it until interrupted."""
    from infill_engine.http.app import HttpLimits

    key = api_key(args)
    host, port = checked_address(args.host, args.port, key)
    try:
        spec = model_spec_from_args(args, threads=args.threads or half_the_cores())
        limits = HttpLimits(max_body_bytes=args.max_body_bytes, max_tokens=args.max_tokens,
                            max_queued=args.max_queued)
        if isinstance(args.max_batch_size, bool) or args.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be an integer >= 1 (got {args.max_batch_size})")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.ray:
        from infill_engine.http.ray_serve import RayOptions, serve_on_ray

        try:
            options = RayOptions(address=args.address, replicas=args.replicas, max_replicas=args.max_replicas,
                                 max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
                                 num_gpus=args.num_gpus)
        except ValueError as error:
            raise UsageError(str(error)) from None
        return serve_on_ray(spec, limits, key, host, port, options)
    return _serve_here(args, spec, limits, key, host, port)


def _serve_here(args: argparse.Namespace, spec: ModelSpec, limits: HttpLimits, key: str | None, host: str,
                port: int) -> int:
    """Serve with uvicorn in this process."""
    try:
        import uvicorn
    except ImportError:
        raise UsageError("diffill http needs uvicorn: pip install 'diffill[http]'") from None
    from infill_engine.batched_fill import FillBatcher
    from infill_engine.http.app import InfillApp
    from infill_engine.interface import OpenError, open_engine

    try:
        engine = open_engine(spec, args.engine, serving=True)
    except OpenError as error:
        print(f"diffill http: {error}", file=sys.stderr)
        return 1
    app = InfillApp(engine, limits, key, batcher=FillBatcher(engine, args.max_batch_size))
    print(f"diffill http: serving {app.model.description} on http://{host}:{port} "
          f"({'a key is required' if key else 'no key'})", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0

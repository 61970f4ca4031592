"""`diffill bench http`: throughput and latency of a running team server under 1, 4, 16... concurrent clients.

Each client sends llama.vim's `/infill` body (the benchmark's hole, `n_predict` positions) in a loop, the next as
soon as the last is answered, until every client has sent `--requests`; the table gives fills per second and the
p50/p95 latency per number of clients. It measures the server as a whole (queueing included); start the server
first (`diffill http ...`). Uses only the standard library.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

BENCH_PREFIX = "import json\n\n\ndef load_settings(path):\n    \"\"\"Read a JSON settings file into a dict.\"\"\"\n"
BENCH_PROMPT = "    with open(path, encoding='utf-8') as handle:\n        data = json.load(handle)\n    return "
BENCH_SUFFIX = "\n\n\ndef save_settings(path, settings):\n    with open(path, 'w') as handle:\n        json.dump(settings, handle)\n"


def add_kinds(kinds: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """The `http` kind of `diffill bench`."""
    parser = kinds.add_parser("http", help="fills/s and latency of a running `diffill http` under concurrent clients")
    parser.add_argument("--url", default="http://127.0.0.1:8012", help="the server (default: http://127.0.0.1:8012)")
    parser.add_argument("--api-key", metavar="KEY", help="its key, if it has one")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrent clients (default: 1 4 16)")
    parser.add_argument("--requests", type=int, default=4, help="requests per client (default: 4)")
    parser.add_argument("--n-predict", type=int, default=24, help="canvas positions per fill (default: 24)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return {"http": run}


def measure(url: str, key: str | None, clients: int, requests: int, n_predict: int) -> dict[str, Any]:
    """One row: `clients` threads each sending `requests` fills one after another."""
    parts = urlsplit(url)
    body = json.dumps({"input_prefix": BENCH_PREFIX, "prompt": BENCH_PROMPT, "input_suffix": BENCH_SUFFIX,
                       "input_extra": [], "n_predict": n_predict, "samplers": ["top_k", "top_p", "infill"],
                       "cache_prompt": True, "response_fields": ["content", "timings/predicted_n"]}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
        for _ in range(requests):
            started = time.perf_counter()
            try:
                connection.request("POST", parts.path.rstrip("/") + "/infill", body, headers)
                response = connection.getresponse()
                data = response.read()
            except OSError as error:  # the server went away: this client stops, counted as failed
                with lock:
                    failures.append(f"{type(error).__name__}: {error}")
                break
            with lock:
                latencies.append((time.perf_counter() - started) * 1000.0)
                if response.status != 200:
                    failures.append(data.decode(errors="replace")[:200])
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    if not ordered:
        raise OSError(failures[0] if failures else "no answer")
    return {"clients": clients, "fills": len(latencies), "failed": len(failures), "seconds": round(elapsed, 2),
            "fills_per_s": round(len(latencies) / elapsed, 2), "p50_ms": round(statistics.median(ordered), 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))], 1)}


def run(args: argparse.Namespace) -> int:
    """Measure each number of clients and print the table."""
    try:
        rows = [measure(args.url, args.api_key, clients, args.requests, args.n_predict) for clients in args.clients]
    except OSError as error:
        print(f"diffill bench http: {args.url} does not answer ({error.strerror or error}); start `diffill http` "
              "first", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'clients':>7} {'fills':>6} {'failed':>6} {'fills/s':>8} {'p50 ms':>9} {'p95 ms':>9}")
    for row in rows:
        print(f"{row['clients']:>7} {row['fills']:>6} {row['failed']:>6} {row['fills_per_s']:>8} {row['p50_ms']:>9} "
              f"{row['p95_ms']:>9}")
    return 0

"""Measure `diffill serve` in `inprocess` vs `shared` engine mode: memory, second-server start-up, per-fill latency.

Not a pytest test; run it by hand:

    python -m tests.service.measure_memory --model PATH [--fills 20]

For each mode it starts servers one after another (each loads the model and answers one inline completion), and
reports the summed VmRSS (and PSS) of every process involved (servers, their children, and in shared mode the
detached `diffill engine`) at N=1 and N=3, the time from spawning the second server until its first inline
completion returns, and the median latency of `--fills` inline completions on server 1 (cache off). Everything runs
under a private XDG_RUNTIME_DIR; the engine is stopped and every process ended at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DOCUMENT = "import os\n\n\ndef add(a, b):\n    return \n\n\ndef main():\n    print(add(1, 2))\n"
POSITION = (4, 11)  # after "return "
WAIT = 300.0


class Server:
    """A `diffill serve` process spoken to over stdio (Content-Length framed JSON-RPC)."""

    def __init__(self, settings: dict[str, Any], env: dict[str, str]) -> None:
        script = Path(sys.executable).with_name("diffill")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "diffill"]
        self.started = time.monotonic()
        self.process = subprocess.Popen([*command, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=env)
        self.next_id = 0
        self.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": {},
                                    "initializationOptions": settings})
        self.notify("initialized", {})

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        length = 0
        while (line := self.process.stdout.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if not length:
            raise RuntimeError(f"server {self.process.pid} closed its output")
        return json.loads(self.process.stdout.read(length))

    def notify(self, method: str, params: Any) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: Any) -> Any:
        """Send a request and return its result; notifications are skipped, server requests answered with null."""
        self.next_id += 1
        ident = self.next_id
        self.send({"id": ident, "method": method, "params": params})
        while True:
            message = self.receive()
            if "method" in message and "id" in message:  # e.g. window/workDoneProgress/create
                self.send({"id": message["id"], "result": None})
            elif message.get("id") == ident and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while (info := self.request("diffill/debugInfo", None))["state"] != "ready":
            if time.monotonic() > deadline or info["state"] == "failed":
                raise RuntimeError(f"model not ready: {info['state']}: {info.get('message')}")
            time.sleep(0.05)

    def open(self, uri: str, text: str) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                              "text": text}})

    def inline(self, uri: str, line: int, character: int) -> list[str]:
        result = self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 2}})
        return [item["insertText"] for item in (result or {}).get("items", [])] if result else []

    def close(self) -> None:
        try:
            self.request("shutdown", None)
            self.notify("exit", None)
            self.process.wait(10)
        except Exception:  # noqa: BLE001 - end it anyway
            self.process.kill()
            self.process.wait()


def children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def engine_pids(runtime: str) -> list[int]:
    """The `diffill engine serve` processes whose socket is in our private runtime dir."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"engine" in words and b"serve" in words and any(runtime.encode() in word for word in words):
            found.append(int(entry.name))
    return found


def kib(pid: int, path: str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory(roots: list[int]) -> tuple[float, float, int]:
    """(RSS MiB, PSS MiB, process count) summed over `roots` and all their descendants."""
    tree, seen, todo = children(), set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += tree.get(pid, [])
    rss = sum(kib(pid, "status", "VmRSS") for pid in seen)
    pss = sum(kib(pid, "smaps_rollup", "Pss") for pid in seen)
    return rss / 1024, pss / 1024, len(seen)


def measure(mode: str, model: str, fills: int, runtime: str) -> dict[str, Any]:
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    settings = {"model": {"path": model}, "engine": {"mode": mode}, "diagnostics": {"enabled": False},
                "completion": {"debounceMs": 0, "cacheEntries": 0}}
    servers: list[Server] = []
    row: dict[str, Any] = {"mode": mode}
    try:
        for number in range(3):
            server = Server(settings, env)
            servers.append(server)
            server.wait_ready()
            uri = f"file:///measure/doc{number}.py"
            server.open(uri, DOCUMENT)
            items = server.inline(uri, *POSITION)
            row.setdefault("items", []).append(len(items))
            if number == 1:
                row["start_s"] = time.monotonic() - server.started
            if number in (0, 2):
                rss, pss, count = memory([s.process.pid for s in servers] + engine_pids(runtime))
                row[f"N{number + 1}"] = (rss, pss, count)
        times = []
        for _ in range(fills):
            begun = time.monotonic()
            server = servers[0]
            server.inline("file:///measure/doc0.py", *POSITION)
            times.append(time.monotonic() - begun)
        row["fill_ms"] = 1000 * statistics.median(times)
        return row
    finally:
        for server in servers:
            server.close()
        if mode == "shared":
            subprocess.run([sys.executable, "-m", "diffill", "engine", "stop", "--model", model], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
            deadline = time.monotonic() + 10
            while engine_pids(runtime) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in engine_pids(runtime):  # the engine runs in its own session: end its group
                os.killpg(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--fills", type=int, default=20, help="inline completions timed per mode")
    parser.add_argument("--modes", default="inprocess,shared")
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    with tempfile.TemporaryDirectory(prefix="diffill-measure-") as runtime:
        os.chmod(runtime, 0o700)
        rows = [measure(mode, model, args.fills, runtime) for mode in args.modes.split(",")]
        left = engine_pids(runtime)
    print(f"model: {model}")
    print(f"{'mode':<10} {'N=1 RSS MiB':>12} {'N=1 PSS':>8} {'N=3 RSS MiB':>12} {'N=3 PSS':>8} {'procs':>5} "
          f"{'2nd start s':>11} {'fill ms':>8} {'items':>7}")
    for row in rows:
        (rss1, pss1, _), (rss3, pss3, procs) = row["N1"], row["N3"]
        print(f"{row['mode']:<10} {rss1:>12.0f} {pss1:>8.0f} {rss3:>12.0f} {pss3:>8.0f} {procs:>5} "
              f"{row['start_s']:>11.2f} {row['fill_ms']:>8.1f} {'/'.join(map(str, row['items'])):>7}")
    print("leftover engine processes:", left or "none")


if __name__ == "__main__":
    main()

"""The editor side's kinds of `diffill bench`: typing through a real LSP client (`lsp`) and a typing load (`load`).

Both drive `diffill serve` processes over stdio with `lsp_server.typing_replay`; `diffill.bench` puts these kinds
beside the engine's. Benchmarks measure; tests never assert timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infill_engine.commands import UsageError
from infill_engine.interface import ENGINE_MODES
from lsp_server import process_usage, typing_replay
from lsp_server.stdio_client import Pending
from lsp_server.typing_replay import DEFAULT_RATE, KeyRecord, Server, Session

WASTED = ("superseded", "changed", "cancelled")  # diffill/status outcomes whose model work nobody saw


def add_kinds(kinds: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `diffill bench lsp` and `diffill bench load`; kind name -> its run function."""
    lsp = kinds.add_parser("lsp", help="type a real file into `diffill serve` and time the ghost text")
    _common(lsp)
    lsp.add_argument("--file", type=Path, help="the file to type (default: pygls/workspace/text_document.py as "
                     "installed, a dependency not in the training corpus)")
    lsp.add_argument("--start-line", type=int, default=typing_replay.DEFAULT_START_LINE,
                     help=f"1-based line where typing starts (default {typing_replay.DEFAULT_START_LINE})")
    lsp.add_argument("--chars", type=int, default=400,
                     help="characters to type, cut back to the last line end among them (default 400)")
    lsp.add_argument("--line-pause-ms", type=float, default=0.0,
                     help="a pause after each typed line, in ms (default 0: a steady pace)")
    lsp.add_argument("--typo-every", type=int, default=0, metavar="N",
                     help="before every N-th key a typo (the key after it), taken back with a backspace "
                     "(default 0: no typos)")
    load = kinds.add_parser("load", help="a bounded replay of fast typing against one server and three sharing "
                            "one engine: answers, errors, latency, memory")
    _common(load)
    load.add_argument("--requests", type=int, default=2000, help="inline-completion requests per run (default 2000)")
    load.add_argument("--servers", type=int, nargs="+", default=[1, 3],
                      help="servers per run, one run each (default: 1 3); they share one engine unless "
                      "--engine-mode inprocess")
    load.add_argument("--rss-every", type=int, default=100, help="requests between memory samples (default 100)")
    accept = kinds.add_parser("accept", help="ghost text accepted, then the next request: with and without the "
                              "accepted state prefetched (completion.prefetchAccepted), hole by hole in one run")
    _common(accept)
    accept.add_argument("--file", type=Path, help="the file whose line ends are the holes (default: as `lsp`)")
    accept.add_argument("--holes", type=int, default=30, help="line ends, spread over the file (default 30)")
    accept.add_argument("--think-ms", type=float, default=500.0,
                        help="ms between the ghost text's answer and its acceptance (default 500)")
    return {"lsp": run_lsp, "load": run_load, "accept": run_accept}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the embedded model)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE,
                        help=f"keys per second, all servers together (default {DEFAULT_RATE:g})")
    parser.add_argument("--engine-mode", choices=ENGINE_MODES,
                        help="engine.mode sent to the servers (default: none sent, the server's default)")
    parser.add_argument("--settings", default="{}", help="more initializationOptions as JSON (default: {})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON report to this file")


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The initializationOptions of the replay's servers."""
    try:
        options = json.loads(args.settings)
    except json.JSONDecodeError as error:
        raise UsageError(f"--settings must be a JSON object: {error}") from None
    if not isinstance(options, dict):
        raise UsageError(f"--settings must be a JSON object (got {args.settings!r})")
    if args.engine_mode:
        options.setdefault("engine", {})["mode"] = args.engine_mode
    return options


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (`share` from 0 to 1), or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(share * len(ordered)) - 1)], 1)


def answer_counts(records: Sequence[KeyRecord]) -> dict[str, int]:
    """Requests by answer: items, empty, cancelled, error, none (no answer at all)."""
    counts = Counter(record.answer or "none" for record in records)
    return {kind: counts.get(kind, 0) for kind in ("items", "empty", "cancelled", "error", "none")}


def model_work(servers: Sequence[Server]) -> dict[str, Any]:
    """Outcomes from the servers' diffill/status, and the denoising steps spent on answers nobody saw."""
    statuses = [status for server in servers for status in server.statuses]
    outcomes = Counter(str(status.get("outcome")) for status in statuses)
    steps = sum(int(status.get("steps_done") or 0) for status in statuses)
    wasted = sum(int(status.get("steps_done") or 0) for status in statuses if status.get("outcome") in WASTED)
    passes = sum(int(status.get("forward_passes") or 0) for status in statuses)
    # requests the model took up (their context encoded), and those of them whose answer nobody saw: a request
    # stopped before its first step costs its encode, which the step counts above do not show
    started = [status for status in statuses if status.get("model_started")]
    started_wasted = sum(1 for status in started if status.get("outcome") in WASTED)
    return {"outcomes": dict(sorted(outcomes.items())), "statuses": len(statuses), "forward_passes": passes,
            "cache_share": round(outcomes.get("cache", 0) / len(statuses), 3) if statuses else None,
            "steps": steps, "steps_thrown_away": wasted,
            "thrown_away_share": round(wasted / steps, 3) if steps else None,
            "model_calls": len(started), "model_calls_thrown_away": started_wasted,
            "server_ms": answer_ms_by_outcome(statuses)}


def answer_ms_by_outcome(statuses: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For answers with items, by where they came from (ok: the request's own fill; cache; through: a fill the keys
    were typed through), how many, the server's ms from request to answer (p50, p95) and, of answers whose own fill
    ran, the engine's ms of that fill (p50) and the server's ms outside it, request by request (p50, p95: its own
    work and waiting)."""
    by_outcome: dict[str, list[float]] = {}
    model_ms: dict[str, list[float]] = {}
    outside_ms: dict[str, list[float]] = {}
    for status in statuses:
        if int(status.get("items") or 0) > 0:
            outcome = str(status.get("outcome"))
            ms = float(status.get("ms") or 0.0)
            by_outcome.setdefault(outcome, []).append(ms)
            if float(status.get("model_ms") or 0.0) > 0:
                model_ms.setdefault(outcome, []).append(float(status["model_ms"]))
                outside_ms.setdefault(outcome, []).append(ms - float(status["model_ms"]))
    engine = {outcome: {"model_p50_ms": percentile(model_ms[outcome], 0.5),
                        "outside_model_p50_ms": percentile(outside_ms[outcome], 0.5),
                        "outside_model_p95_ms": percentile(outside_ms[outcome], 0.95)} for outcome in model_ms}
    return {outcome: {"answers": len(ms), "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95),
                      **engine.get(outcome, {})}
            for outcome, ms in sorted(by_outcome.items())}


def _write(report: dict[str, Any], args: argparse.Namespace, table: Callable[[dict[str, Any]], str]) -> None:
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else table(report))


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}


# ------------------------------------------------------------------------------------------------ lsp


def run_lsp(args: argparse.Namespace) -> int:
    """`diffill bench lsp`: time to ghost text while a real file is typed."""
    try:
        source = typing_replay.source_stretch(args.file or typing_replay.default_source(), args.start_line,
                                              args.chars)
        report = asyncio.run(bench_lsp(source, typing_replay.serve_command(args.model), options_of(args),
                                       args.rate, args.line_pause_ms / 1000, args.typo_every))
    except ValueError as error:
        raise UsageError(str(error)) from None
    _write(report, args, lsp_table)
    return 0


async def bench_lsp(source: typing_replay.Source, command: Sequence[str], options: dict[str, Any], rate: float,
                    line_pause: float = 0.0, typo_every: int = 0) -> dict[str, Any]:
    """Type `source.typed` into one server (a typo taken back before every `typo_every`-th key, when not 0); the
    report of `diffill bench lsp`."""
    keys = typing_replay.typing_keys(source.typed, line_pause)
    if typo_every:
        keys = typing_replay.with_typos(keys, typo_every)
    before = _machine()
    async with typing_replay.servers(1, command, options) as started:
        server = started[0]
        session = Session(0, server, source)
        roots, children = typing_replay.process_tree(started)
        cpu_start, wall_start = process_usage.cpu_seconds(roots + children), time.perf_counter()
        records = await typing_replay.replay([session], [keys], rate)
        roots, children = typing_replay.process_tree(started)
        cpu = process_usage.cpu_seconds(roots + children)
        wall = time.perf_counter() - wall_start
        work = model_work(started)
    seen = typing_replay.ghost_text(records)
    cpu_s = None if cpu is None or cpu_start is None else round(cpu - cpu_start, 2)
    settings = server.info.get("settings", {})
    return {
        "file": source.origin, "path": str(source.path), "sha256_16": source.sha256, "start_line": source.start_line,
        "chars": len(source.typed), "keys": len(keys), "rate_keys_per_s": rate,
        "line_pause_ms": round(line_pause * 1000), "typo_every": typo_every, "model": server.info.get("model"),
        "engine_mode": settings.get("engine", {}).get("mode"), "engine_processes": len(children),
        "options": options, "wall_s": round(wall, 1),
        "start": {"initialize_ms": round(server.initialize_ms, 1), "ready_ms": round(server.ready_ms, 1)},
        "ghost_text": {"after_keys": seen.shown, "share_of_keys": round(seen.shown / len(keys), 3),
                       "from_answers": len(seen.latencies_ms), "kept_by_typing_ahead": seen.kept,
                       "p50_ms": percentile(seen.latencies_ms, 0.5), "p95_ms": percentile(seen.latencies_ms, 0.95)},
        "answers": answer_counts(records),
        **model_work_fields(work),
        "accepted_chars": seen.accepted_chars, "cpu_s": cpu_s,
        "cpu_s_per_accepted_char": round(cpu_s / seen.accepted_chars, 3) if cpu_s and seen.accepted_chars else None,
        "machine_before": before, "machine_after": _machine(),
        "key_records": typing_replay.key_rows(records),  # key by key: which cursors got ghost text, and which not
    }


def model_work_fields(work: dict[str, Any]) -> dict[str, Any]:
    """The model-work part of a report."""
    return {"status_outcomes": work["outcomes"], "cache_share": work["cache_share"],
            "denoising_steps": work["steps"], "forward_passes_answered": work["forward_passes"],
            "steps_thrown_away": work["steps_thrown_away"],
            "thrown_away_share": work["thrown_away_share"],
            "model_calls": work["model_calls"], "model_calls_thrown_away": work["model_calls_thrown_away"],
            "server_ms_by_outcome": work["server_ms"]}


def lsp_table(report: dict[str, Any]) -> str:
    """`diffill bench lsp` as text."""
    ghost = report["ghost_text"]
    lines = [
        f"typed {report['chars']} characters ({report['keys']} keys) of {report['file']} from line "
        f"{report['start_line']} at {report['rate_keys_per_s']:g} keys/s (pause {report['line_pause_ms']} ms a line"
        + (f", a typo taken back every {report['typo_every']} keys" if report.get("typo_every") else "") + ")",
        f"model {report['model']}, engine.mode {report['engine_mode']}, wall {report['wall_s']} s, load "
        f"{report['machine_before']['load_average']}",
        f"start: initialize answered {report['start']['initialize_ms']} ms after the server was spawned, the model "
        f"ready after {report['start']['ready_ms']} ms (polled every 0.1 s)",
        f"ghost text on screen after {ghost['after_keys']} of {report['keys']} keys ({ghost['share_of_keys']:.1%}); "
        f"from the key's own answer {ghost['from_answers']}, kept by typing ahead {ghost['kept_by_typing_ahead']}",
        f"time to ghost text: p50 {ghost['p50_ms']} ms, p95 {ghost['p95_ms']} ms; in the server, answers with items "
        f"by outcome: " + ", ".join(f"{outcome} {v['answers']} (p50 {v['p50_ms']} / p95 {v['p95_ms']} ms"
                                    + (f", engine p50 {v['model_p50_ms']} ms, outside it p50 "
                                       f"{v['outside_model_p50_ms']} / p95 {v['outside_model_p95_ms']} ms"
                                       if "model_p50_ms" in v else "") + ")"
                                    for outcome, v in report["server_ms_by_outcome"].items()),
        f"answers: {report['answers']}; server outcomes: {report['status_outcomes']}",
        f"from cache: {report['cache_share']}; denoising steps {report['denoising_steps']}, thrown away "
        f"{report['steps_thrown_away']} ({report['thrown_away_share']}); requests the model took up "
        f"{report['model_calls']}, of them thrown away {report['model_calls_thrown_away']}",
        f"accepted characters {report['accepted_chars']}; CPU {report['cpu_s']} s, per accepted character "
        f"{report['cpu_s_per_accepted_char']} s",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ load


def run_load(args: argparse.Namespace) -> int:
    """`diffill bench load`: the typing load, one run per --servers count."""
    if args.requests < 1 or args.rss_every < 1 or min(args.servers) < 1:
        raise UsageError("--requests, --rss-every and --servers must be at least 1")
    try:
        source = typing_replay.source_stretch(typing_replay.default_source(), typing_replay.DEFAULT_START_LINE, 600)
        runs = [asyncio.run(bench_load(source, typing_replay.serve_command(args.model), options_of(args), count,
                                       args.requests, args.rate, args.rss_every)) for count in args.servers]
    except ValueError as error:
        raise UsageError(str(error)) from None
    _write({"file": source.origin, "runs": runs}, args, load_table)
    return 0


async def bench_load(source: typing_replay.Source, command: Sequence[str], options: dict[str, Any], servers: int,
                     requests: int, rate: float, rss_every: int) -> dict[str, Any]:
    """`requests` keys of fast typing spread over `servers` servers (one document each); one run's report."""
    per_session = -(-requests // servers)
    keys = [typing_replay.load_keys(source.typed, per_session) for _ in range(servers)]
    keys[-1] = keys[-1][: requests - per_session * (servers - 1)]
    before = _machine()
    rss: list[dict[str, Any]] = []
    async with typing_replay.servers(servers, command, options) as started:
        sessions = [Session(number, server, source) for number, server in enumerate(started)]

        def sample(sent: int) -> None:
            if sent % rss_every == 0:
                roots, children = typing_replay.process_tree(started)
                rss.append({"requests": sent, "servers_mib": [_mib(pid) for pid in roots],
                            "engine_mib": [_mib(pid) for pid in children]})

        started_at = time.perf_counter()
        records = await typing_replay.replay(sessions, keys, rate, sample)
        wall = time.perf_counter() - started_at
        engines = len(typing_replay.process_tree(started)[1])
        work = model_work(started)
        settings = started[0].info.get("settings", {})
    answered = [r for r in records if r.answer in ("items", "empty")]
    latencies = [(r.request.answered - r.request.sent) * 1000 for r in answered if r.request.answered is not None]
    counts = answer_counts(records)
    return {
        "servers": servers, "engine_mode": settings.get("engine", {}).get("mode"), "engine_processes": engines,
        "model": started[0].info.get("model"), "requests": len(records), "rate_keys_per_s": rate,
        "wall_s": round(wall, 1), "answered": len(answered), "with_ghost_text": counts["items"],
        "superseded": work["outcomes"].get("superseded", 0) + work["outcomes"].get("changed", 0),
        "cancelled": counts["cancelled"], "failed": counts["error"] + counts["none"],
        "errors": sorted({r.error for r in records if r.answer == "error"})[:5],
        "latency_ms": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                       "p99": percentile(latencies, 0.99)},
        **model_work_fields(work), "rss": rss, "machine_before": before, "machine_after": _machine(),
    }


def _mib(pid: int) -> float | None:
    value = process_usage.rss_mib(pid)
    return None if value is None else round(value, 1)


def rss_growth(rss: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """(mean total MiB over the second quarter of the samples, over the last quarter), or None with too few."""
    totals = [sum(v or 0 for v in s["servers_mib"]) + sum(v or 0 for v in s["engine_mib"]) for s in rss]
    quarter = len(totals) // 4
    if quarter < 1:
        return None
    second, last = totals[quarter: 2 * quarter], totals[len(totals) - quarter:]
    return sum(second) / len(second), sum(last) / len(last)


def load_table(report: dict[str, Any]) -> str:
    """`diffill bench load` as text."""
    lines = [f"typing load over {report['file']}",
             f"{'servers':>7} {'mode':>9} {'requests':>8} {'answered':>8} {'ghost':>6} {'superseded':>10} "
             f"{'cancelled':>9} {'failed':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"]
    for run in report["runs"]:
        latency = run["latency_ms"]
        lines.append(f"{run['servers']:>7} {run['engine_mode']:>9} {run['requests']:>8} {run['answered']:>8} "
                     f"{run['with_ghost_text']:>6} {run['superseded']:>10} {run['cancelled']:>9} {run['failed']:>6} "
                     f"{latency['p50']!s:>8} {latency['p95']!s:>8} {latency['p99']!s:>8}")
    for run in report["runs"]:
        lines.append(f"RSS MiB, {run['servers']} server(s) + {run['engine_processes']} engine, every "
                     f"{run['rss'][1]['requests'] - run['rss'][0]['requests'] if len(run['rss']) > 1 else '-'} "
                     "requests (servers | engine):")
        lines += [f"  {s['requests']:>6}: {s['servers_mib']} | {s['engine_mib']}" for s in run["rss"]]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ accept


def run_accept(args: argparse.Namespace) -> int:
    """`diffill bench accept`: the request after accepting ghost text, prefetched or not."""
    path = args.file or typing_replay.default_source()
    try:
        text = path.read_text(encoding="utf-8")
        report = asyncio.run(bench_accept(text, args.holes, args.think_ms / 1000,
                                          typing_replay.serve_command(args.model), options_of(args)))
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    report = {"file": typing_replay.origin_of(path), **report}
    _write(report, args, accept_table)
    return 0


def accept_holes(text: str, count: int) -> list[int]:
    """Offsets of `count` line ends spread over the text, each after a line of code (not blank, not a comment)."""
    ends = [i for i, char in enumerate(text) if char == "\n"]
    code = [end for end in ends
            if (line := text[text.rfind("\n", 0, end) + 1 : end].strip()) and not line.startswith(("#", '"', "'"))]
    step = max(1, len(code) // max(count, 1))
    return code[::step][:count]


async def bench_accept(text: str, holes: int, think: float, command: Sequence[str],
                       options: dict[str, Any]) -> dict[str, Any]:
    """At each hole, on two servers (prefetch on, off) one after the other: ghost text, a pause, Tab, the next
    request; the time from Tab to that answer and whether the cache answered it."""
    before = _machine()
    engine = {**options.get("engine", {}), "mode": "inprocess"}  # each server its own model thread
    variants = {"on": True, "off": False}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    offsets = accept_holes(text, holes)
    async with contextlib.AsyncExitStack() as stack:
        started = {}
        for name, prefetch in variants.items():
            completion = {**options.get("completion", {}), "prefetchAccepted": prefetch}
            settings = {**options, "engine": engine, "completion": completion}
            started[name] = (await stack.enter_async_context(typing_replay.servers(1, command, settings)))[0]
        for number, offset in enumerate(offsets):
            for name, server in started.items():
                results[name].append(await _accept_once(server, text, offset, think, f"{name}-{number}"))
    rows = {}
    for name, measured in results.items():
        accepted = [m for m in measured if m["accepted"]]
        rows[name] = {
            "holes": len(measured), "accepted": len(accepted),
            "next_ms_p50": percentile([m["next_ms"] for m in accepted], 0.5),
            "next_ms_p95": percentile([m["next_ms"] for m in accepted], 0.95),
            "next_from_cache": sum(1 for m in accepted if m["cache_hit"]),
            "next_with_items": sum(1 for m in accepted if m["items"]),
            "first_ms_p50": percentile([m["first_ms"] for m in measured], 0.5),
        }
    return {"machine_before": before, "machine_after": _machine(), "think_ms": think * 1000, "rows": rows}


async def _accept_once(server: Server, text: str, offset: int, think: float, tag: str) -> dict[str, Any]:
    """One hole: open, ask for ghost text, wait `think`, accept its first item, ask again; then close."""
    client = server.client
    document = typing_replay.Document(Path(tempfile.gettempdir(), f"diffill-accept-{tag}.py").as_uri(),
                                      text[:offset], text[offset:])
    client.notify("textDocument/didOpen", document.opened())

    def ask() -> Pending:
        return client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": document.uri}, "position": document.position(document.cursor),
            "context": {"triggerKind": 2}})

    started = time.perf_counter()
    first = await asyncio.wait_for(ask().future, typing_replay.ANSWER_TIMEOUT)
    first_ms = (time.perf_counter() - started) * 1000
    items = _items(first)
    measured: dict[str, Any] = {"first_ms": first_ms, "accepted": bool(items), "next_ms": None, "cache_hit": False,
                                "items": False}
    if items:
        await asyncio.sleep(think)
        shown = items[0].get("insertText")
        shown = shown if isinstance(shown, str) else str((shown or {}).get("value", ""))
        seen = len(server.statuses)
        tab = time.perf_counter()
        client.notify("textDocument/didChange", document.change(typing_replay.Keystroke(insert=shown)))
        second = await asyncio.wait_for(ask().future, typing_replay.ANSWER_TIMEOUT)
        measured["next_ms"] = (time.perf_counter() - tab) * 1000
        measured["items"] = bool(_items(second))
        for _ in range(200):  # its diffill/status follows the answer
            statuses = [s for s in server.statuses[seen:] if s.get("method") == "textDocument/inlineCompletion"]
            if statuses:
                measured["cache_hit"] = bool(statuses[-1].get("cache_hit"))
                break
            await asyncio.sleep(0.01)
    client.notify("textDocument/didClose", {"textDocument": {"uri": document.uri}})
    return measured


def _items(message: dict[str, Any]) -> list[dict[str, Any]]:
    result = message.get("result")
    return ((result.get("items") if isinstance(result, dict) else result) or []) if "error" not in message else []


def accept_table(report: dict[str, Any]) -> str:
    """The report of `diffill bench accept` as text."""
    lines = [f"{report['file']}; think {report['think_ms']:g} ms; load {report['machine_before']['load_average']}",
             f"{'prefetch':<9} {'holes':>5} {'accepted':>8} {'next p50':>9} {'next p95':>9} {'from cache':>10} "
             f"{'first p50':>9}"]
    for name, row in report["rows"].items():
        lines.append(f"{name:<9} {row['holes']:>5} {row['accepted']:>8} {row['next_ms_p50']!s:>9} "
                     f"{row['next_ms_p95']!s:>9} {row['next_from_cache']:>10} {row['first_ms_p50']!s:>9}")
    return "\n".join(lines)


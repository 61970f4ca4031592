"""Measure `diffill serve` from the editor's side: initialize, model load, ghost text, typed-ahead cache hits.

    python -m tests.lsp.measure_latency [--model PATH] [--requests N] [--threads T] [--plain-text]

Without --model a tiny random checkpoint is built in a temporary directory (its fills are garbage, but it runs
every step a real model does). Its garbage rarely passes the gate in Python, so typed-ahead cache hits are measured
with --plain-text (only the bracket check applies there). Benchmarks measure; tests assert: this prints figures and
checks nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pytest_lsp import client_capabilities, make_test_lsp_client

from tests.lsp.conftest import SERVER_ENV, plain, serve_command

DOCUMENT = "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return \n"


PROSE = "the model writes every position of the hole at once and then it commits\n" * 4 + "and the editor \n"


async def measure(model: str, requests: int, threads: int, plain_text: bool) -> dict[str, object]:
    client = make_test_lsp_client()
    statuses: list[dict] = []
    client.feature("diffill/status")(lambda ls, params: statuses.append(plain(params)))
    started = time.perf_counter()
    await client.start_io(*serve_command(), env=SERVER_ENV)
    options = {"model": {"path": model, "threads": threads}, "completion": {"debounceMs": 0},
               "context": {"otherDocuments": False}}
    sent = time.perf_counter()
    await client.initialize_session(types.InitializeParams(capabilities=client_capabilities("visual_studio_code"),
                                                           initialization_options=options))
    answered = time.perf_counter()
    while plain(await client.protocol.send_request_async("diffill/debugInfo", {}))["state"] in ("starting", "loading"):
        await asyncio.sleep(0.02)
    ready = time.perf_counter()
    uri = "file:///measure/notes.txt" if plain_text else "file:///measure/mean.py"
    original = PROSE if plain_text else DOCUMENT
    column = len(original.split("\n")[-2])
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(
        uri=uri, language_id="plaintext" if plain_text else "python", version=1, text=original)))

    async def ghost_text(line: int, character: int) -> tuple[float, dict]:
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, character))
        count = len(statuses)
        start = time.perf_counter()
        await client.text_document_inline_completion_async(params)
        elapsed = (time.perf_counter() - start) * 1000
        while len(statuses) == count:
            await asyncio.sleep(0.001)
        return elapsed, statuses[count]

    model_runs, cache_hits, passes = [], [], []
    version = 1
    for index in range(requests):
        # a different document each time, so that the model runs; then one typed character answered from the cache
        version += 1
        text = original.replace("total", f"total{index}").replace("model", f"model{index}")
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
        line = text.count("\n") - 1
        elapsed, status = await ghost_text(line, column)
        model_runs.append(elapsed)
        passes.append(status["forward_passes"])
        result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, column)))
        if result and result.items and len(result.items[0].insert_text) > 1:
            typed = result.items[0].insert_text[0]
            version += 1
            lines = text.split("\n")
            lines[line] += typed
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text="\n".join(lines))]))
            elapsed, status = await ghost_text(line, column + 1)
            if status["cache_hit"]:
                cache_hits.append(elapsed)
    await client.shutdown_session()
    await client.stop()

    def summary(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return {"median_ms": round(statistics.median(values), 2), "p90_ms": round(p90, 2), "n": len(values)}

    return {
        "spawn_to_initialize_ms": round((answered - started) * 1000, 1),
        "initialize_round_trip_ms": round((answered - sent) * 1000, 1),
        "initialize_to_model_ready_ms": round((ready - answered) * 1000, 1),
        "ghost_text_model": summary(model_runs),
        "forward_passes_median": statistics.median(passes) if passes else None,
        "ghost_text_cache_hit": summary(cache_hits),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint directory (default: a tiny random one)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plain-text", action="store_true", help="a plain-text document instead of Python")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from tests.tiny_models import build_diffill

        model = str(build_diffill(Path(tempfile.mkdtemp()) / "diffill"))
    print(json.dumps(asyncio.run(measure(model, args.requests, args.threads, args.plain_text)), indent=2))


if __name__ == "__main__":
    main()

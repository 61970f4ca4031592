"""The typing load, bounded: fast typing with cancellations and document changes against real `diffill serve`s.

What a user would notice, not timings: every inline-completion request is answered (a result, or the JSON-RPC error
of a request the client cancelled), none fails, memory does not keep growing, and no process outlives the replay.
The full run (2,000 requests at 20 per second, embedded model) is `diffill bench load`; its figures are in
docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diffill.cli import main
from lsp_server import process_usage, typing_replay
from lsp_server.bench import answer_ms_by_outcome, bench_load, rss_growth
from tests.lsp.conftest import SERVER_ENV
from tests.service.conftest import FACTORY

RSS_MARGIN = 1.5  # the last quarter's memory may be this many times the second quarter's (plus RSS_SLACK_MIB)
RSS_SLACK_MIB = 64.0


def processes_of(model: Path) -> list[str]:
    """Command lines of live processes that name this test model (servers or engines left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(model) in command and "pytest" not in command and process_usage.alive(int(entry.name)):
            found.append(command)
    return found


def assert_well_answered(run: dict, requests: int) -> None:
    assert run["requests"] == requests
    assert run["failed"] == 0, run["errors"]
    assert run["answered"] + run["cancelled"] == requests  # every request: a result or the cancellation error
    assert run["superseded"] + run["cancelled"] > 0  # the load did supersede and cancel work
    growth = rss_growth(run["rss"])
    assert growth is not None
    second, last = growth
    assert last <= second * RSS_MARGIN + RSS_SLACK_MIB, run["rss"]


@pytest.mark.parametrize("servers, mode", [(1, "inprocess"), (3, "shared")])
def test_fast_typing_is_answered_without_failures_or_growing_memory(tiny_checkpoint: Path, servers: int, mode: str):
    source = typing_replay.source_stretch(typing_replay.default_source(), typing_replay.DEFAULT_START_LINE, 300)
    options = {"engine": {"mode": mode}, "completion": {"debounceMs": 0}, "model": {"threads": 1}}
    command = typing_replay.serve_command(str(tiny_checkpoint))
    run = asyncio.run(bench_load(source, command, options, servers, requests=200, rate=100.0, rss_every=20))
    assert run["engine_mode"] == mode
    assert run["engine_processes"] == (1 if mode == "shared" else 0)
    assert_well_answered(run, 200)
    assert processes_of(tiny_checkpoint) == []


def test_bench_lsp_types_a_file_through_the_default_engine_and_leaves_nothing_running(tiny_checkpoint: Path,
                                                                                       tmp_path: Path):
    out = tmp_path / "lsp.json"
    done = subprocess.run(
        [sys.executable, "-m", "diffill", "bench", "lsp", "--model", str(tiny_checkpoint), "--chars", "60",
         "--rate", "50", "--line-pause-ms", "300", "--typo-every", "7", "--out", str(out)],
        env=SERVER_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "time to ghost text" in done.stdout
    report = json.loads(out.read_text())
    # two parameter lines of TextDocument.__init__ (56 characters): cut back to the line end under 60
    assert report["file"].startswith("pygls ") and report["chars"] == 55
    assert report["typo_every"] == 7 and "a typo taken back every 7 keys" in done.stdout
    assert report["engine_mode"] == "auto" and report["engine_processes"] == 1  # the default: one shared engine
    start = report["start"]  # how long after the editor starts the server ghost text can come
    assert 0 < start["initialize_ms"] < start["ready_ms"] and "the model ready after" in done.stdout
    assert sum(report["answers"].values()) == report["keys"] and report["answers"]["error"] == 0
    assert report["answers"]["none"] == 0
    rows = report["key_records"]  # key by key, so that the cursors without ghost text can be looked at
    assert len(rows) == report["keys"] and rows[0]["key"] == rows[0]["line_before"] == " "
    assert rows[-1]["line_before"] == "        source: Optional[str] = None,"  # the second line, typed whole
    assert {kind: sum(row["answer"] == kind for row in rows) for kind in report["answers"]} == report["answers"]
    assert all(row["ghost_text"] for row in rows if row["answer"] == "items")
    assert not any(row["ghost_text"] or row["in_time"] for row in rows if row["answer"] == "cancelled")
    assert 0 < report["model_calls"] and 0 <= report["model_calls_thrown_away"] <= report["model_calls"]
    assert processes_of(tiny_checkpoint) == []


def test_the_typed_stretch_ends_at_a_line_end_so_the_rest_of_the_file_starts_on_the_next_line(tmp_path: Path):
    path = tmp_path / "code.py"
    path.write_text("import os\n\ndef f(x):\n    return x + 1\n\nprint(f(2))\n", encoding="utf-8")
    source = typing_replay.source_stretch(path, 3, 20)  # 20 characters end inside "    return x + 1"
    assert source.head == "import os\n\n" and source.typed == "def f(x):"
    assert source.tail == "\n    return x + 1\n\nprint(f(2))\n"
    assert typing_replay.source_stretch(path, 3, 9).typed == "def f(x):"  # ends at a line end already
    assert typing_replay.source_stretch(path, 3, 5).typed == "def f"  # no line end in it: cut where it says
    assert typing_replay.source_stretch(path, 6, 400).typed == "print(f(2))\n"  # to the end of the file


def test_bench_lsp_splits_the_server_time_of_answers_by_where_they_came_from():
    statuses = [{"outcome": "ok", "items": 1, "ms": 180.0, "model_ms": 170.0},
                {"outcome": "ok", "items": 2, "ms": 220.0, "model_ms": 150.0},
                {"outcome": "through", "items": 1, "ms": 40.0}, {"outcome": "cache", "items": 1, "ms": 2.0},
                {"outcome": "empty", "items": 0, "ms": 150.0}, {"outcome": "cancelled", "items": 0, "ms": 30.0}]
    assert answer_ms_by_outcome(statuses) == {
        "cache": {"answers": 1, "p50_ms": 2.0, "p95_ms": 2.0},
        # outside the engine request by request (10, 70), not the difference of the medians (30)
        "ok": {"answers": 2, "p50_ms": 180.0, "p95_ms": 220.0, "model_p50_ms": 150.0,
               "outside_model_p50_ms": 10.0, "outside_model_p95_ms": 70.0},
        "through": {"answers": 1, "p50_ms": 40.0, "p95_ms": 40.0},
    }


def test_bench_lsp_says_what_was_wrong_with_its_options(capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "lsp", "--start-line", "0"]) == 2
    assert "--start-line must be from 1" in capsys.readouterr().err
    assert main(["bench", "lsp", "--settings", "[1]"]) == 2
    assert "--settings must be a JSON object" in capsys.readouterr().err
    assert main(["bench", "lsp", "--typo-every", "-1"]) == 2
    assert "a typo every N keys needs N >= 1" in capsys.readouterr().err
    assert main(["bench", "load", "--requests", "0"]) == 2
    assert "--requests" in capsys.readouterr().err


def test_typos_are_taken_back_so_the_document_ends_as_typed_without_them():
    text = "def total(values):\n    return sum(values)\n"
    plain = typing_replay.typing_keys(text)
    keys = typing_replay.with_typos(plain, 4)
    backspaces = [i for i, key in enumerate(keys) if key.delete]
    assert len(backspaces) == len(keys) - len(plain) - len(backspaces) > 3
    for i in backspaces:  # a wrong key just before each backspace, the right key just after it
        assert keys[i - 1].insert != keys[i + 1].insert and len(keys[i - 1].insert) == 1
    document = typing_replay.Document("file:///t.py", "", "")
    for key in keys:
        document.change(key)
    assert document.text == text
    load = typing_replay.load_keys(text, 60, backspace_every=5)
    assert len(load) == 60 and sum(key.reopen for key in load) >= 1 and any(key.delete for key in load)


def test_typing_leaves_nothing_running_behind_in_the_server():
    """Each change used to stay in pygls' table of running handlers (a leak of about 2 KiB per keystroke)."""
    source = typing_replay.source_stretch(typing_replay.default_source(), typing_replay.DEFAULT_START_LINE, 120)
    command = typing_replay.serve_command() + ["--engine-factory", FACTORY, "--engine-mode", "inprocess"]
    options = {"completion": {"enabled": False}, "diagnostics": {"enabled": False}}

    async def replay() -> dict:
        async with typing_replay.servers(1, command, options) as started:
            session = typing_replay.Session(0, started[0], source)
            keys = typing_replay.load_keys(source.typed, 150)
            await typing_replay.replay([session], [keys], 200.0)
            return await started[0].client.call("diffill/debugInfo", {}, 60)

    info = asyncio.run(replay())
    assert info["running_handlers"] == 0

"""VS Code (code-server) with the packaged diffill .vsix, driven by playwright-core in Debian's headless Chromium.

`scripts/test-editors` installs node 24, code-server and playwright-core into `.editors-cache/` and packages
`editors/vscode/diffill.vsix`; without them this test skips and says so. The test starts code-server with a fresh
user-data dir and a fresh copy of the workspace, installs the .vsix, points the extension at the real
`diffill serve` with a tiny random model, and runs tests/editors/vscode/drive.mjs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.editors.code_server import NODE, CodeServer, code_server, missing, user_settings
from tests.editors.conftest import server_executable
from tests.editors.test_neovim import GREET

DRIVE = Path(__file__).resolve().parent / "vscode" / "drive.mjs"
LIMIT_S = 420  # the whole browser session; each wait inside is at most 90 s


@pytest.fixture()
def vscode(tmp_path: Path, artifacts: Path, request: pytest.FixtureRequest) -> Iterator[CodeServer]:
    """A running code-server with the .vsix installed and a workspace holding greet.py."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    tiny_model: Path = request.getfixturevalue("tiny_model")  # built only when the test can run
    settings = user_settings(server_executable(), {"model.path": str(tiny_model), "engine.mode": "inprocess"})
    with code_server(tmp_path / "vscode", {"greet.py": GREET}, settings, artifacts) as running:
        yield running


def test_ghost_text_tab_and_rewrite_in_vscode(vscode: CodeServer, tmp_path: Path, artifacts: Path) -> None:
    out = tmp_path / "outcome.json"
    proc = subprocess.run(
        ["timeout", "-k", "10", str(LIMIT_S), str(NODE), str(DRIVE), vscode.url, str(vscode.workspace / "greet.py"),
         str(out), str(artifacts)],
        env=vscode.env, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )
    context = f"exit {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    assert proc.returncode != 124, f"the browser session ran past {LIMIT_S} s\n{context}"
    assert out.exists(), context
    outcome = json.loads(out.read_text())
    results = outcome["results"]
    assert outcome["ok"], f"{outcome['error']}\nsteps: {outcome['steps']}\nresults: {results}\n{context}"

    # The status bar shows the model the server loaded, then the last request's latency.
    assert "diffill:tiny" in results["status_ready"], results["status_ready"]
    assert " ms" in results["status_after_request"] or " s " in results["status_after_request"]

    # Ghost text appeared after typing; Tab put it into the document at the cursor (read back from disk).
    assert results["ghost_text"].strip(), results
    typed = "    The greeting is printed. It"
    accepted = results["after_accept"]
    assert typed in accepted
    line = next(line for line in accepted.split("\n") if line.startswith(typed))
    assert len(line) > len(typed) or accepted.count("\n") > GREET.count("\n"), accepted
    # Everything around the accepted text is as it was.
    head, tail = GREET.split("    The greeting is printed.\n")
    assert accepted.startswith(head) and accepted.endswith(tail), accepted

    # Rewrite selection asked for an instruction, then replaced the two selected lines only.
    assert "Rewrite selection" in results["instruction_prompt"]
    before, after = results["before_rewrite"], results["after_rewrite"]
    assert after != before
    first = results["rewrite_first_line"]
    head = before.split("\n")[:first]
    tail = before.split("\n")[first + 2 :]
    assert after.split("\n")[: len(head)] == head, after
    assert after.split("\n")[len(after.split("\n")) - len(tail) :] == tail, after
    # ... as one undoable edit.
    assert results["after_undo"] == before
    assert (artifacts / "vscode-ghost-text.png").stat().st_size > 10_000
    # A click on the status bar item opened the extension's log.
    log = " ".join(results["log_panel"].replace("\xa0", " ").split())
    assert "starting" in log and "model diffill:tiny ready" in log, log

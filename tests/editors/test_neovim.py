"""Neovim 0.11, headless, with diffill.nvim and the real `diffill serve` on a tiny random model.

Each test starts `nvim --headless -u tests/editors/nvim/minimal_init.lua -c "luafile SCENARIO" FILE` under
`timeout`; the scenario types keys through Neovim's input queue, waits for what a user would see, and writes JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.editors import rule_engine
from tests.editors.conftest import ROOT, nvim_executable, server_executable

HERE = Path(__file__).resolve().parent
LIMIT_S = 180  # the `timeout` around each Neovim run; a scenario's own waits are shorter
RULE_ENGINE = "tests.editors.rule_engine:build_engine"  # scripted fills: exact ghost text without a model

GREET = '''def greet(name):
    """Say hello.

    The greeting is printed.
    It ends with a newline.
    """
    print("hello", name)
'''


def run_scenario(scenario: str, model: Path | None, tmp_path: Path, text: str = GREET, name: str = "greet.py",
                 engine_factory: str | None = None, init: str = "minimal_init.lua") -> dict[str, Any]:
    """Run a scenario script in headless Neovim on a fresh copy of `text`; its JSON outcome.

    The server loads `model`, or builds its engine with `engine_factory` (MODULE:FUNCTION) instead.
    """
    nvim, server = nvim_executable(), server_executable()
    work = tmp_path / "work"
    work.mkdir()
    (work / ".git").mkdir()  # a project root for root_markers
    document = work / name
    document.write_text(text)
    out = tmp_path / "outcome.json"
    env = {
        **os.environ,
        "DIFFILL_ROOT": str(ROOT),
        "DIFFILL_TESTS": str(HERE),
        "DIFFILL_SERVER": server,
        **({"DIFFILL_MODEL": str(model)} if model is not None else {}),
        **({"DIFFILL_ENGINE_FACTORY": engine_factory} if engine_factory is not None else {}),
        "DIFFILL_TEST_OUT": str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    command = ["timeout", "-k", "10", str(LIMIT_S), nvim, "--headless", "-i", "NONE",
               "-u", str(HERE / "nvim" / init), "-c", f"luafile {HERE / 'nvim' / scenario}", str(document)]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)
    log = tmp_path / "state" / "nvim" / "lsp.log"
    context = (f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}\n"
               f"lsp.log: {log.read_text()[-4000:] if log.exists() else '-'}")
    assert proc.returncode != 124, f"Neovim ran past {LIMIT_S} s\n{context}"
    assert out.exists(), f"the scenario wrote no outcome\n{context}"
    outcome = json.loads(out.read_text())
    assert outcome["ok"], f"{outcome['error']}\n{outcome['results']}\n{context}"
    return outcome["results"]


def test_ghost_text_appears_and_tab_accepts_it(nvim: str, tiny_model: Path, tmp_path: Path) -> None:
    results = run_scenario("ghost_text.lua", tiny_model, tmp_path)
    # <Tab> with no ghost text on screen did what <Tab> does.
    assert re.fullmatch(r'    """Say hello\. x[\t ]+y', results["fallthrough_line"]), results["fallthrough_line"]
    # Typing drew ghost text with an extmark after the cursor, in insert mode.
    assert results["ghost"], results
    assert results["extmarks"] >= 1
    assert results["mode_before_accept"].startswith("i")
    assert results["before_accept"] == "    The greeting is printed. It"
    # <Tab> put exactly the ghost text into the buffer at the cursor.
    assert results["after_accept"].startswith("    The greeting is printed. It" + results["ghost"]), results
    assert results["visible_after_esc"] is False
    # The server's diffill/status reached the statusline helper; completion items go through the omnifunc.
    assert results["status"].startswith("diffill:tiny"), results["status"]
    assert results["omnifunc"] == "v:lua.vim.lsp.omnifunc"


def test_ghost_text_drops_an_answer_for_an_older_buffer(nvim: str, tmp_path: Path) -> None:
    """An answer that arrives after the text changed (the cursor did not move) is not drawn; a fresh one is."""
    results = run_scenario("stale_ghost.lua", None, tmp_path, text=rule_engine.TEXT, name="stale.py",
                           engine_factory=RULE_ENGINE)
    # The held answer was real ghost text for the line as it was when asked...
    assert results["line_asked"] == rule_engine.OLD_LINE
    assert results["stale_answer"] == [rule_engine.OLD_FILL], results
    # ...and it arrived after the line changed under a cursor that stayed put, still in insert mode.
    assert results["line_changed"] == rule_engine.NEW_LINE
    assert results["cursor_changed"] == results["cursor_asked"]
    assert results["mode_changed"].startswith("i")
    # It was not drawn.
    assert results["ghost_after_stale"] is None, results
    assert rule_engine.OLD_FILL not in "".join(results["drawn_after_stale"]), results
    # The request for the new text drew its own answer, and only that.
    assert results["ghost_new"] == rule_engine.NEW_FILL
    assert results["drawn_new"] == [rule_engine.NEW_FILL], results


def test_tab_runs_the_users_own_mapping_when_no_ghost_text_is_shown(nvim: str, tmp_path: Path) -> None:
    """A <Tab> mapping made before setup() still works; where ghost text is shown, <Tab> accepts it instead."""
    results = run_scenario("user_tab.lua", None, tmp_path, text=rule_engine.TEXT, name="tab.py",
                           engine_factory=RULE_ENGINE, init="user_tab_init.lua")
    assert results["mapping"] == "diffill: accept ghost text"  # diffill's key is the one mapped in the buffer
    assert results["fallback_line"] == "import os [tab]"
    assert results["calls_after_fallback"] == 1
    assert results["ghost"] == rule_engine.OLD_FILL
    assert results["accepted_line"] == rule_engine.OLD_LINE + rule_engine.OLD_FILL
    assert results["calls_after_accept"] == 1


def test_ghost_text_is_accepted_a_word_and_a_line_at_a_time(nvim: str, tmp_path: Path) -> None:
    """The word and line keys insert a part of the ghost text and keep the rest shown without asking again."""
    results = run_scenario("partial.lua", None, tmp_path, text=rule_engine.MEAN_TEXT, name="mean.py",
                           engine_factory=RULE_ENGINE, init="partial_init.lua")
    line = rule_engine.MEAN_LINE
    assert results["ghost"] == rule_engine.MEAN_FILL
    word = results["word"]
    assert word["lines"][2] == line + "total"
    assert word["ghost"] == " / len(values)\n    return result"
    assert word["requests"] == results["requests_shown"]  # the rest is the same answer: no new request
    # A character typed after the part: the rest is dismissed and the plugin asks again (what the scripted engine
    # answers for a line it has no rule for does not matter here).
    typed = results["typed"]
    assert typed["lines"][2] == line + "totalx"
    assert "len(values)" not in (typed["ghost"] or ""), typed
    assert typed["requests"] > word["requests"]
    # Back where it was asked, the suggestion again; the line key takes its first line, <Tab> the rest.
    assert results["ghost_again"] == rule_engine.MEAN_FILL
    assert results["line"]["lines"][2] == line + "total / len(values)"
    assert results["line"]["ghost"] == "\n    return result"
    rest = results["rest"]
    assert rest["lines"][2:4] == [line + "total / len(values)", "    return result"], rest
    assert "return result" not in (rest["ghost"] or ""), rest  # (a new suggestion at the new cursor may show)
    assert rest["mode"].startswith("i")


def test_rewrite_changes_the_selected_lines(nvim: str, tiny_model: Path, tmp_path: Path) -> None:
    results = run_scenario("rewrite.lua", tiny_model, tmp_path)
    before, after = results["before"], results["after"]
    assert after != before
    # Lines outside the selection (lines 4 and 5) are untouched; the rewrite may have another number of lines.
    assert after[:3] == before[:3]
    assert after[-2:] == before[-2:]
    # One undo step restores the buffer.
    assert results["after_undo"] == before


def test_checkhealth_passes_and_restart_works(nvim: str, tiny_model: Path, tmp_path: Path) -> None:
    results = run_scenario("health.lua", tiny_model, tmp_path)
    report = "\n".join(results["report"])
    assert "ERROR" not in report, report
    assert "OK Neovim 0.1" in report, report
    assert "diffill serve --help` runs" in report, report
    assert f"model: {tiny_model}" in report, report
    assert "model diffill:tiny ready" in report, report
    assert results["restarted"] is True


def run_lua_units(nvim: str, tmp_path: Path, script: str) -> None:
    """Run a unit script of tests/editors/nvim (no server) and require every one of its tests to pass."""
    env = {**os.environ, "DIFFILL_ROOT": str(ROOT), "XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    proc = subprocess.run(["timeout", "60", nvim, "--headless", "--clean", "-l", str(HERE / "nvim" / script)],
                          env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"[1-9]\d* passed, 0 failed", proc.stdout + proc.stderr)


def test_lua_units(nvim: str, tmp_path: Path) -> None:
    """The plugin's own logic (options, statusline, LSP ranges in every position encoding), without a server."""
    run_lua_units(nvim, tmp_path, "unit.lua")


def test_accept_key_falls_back_to_every_kind_of_user_mapping(nvim: str, tmp_path: Path) -> None:
    """With no suggestion shown, the accept key runs the user's mapping as it was made, on both ghost-text paths."""
    run_lua_units(nvim, tmp_path, "accept_key.lua")


def test_word_and_line_keys_insert_their_part_and_keep_the_rest(nvim: str, tmp_path: Path) -> None:
    """Words and lines of a suggestion as the keys take them, the cursor and the rest drawn after them, fallbacks."""
    run_lua_units(nvim, tmp_path, "partial_accept.lua")

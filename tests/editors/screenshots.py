"""Refresh the README's screenshots: `python -m tests.editors.screenshots docs/` (scripts/test-editors --screenshots).

Both are taken in the real editors talking to the real `diffill serve`, run with the scripted demo engine
(tests/editors/demo_engine.py) so that the ghost text is readable: VS Code (code-server) in headless Chromium, and
Neovim 0.11 in a tmux pane whose contents (with colours) are rendered to PNG with Pillow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.editors.code_server import NODE, code_server, missing, user_settings
from tests.editors.demo_engine import DEMO_FILE, DEMO_FILL, DEMO_LINE, DEMO_TYPED

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FACTORY = "tests.editors.demo_engine:build_engine"
SERVER = str(Path(sys.executable).with_name("diffill"))


def vscode_screenshot(out: Path, work: Path) -> None:
    """Ghost text in VS Code."""
    reason = missing()
    if reason:
        raise SystemExit(reason)
    settings = user_settings(SERVER, {"server.args": ["--engine-factory", FACTORY], "engine.mode": "inprocess"})
    settings.update({"workbench.colorTheme": "Default Light Modern", "editor.fontSize": 15, "window.zoomLevel": 0,
                     "editor.minimap.enabled": False, "breadcrumbs.enabled": False})
    with code_server(work / "vscode", {"read_lines.py": DEMO_FILE}, settings, work / "logs") as running:
        subprocess.run(
            ["timeout", "300", str(NODE), str(HERE / "vscode" / "screenshot.mjs"), running.url, "read_lines.py",
             str(DEMO_LINE), DEMO_TYPED, DEMO_FILL, str(out)],
            env=running.env, check=True, stdin=subprocess.DEVNULL,
        )


def neovim_screenshot(out: Path, work: Path) -> None:
    """Ghost text in Neovim, typed in a tmux pane."""
    nvim = shutil.which("nvim") or str(Path(sys.executable).with_name("nvim"))
    document = work / "nvim" / "read_lines.py"
    document.parent.mkdir(parents=True)
    document.write_text(DEMO_FILE)
    env = {
        "DIFFILL_ROOT": str(ROOT), "DIFFILL_SERVER": SERVER, "DIFFILL_ENGINE_FACTORY": FACTORY,
        "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(work / "xdg"), "XDG_STATE_HOME": str(work / "xdg"),
        "XDG_DATA_HOME": str(work / "xdg"), "TERM": "xterm-256color", "COLORTERM": "truecolor",
    }
    session = f"diffill-shot-{os.getpid()}"
    exports = " ".join(f"{key}={value!s}" for key, value in env.items())
    look = work / "nvim" / "look.lua"  # line numbers, and diffill's status (model, latency) in the statusline
    look.write_text("vim.o.number = true\nvim.o.laststatus = 2\n"
                    "vim.o.statusline = \"%f %m%=%{v:lua.require'diffill'.statusline()}  %l,%c \"\n")
    command = (f"cd {document.parent} && env {exports} {nvim} -i NONE -u {HERE / 'nvim' / 'minimal_init.lua'} "
               f"-c 'luafile {look}' {document.name}")
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "92", "-y", "17", command], check=True)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-e", "-t", session], check=True,
                                  capture_output=True, text=True).stdout

        deadline = time.monotonic() + 60
        while "read_lines" not in screen():
            assert time.monotonic() < deadline, "Neovim did not show the file"
            time.sleep(0.2)
        time.sleep(3)  # let the server start and the client attach
        subprocess.run([*tmux, "send-keys", "-t", session, "-l", f"{DEMO_LINE}GA"], check=True)
        for char in DEMO_TYPED:
            subprocess.run([*tmux, "send-keys", "-t", session, "-l", char], check=True)
            time.sleep(0.1)
        deadline = time.monotonic() + 60
        while DEMO_FILL not in re.sub(r"\x1b\[[0-9;:]*m", "", screen()):
            if time.monotonic() > deadline:
                raise SystemExit(f"no ghost text in Neovim:\n{screen()}")
            time.sleep(0.2)
        time.sleep(0.3)
        text = screen()
        cursor = subprocess.run([*tmux, "display", "-p", "-t", session, "#{cursor_x} #{cursor_y}"], check=True,
                                capture_output=True, text=True).stdout.split()
        render_ansi(text, out, cursor=(int(cursor[0]), int(cursor[1])), columns=92, title="Neovim 0.11 + diffill.nvim")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


# ------------------------------------------------------------------------------------------ ANSI text to PNG

_BASIC = [(0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200), (188, 63, 188), (17, 168, 205),
          (229, 229, 229), (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67), (59, 142, 234),
          (214, 112, 214), (41, 184, 219), (255, 255, 255)]
_FG, _BG = (224, 226, 234), (20, 22, 27)


def _xterm(n: int) -> tuple[int, int, int]:
    if n < 16:
        return _BASIC[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    level = 8 + (n - 232) * 10
    return level, level, level


def _apply_sgr(params: list[int], style: dict) -> None:
    i = 0
    while i < len(params):
        p = params[i]
        if p == 0:
            style.clear()
        elif p == 1:
            style["bold"] = True
        elif p == 3:
            style["italic"] = True
        elif p == 7:
            style["reverse"] = True
        elif p in (22, 23, 27):
            style.pop({22: "bold", 23: "italic", 27: "reverse"}[p], None)
        elif 30 <= p <= 37 or 90 <= p <= 97:
            style["fg"] = _BASIC[p - 30 if p < 90 else p - 82]
        elif 40 <= p <= 47 or 100 <= p <= 107:
            style["bg"] = _BASIC[p - 40 if p < 100 else p - 92]
        elif p in (39, 49):
            style.pop("fg" if p == 39 else "bg", None)
        elif p in (38, 48) and i + 1 < len(params):
            key = "fg" if p == 38 else "bg"
            if params[i + 1] == 5 and i + 2 < len(params):
                style[key] = _xterm(params[i + 2])
                i += 2
            elif params[i + 1] == 2 and i + 4 < len(params):
                style[key] = tuple(params[i + 2 : i + 5])
                i += 4
        i += 1


def render_ansi(text: str, out: Path, cursor: tuple[int, int], columns: int, title: str) -> None:
    """Draw a terminal screen (tmux capture-pane -e) as a PNG, with a window title bar and the cursor."""
    from PIL import Image, ImageDraw, ImageFont

    fonts = {}
    for key, name in [("", "DejaVuSansMono.ttf"), ("bold", "DejaVuSansMono-Bold.ttf"),
                      ("italic", "DejaVuSansMono-Oblique.ttf")]:
        path = Path("/usr/share/fonts/truetype/dejavu") / name
        fonts[key] = ImageFont.truetype(str(path), 16) if path.exists() else ImageFont.load_default()
    cell_w, cell_h, top, pad = 10, 21, 30, 12
    lines = text.rstrip("\n").split("\n")
    image = Image.new("RGB", (columns * cell_w + 2 * pad, len(lines) * cell_h + top + pad), _BG)
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, image.width, top - 8], fill=(44, 47, 56))
    for n, color in enumerate([(255, 95, 86), (255, 189, 46), (39, 201, 63)]):
        draw.ellipse([10 + n * 20, 7, 22 + n * 20, 19], fill=color)
    draw.text((80, 4), title, font=fonts[""], fill=(200, 200, 200))
    for row, line in enumerate(lines):
        style: dict = {}
        col = 0
        for token in re.split(r"(\x1b\[[0-9;:]*m)", line):
            if token.startswith("\x1b["):
                _apply_sgr([int(p) if p else 0 for p in re.split("[;:]", token[2:-1])], style)
                continue
            for char in token:
                fg, bg = style.get("fg", _FG), style.get("bg", _BG)
                if style.get("reverse"):
                    fg, bg = bg, fg
                x, y = pad + col * cell_w, top + row * cell_h
                if bg != _BG:
                    draw.rectangle([x, y, x + cell_w - 1, y + cell_h - 1], fill=bg)
                font = fonts["bold" if style.get("bold") else "italic" if style.get("italic") else ""]
                draw.text((x, y + 1), char, font=font, fill=fg)
                col += 1
    x, y = pad + cursor[0] * cell_w, top + cursor[1] * cell_h  # insert mode: a bar cursor
    draw.rectangle([x, y + 1, x + 1, y + cell_h - 2], fill=(230, 230, 230))
    image.save(out)


def main(argv: list[str]) -> int:
    target = Path(argv[0] if argv else ROOT / "docs")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="diffill-shots-") as work:
        neovim_screenshot(target / "neovim-ghost-text.png", Path(work))
        vscode_screenshot(target / "vscode-ghost-text.png", Path(work))
    print(f"wrote {target / 'neovim-ghost-text.png'} and {target / 'vscode-ghost-text.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

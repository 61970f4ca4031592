"""Tidying a fill before the editor shows it, as the cursor's surroundings require.

The model writes a span between prefix and suffix; what an editor should insert differs in small ways that every
completion tool learns the hard way (Tabby, llama.vscode, lsp-ai): mid-line a suggestion is one line; text that
repeats what already follows the cursor (a closing bracket, the next line) is dropped; indentation follows the block
and the document's tabs-or-spaces; trailing whitespace goes.

Some of these rules can be wrong for a particular fill (the bracket at the end of `foo()` before `)` is not a
duplicate). `variants` therefore returns the candidates in order of preference, and the caller keeps the first one
that passes the syntax gate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LEADING = re.compile(r"^[ \t]*")


@dataclass(frozen=True)
class Surroundings:
    """What post-processing needs to know about the cursor."""

    line_before: str  # the cursor's line up to the cursor
    line_after: str  # the cursor's line after the cursor, without its line break
    next_lines: tuple[str, ...]  # a few lines after the cursor's line
    multiline: bool  # at a line end (or in an empty block) the fill may span lines; mid-line it may not
    indent: str  # one level of the document's indentation: "\t" or some spaces
    newline: str  # the document's line break: "\n" or "\r\n"


def variants(fill: str, at: Surroundings) -> list[str]:
    """Tidied versions of a fill, preferred first, without empty or repeated ones."""
    text = fill.replace("\r\n", "\n")
    if not at.multiline:
        text = text.split("\n", 1)[0]
    text = _match_indent_style(text, at.indent)
    if at.line_before.strip() == "" and at.line_before:
        first, newline, rest = text.partition("\n")
        if first.strip():
            text = first.lstrip(" \t") + newline + rest  # the cursor already stands at the indentation
    preferred = []
    for candidate in _reindented(text, at):
        candidate = _drop_repeated_lines(candidate.rstrip(), at.next_lines)
        trimmed = _drop_overlap(candidate, at.line_after)
        preferred += [trimmed, candidate]
    results: list[str] = []
    for candidate in preferred:
        candidate = candidate.replace("\n", at.newline)
        if candidate.strip() and candidate not in results:
            results.append(candidate)
    return results


def _match_indent_style(text: str, indent: str) -> str:
    """Leading tabs become the document's spaces, or leading runs of spaces become its tabs."""
    lines = text.split("\n")
    for index, line in enumerate(lines[1:], start=1):
        leading = _LEADING.match(line).group()  # type: ignore[union-attr]
        if indent == "\t" and " " in leading:
            leading = leading.replace("    ", "\t")
        elif indent != "\t" and "\t" in leading:
            leading = leading.replace("\t", indent)
        lines[index] = leading + line.lstrip(" \t")
    return "\n".join(lines)


def _reindented(text: str, at: Surroundings) -> list[str]:
    """The fill, and, when its later lines sit left of the block the cursor is in, the fill shifted into it.

    A model that writes the lines after the first relative to column 0 while the cursor is indented produces code
    that leaves the block; shifting them by the cursor line's indentation keeps it inside.
    """
    lines = text.split("\n")
    block = _LEADING.match(at.line_before).group()  # type: ignore[union-attr]
    later = [line for line in lines[1:] if line.strip()]
    if not block or not later or min(len(line) - len(line.lstrip(" \t")) for line in later) > 0:
        return [text]
    shifted = [lines[0]] + [block + line if line.strip() else line for line in lines[1:]]
    return ["\n".join(shifted), text]


def _drop_repeated_lines(text: str, next_lines: tuple[str, ...]) -> str:
    """Drop the fill's last lines when they repeat the lines that already follow the cursor's line."""
    lines = text.split("\n")
    following = [line.strip() for line in next_lines if line.strip()]
    if len(lines) < 2 or not following:
        return text
    for count in range(min(len(lines) - 1, len(following)), 0, -1):
        if [line.strip() for line in lines[-count:]] == following[:count]:
            return "\n".join(lines[:-count]).rstrip()
    return text


def _drop_overlap(text: str, line_after: str) -> str:
    """Drop the end of the fill that the rest of the cursor's line already has (a closing bracket, a colon)."""
    rest = line_after.strip()
    for size in range(min(len(rest), len(text)), 0, -1):
        if text.endswith(rest[:size]):
            return text[:-size].rstrip() if text[:-size].strip() else text
    return text

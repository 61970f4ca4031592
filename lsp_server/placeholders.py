"""Placeholder bodies that "Fill here" replaces: `...`, `pass`, a `TODO` comment or `todo!()` inside a function."""

from __future__ import annotations

import re

from lsp_server import conversion

_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)(?P<body>\.\.\.|pass|todo!\(\)|(?:#|//|--)[ \t]*TODO\b.*?)[ \t]*$")
_FUNCTION_HEADER = re.compile(
    r"^\s*(?:async\s+def|def|(?:export\s+)?(?:async\s+)?function|func|(?:pub(?:\(\w+\))?\s+)?(?:async\s+)?fn"
    r"|local\s+function)\b"  # keyword languages
    r"|^\s*\).*:\s*$"  # the last line of a multi-line Python signature
    r"|\)\s*(?:->\s*[^{]*|:\s*[\w<>\[\], ]+|\s+\w+(?:\s*,\s*\w+)*)?\{\s*$"  # C, Java, Go, Rust, TypeScript: ...) {
    r"|=>\s*\{\s*$"
)


def placeholder_at(text: str, line: int) -> tuple[int, int] | None:
    """Offsets of a placeholder body on `line` when the line is inside a function, else None.

    The block's header is the nearest line above with less indentation (a lone `{` defers to the line above it).
    """
    index = conversion.line_index(text)
    if not 0 <= line < index.line_count:
        return None
    start = index.starts[line]
    match = _PLACEHOLDER.match(text[start : index.line_end(line)])
    if match is None or not match.group("indent"):
        return None
    indent = len(match.group("indent"))
    lines = [text[index.starts[n] : index.line_end(n)] for n in range(max(0, line - 200), line)]
    headers = [content for content in lines if content.strip() and len(content) - len(content.lstrip(" \t")) < indent]
    if headers and headers[-1].strip() == "{" and len(headers) > 1:
        headers.pop()
        if headers[-1].rstrip().endswith(")"):
            return start + indent, start + match.end("body")
    if headers and _FUNCTION_HEADER.search(headers[-1]):
        return start + indent, start + match.end("body")
    return None

"""The syntax gate: does a candidate fill add syntax problems that the document did not already have?

Two checkers run on every document. A tree-sitter parse (when a grammar for the language is installed) reports
ERROR and MISSING nodes; a lexical bracket scan, which skips string literals and comments, reports unmatched,
mismatched and unclosed brackets. The scan runs for every language because tree-sitter sometimes recovers from a
bracket error without an ERROR node, and it is the only checker for languages without a grammar.

A fill is judged against the original document, never in isolation: documents being edited are rarely valid, and
a hole is often the only reason they are not. A problem of the filled document is "new" unless an original
problem of the same kind, moved through the edit, sits at the same place (see `check_fill`).

Offsets are character offsets (Python `str` indices) throughout; tree-sitter byte offsets are converted back.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

import tree_sitter

from infill_engine.brackets import BracketScan, Edit, filled_bracket_scan, scan_brackets

logger = logging.getLogger(__name__)


from infill_engine.problems import GateResult, SyntaxProblem  # noqa: E402 - re-exported: the gate's types


# Canonical language name -> (grammar module, function returning the language pointer).
_GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "java": ("tree_sitter_java", "language"),
    "lua": ("tree_sitter_lua", "language"),
    "json": ("tree_sitter_json", "language"),
}

SUPPORTED_LANGUAGES: tuple[str, ...] = tuple(_GRAMMARS)

# LSP languageIds and common aliases that are not themselves canonical names.
_LANGUAGE_IDS: dict[str, str] = {
    "javascriptreact": "javascript",
    "js": "javascript",
    "jsx": "javascript",
    "typescriptreact": "tsx",
    "ts": "typescript",
    "golang": "go",
    "c++": "cpp",
    "cuda-cpp": "cpp",
    "jsonc": "json",
    "python3": "python",
}

_EXTENSIONS: dict[str, str] = {
    **dict.fromkeys((".py", ".pyi", ".pyw"), "python"),
    **dict.fromkeys((".js", ".mjs", ".cjs", ".jsx"), "javascript"),
    **dict.fromkeys((".ts", ".mts", ".cts"), "typescript"),
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    **dict.fromkeys((".c", ".h"), "c"),
    **dict.fromkeys((".cc", ".cpp", ".cxx", ".c++", ".hpp", ".hh", ".hxx", ".h++", ".ipp", ".cu"), "cpp"),
    ".java": "java",
    ".lua": "lua",
    **dict.fromkeys((".json", ".jsonc"), "json"),
}


def language_for(name: str | None) -> str | None:
    """Map an LSP languageId, a file name or path, or a canonical name to a canonical language, or None."""
    if not name or not name.strip():
        return None
    key = name.strip().lower()
    if key in _GRAMMARS:
        return key
    if key in _LANGUAGE_IDS:
        return _LANGUAGE_IDS[key]
    suffix = PurePosixPath(key.replace("\\", "/")).suffix
    if not suffix and key.startswith(".") and "/" not in key:
        suffix = key  # a bare extension such as ".py" (PurePath takes it for a hidden file)
    return _EXTENSIONS.get(suffix or "." + key)


# ---------------------------------------------------------------------------------------------------------------
# tree-sitter

_PARSE_LOCK = threading.Lock()  # a Parser is not safe to share between threads
_SURROGATES = re.compile("[\ud800-\udfff]")
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))


@functools.cache
def _parser(language: str | None) -> tree_sitter.Parser | None:
    """A parser for a canonical language, built once; None when no grammar is available."""
    if language not in _GRAMMARS:
        return None
    module_name, function_name = _GRAMMARS[language]
    try:
        grammar = getattr(importlib.import_module(module_name), function_name)
        return tree_sitter.Parser(tree_sitter.Language(grammar()))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        logger.warning("no tree-sitter grammar for %s (%s: %s); using the lexical check", language, module_name, exc)
        return None


def _encode(text: str) -> bytes:
    """UTF-8 bytes of text; a lone surrogate becomes U+FFFD, which has the same length in characters and bytes."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


def _char_offsets(data: bytes, byte_offsets: set[int]) -> dict[int, int]:
    """Character offset of each byte offset into UTF-8 data, in one pass over the data."""
    result: dict[int, int] = {}
    chars = previous = 0
    for offset in sorted(byte_offsets):
        chars += len(data[previous:offset].translate(None, _CONTINUATION_BYTES))
        result[offset] = chars
        previous = offset
    return result


def _node_problems(tree: tree_sitter.Tree, data: bytes, text: str) -> list[SyntaxProblem]:
    """The outermost ERROR nodes and the MISSING nodes outside them, in character offsets.

    An ERROR node's descendants belong to the same problem and are not reported again. The walk only enters
    nodes whose subtree has an error, so a large valid region costs one visit to its root.
    """
    found: list[tuple[int, int, str, str]] = []  # (start byte, end byte, kind, missing token)
    cursor = tree.walk()
    descend = True
    while True:
        node = cursor.node
        if descend and node is not None:
            if node.is_error:
                found.append((node.start_byte, node.end_byte, "error", ""))
            elif node.is_missing:
                token = node.type if node.is_named else f"'{node.type}'"
                found.append((node.start_byte, node.end_byte, "missing", token))
            elif node.has_error and cursor.goto_first_child():
                continue
        if cursor.goto_next_sibling():
            descend = True
        elif cursor.goto_parent():
            descend = False
        else:
            break
    ascii_text = len(data) == len(text)  # then bytes are characters
    to_char = None if ascii_text else _char_offsets(data, {offset for item in found for offset in item[:2]})
    problems = []
    for start_byte, end_byte, kind, token in found:
        start, end = (start_byte, end_byte) if to_char is None else (to_char[start_byte], to_char[end_byte])
        if kind == "missing":
            message = f"missing {token}"
        else:
            snippet = text[start:end]
            short = 0 < len(snippet) <= 24 and "\n" not in snippet
            message = f"unexpected '{snippet}'" if short else "unexpected text"
        problems.append(SyntaxProblem(start, end, kind, message))
    return problems


def _parse(parser: tree_sitter.Parser, data: bytes, old_tree: tree_sitter.Tree | None = None) -> tree_sitter.Tree:
    """Parse data, reusing the unchanged parts of old_tree when given."""
    with _PARSE_LOCK:
        return parser.parse(data, old_tree) if old_tree is not None else parser.parse(data)


def _point(data: bytes, offset: int) -> tuple[int, int]:
    """(row, byte column) of a byte offset, as tree-sitter counts them."""
    return data.count(b"\n", 0, offset), offset - (data.rfind(b"\n", 0, offset) + 1)


# ---------------------------------------------------------------------------------------------------------------
# Problems of a document, and the cache of original documents


@dataclass(frozen=True)
class _Analysis:
    """A document's parse and problems, kept so that several candidates can be checked against it."""

    document: str
    brackets: BracketScan
    data: bytes | None  # UTF-8 bytes, when parsed by tree-sitter
    tree: tree_sitter.Tree | None
    problems: tuple[SyntaxProblem, ...]  # bracket and tree-sitter problems, in document order
    node_problems: tuple[SyntaxProblem, ...]  # the tree-sitter problems alone, in document order


_ORIGINALS: OrderedDict[tuple[int, str | None], _Analysis] = OrderedDict()
_ORIGINALS_SIZE = 8
_ORIGINALS_LOCK = threading.Lock()


def _sorted_problems(problems: Iterable[SyntaxProblem]) -> tuple[SyntaxProblem, ...]:
    """Problems in document order."""
    return tuple(sorted(problems, key=lambda p: (p.start, p.end, p.kind)))


def _analyse(document: str, language: str | None) -> _Analysis:
    """Parse and check a document, or take the result from the cache of recent originals.

    A document not in the cache is usually the next version of one that is (the user typed a character): it is
    then rescanned and reparsed incrementally from that version, as a filled document is from its original.
    """
    key = (hash(document), language)
    with _ORIGINALS_LOCK:
        cached = _ORIGINALS.get(key)
        if cached is not None and cached.document == document:
            _ORIGINALS.move_to_end(key)
            return cached
        previous = [a for (_, lang), a in reversed(_ORIGINALS.items()) if lang == language]
    analysis = None
    if len(document) >= VERSIONS_FROM_CHARS:
        analysis = next(filter(None, (_next_version(p, document, language) for p in previous)), None)
    if analysis is None:
        brackets = scan_brackets(document, language)
        parser = _parser(language)
        data = tree = None
        node_problems: tuple[SyntaxProblem, ...] = ()
        if parser is not None:
            data = _encode(document)
            tree = _parse(parser, data)
            node_problems = _sorted_problems(_node_problems(tree, data, document))
        problems = _sorted_problems((*brackets.problems, *node_problems))
        analysis = _Analysis(document, brackets, data, tree, problems, node_problems)
    with _ORIGINALS_LOCK:
        _ORIGINALS[key] = analysis
        _ORIGINALS.move_to_end(key)
        while len(_ORIGINALS) > _ORIGINALS_SIZE:
            _ORIGINALS.popitem(last=False)
    return analysis


# Documents of at least this many characters are derived from a previous version; a smaller one is parsed afresh
# (in a few ms), so that its problems never depend on which versions came before: an incremental parse can recover
# from an error otherwise than a fresh one does.
VERSIONS_FROM_CHARS = 1 << 16


def _next_version(previous: _Analysis, document: str, language: str | None) -> _Analysis | None:
    """The analysis of document derived incrementally from a previous version's, or None when they differ much."""
    edit = _difference(previous.document, document)
    if max(edit.end - edit.start, edit.fill_length) > len(document) // 4:
        return None
    brackets = filled_bracket_scan(previous.brackets, document, edit, language, keep_checkpoints=True)
    parser = _parser(language)
    data = tree = None
    node_problems: tuple[SyntaxProblem, ...] = ()
    if parser is not None:
        if previous.tree is None or previous.data is None:
            return None
        data, tree = _reparse(parser, previous, edit, document[edit.start : edit.start + edit.fill_length])
        node_problems = _sorted_problems(_node_problems(tree, data, document))
    problems = _sorted_problems((*brackets.problems, *node_problems))
    return _Analysis(document, brackets, data, tree, problems, node_problems)


_COMPARED = 1 << 14  # characters compared at once when looking for the first difference of two versions


def _common_length(a: str, b: str, from_end: bool) -> int:
    """How many characters a and b share at their start (or end), comparing slices rather than characters."""
    n = min(len(a), len(b))

    def same(lo: int, hi: int) -> bool:
        if from_end:
            return a[len(a) - hi : len(a) - lo] == b[len(b) - hi : len(b) - lo]
        return a[lo:hi] == b[lo:hi]

    lo = 0
    while lo < n:
        hi = min(lo + _COMPARED, n)
        if not same(lo, hi):
            break
        lo = hi
    else:
        return n
    while hi - lo > 1:  # a and b agree on [0, lo) and differ within [lo, hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if same(lo, mid) else (lo, mid)
    return lo


def _difference(old: str, new: str) -> Edit:
    """One edit that turns old into new: what lies between their common start and their common end."""
    start = _common_length(old, new, from_end=False)
    same_end = _common_length(old[start:], new[start:], from_end=True) if start < min(len(old), len(new)) else 0
    return Edit(start, len(old) - same_end, len(new) - same_end - start)


def swap_cache(
    originals: OrderedDict[tuple[int, str | None], _Analysis] | None = None,
) -> OrderedDict[tuple[int, str | None], _Analysis]:
    """Put originals (an empty cache when None) in place of the cache of parsed originals; return the one replaced.

    For benchmarks that compare ways of gating in one run, each with its own cache.
    """
    global _ORIGINALS
    with _ORIGINALS_LOCK:
        replaced, _ORIGINALS = _ORIGINALS, originals if originals is not None else OrderedDict()
    return replaced


def find_problems(document: str, language: str | None) -> list[SyntaxProblem]:
    """All syntax problems of a document: tree-sitter ERROR/MISSING nodes plus lexical bracket problems.

    The lexical check alone runs when the language has no grammar (None or unknown). ERROR nodes are reported
    outermost only: MISSING nodes and ERROR nodes inside an ERROR node are part of it.
    """
    return list(_analyse(document, language_for(language)).problems)


def _filled_problems(
    original: _Analysis, edit: Edit, fill: str, language: str | None, window: bool = True
) -> tuple[SyntaxProblem, ...]:
    """Problems of the original document with the edit applied, rescanned and reparsed incrementally.

    The bracket scan always covers the whole document (it resumes before the edit and stops where it meets the
    original scan again). The parse covers a window around the edit in a large document (`_window_problems`),
    and the whole document, incrementally, when the window cannot stand for it.
    """
    document = original.document
    filled = document[: edit.start] + fill + document[edit.end :]
    problems = list(filled_bracket_scan(original.brackets, filled, edit, language).problems)
    parser = _parser(language)
    if parser is not None and original.tree is not None and original.data is not None:
        node_problems = None
        if window and len(original.data) >= WINDOW_FROM_BYTES:
            old = _OldProblems(original.problems, edit)
            failed = not all(old.explain(p) for p in problems)  # a new bracket problem: the fill fails whatever
            node_problems = _window_problems(parser, original, edit, fill, filled, failed)
        if node_problems is None:
            data, tree = _reparse(parser, original, edit, fill)
            node_problems = _node_problems(tree, data, filled)
        problems += node_problems
    return _sorted_problems(problems)


def _byte_range(original: _Analysis, edit: Edit) -> tuple[int, int]:
    """The edit's start and end as byte offsets into the original's UTF-8 data."""
    assert original.data is not None
    document = original.document
    ascii_document = len(original.data) == len(document)
    start_byte = edit.start if ascii_document else len(_encode(document[: edit.start]))
    return start_byte, start_byte + len(_encode(document[edit.start : edit.end]))


def _reparse(
    parser: tree_sitter.Parser, original: _Analysis, edit: Edit, fill: str
) -> tuple[bytes, tree_sitter.Tree]:
    """The UTF-8 data and the tree of the original with the edit applied, reparsed incrementally."""
    assert original.data is not None and original.tree is not None
    data = original.data
    start_byte, end_byte = _byte_range(original, edit)
    filled_data = data[:start_byte] + _encode(fill) + data[end_byte:]
    new_end_byte = len(filled_data) - (len(data) - end_byte)
    old_tree = original.tree.copy()  # the cached tree stays as it is for the next candidate
    old_tree.edit(
        start_byte=start_byte,
        old_end_byte=end_byte,
        new_end_byte=new_end_byte,
        start_point=_point(data, start_byte),
        old_end_point=_point(data, end_byte),
        new_end_point=_point(filled_data, new_end_byte),
    )
    return filled_data, _parse(parser, filled_data, old_tree)


# ---------------------------------------------------------------------------------------------------------------
# A window of a large document

WINDOW_FROM_BYTES = 1 << 16  # documents of at least this many bytes are parsed in a window around a fill


@dataclass(frozen=True)
class _Window:
    """Top-level nodes of the original around an edit, which parse alone as they do in the whole document."""

    start_byte: int
    end_byte: int
    start: int  # character offsets of the same range
    end: int
    first: tree_sitter.Node | None  # the top-level node the window starts with (None: it starts the document)
    last: tree_sitter.Node | None  # the top-level node it ends with (None: it ends the document)
    problems: tuple[SyntaxProblem, ...]  # the original's tree-sitter problems in the window (document offsets)


_WINDOWS: OrderedDict[tuple[int, int, int], tuple[_Analysis, _Window | None]] = OrderedDict()
_WINDOWS_LOCK = threading.Lock()


def _window_problems(
    parser: tree_sitter.Parser, original: _Analysis, edit: Edit, fill: str, filled: str, failed: bool
) -> list[SyntaxProblem] | None:
    """The tree-sitter problems of the filled document, parsing only the top-level nodes around the edit.

    Parsing in a window gives the whole document's problems when the window starts and ends where the parser is
    between two top-level nodes: the window is the top-level nodes that the edit touches and one untouched node
    on each side, kept only when the original window, parsed alone, has the same problems and the same first and
    last node as the whole document has there (`_window_for`), and when the filled window, parsed alone, still
    starts and ends with those two nodes. A problem that the filled window adds is the whole document's only
    when the fill fails anyway (`failed`: it adds a bracket problem, which the bracket scan of the whole document
    found): the window may have cut a comment or string that the document closes further on. Otherwise (None)
    the caller reparses the whole document.
    """
    assert original.data is not None
    start_byte, end_byte = _byte_range(original, edit)
    window = _window_for(parser, original, start_byte, end_byte)
    if window is None:
        return None
    data = original.data
    fill_data = _encode(fill)
    shift_bytes = len(fill_data) - (end_byte - start_byte)
    window_data = data[window.start_byte : start_byte] + fill_data + data[end_byte : window.end_byte]
    tree = _parse(parser, window_data)
    root = tree.root_node
    first = root.child(0) if window.first is not None and root.child_count else None
    last = root.child(root.child_count - 1) if window.last is not None and root.child_count else None
    same_ends = root.type == original.tree.root_node.type and _same_node(first, window.first, -window.start_byte) \
        and _same_node(last, window.last, shift_bytes - window.start_byte)
    if not same_ends and not failed:  # the fill reaches past the window: only the whole document can tell
        return None
    text = filled[window.start : window.end + edit.shift]
    inside = [
        SyntaxProblem(p.start + window.start, p.end + window.start, p.kind, p.message)
        for p in _node_problems(tree, window_data, text)
    ]
    # A problem the window adds may be the window's own (a comment opened in it that the whole document closes
    # further on): only the whole document can tell.
    old = _OldProblems(window.problems, edit)
    if not failed and not all(old.explain(p) for p in inside):
        return None
    before = [p for p in original.node_problems if p.end <= window.start]
    after = [
        SyntaxProblem(p.start + edit.shift, p.end + edit.shift, p.kind, p.message)
        for p in original.node_problems if p.start >= window.end
    ]
    return [*before, *inside, *after]


def _same_node(node: tree_sitter.Node | None, expected: tree_sitter.Node | None, shift: int) -> bool:
    """Whether node is expected (a clean node of the whole document's tree) with its byte range shifted."""
    if expected is None:
        return True
    return (
        node is not None and not node.has_error and node.type == expected.type
        and node.start_byte == expected.start_byte + shift and node.end_byte == expected.end_byte + shift
    )


def _first_child_ending_after(tree: tree_sitter.Tree, byte: int) -> tree_sitter.Node | None:
    """The first top-level node that ends after byte, or None.

    Through a cursor: `Node.first_child_for_byte` crashes the interpreter when there is none (tree-sitter 0.26).
    """
    cursor = tree.walk()
    return cursor.node if cursor.goto_first_child_for_byte(byte) is not None else None


def _window_for(parser: tree_sitter.Parser, original: _Analysis, start_byte: int, end_byte: int) -> _Window | None:
    """The window of the original around bytes [start_byte, end_byte), or None when none stands for the document."""
    assert original.tree is not None and original.data is not None
    root = original.tree.root_node
    first = _first_child_ending_after(original.tree, start_byte)
    if first is not None:
        first = first.prev_sibling
    elif root.child_count:  # the edit is past every top-level node
        first = root.child(root.child_count - 1)
    while first is not None and first.end_byte >= start_byte:
        first = first.prev_sibling
    last = _first_child_ending_after(original.tree, end_byte)
    while last is not None and last.start_byte <= end_byte:
        last = last.next_sibling
    data = original.data
    window_start = first.start_byte if first is not None else 0
    window_end = last.end_byte if last is not None else len(data)
    if window_end - window_start > len(data) // 2:
        return None
    key = (id(original), window_start, window_end)
    with _WINDOWS_LOCK:
        if key in _WINDOWS and _WINDOWS[key][0] is original:
            return _WINDOWS[key][1]
    window = _checked_window(parser, original, first, last, window_start, window_end)
    with _WINDOWS_LOCK:
        _WINDOWS[key] = (original, window)
        while len(_WINDOWS) > _ORIGINALS_SIZE:
            _WINDOWS.popitem(last=False)
    return window


def _checked_window(
    parser: tree_sitter.Parser,
    original: _Analysis,
    first: tree_sitter.Node | None,
    last: tree_sitter.Node | None,
    start_byte: int,
    end_byte: int,
) -> _Window | None:
    """The window, if the original's text in it parses alone as it does in the whole document."""
    assert original.data is not None
    for node in (first, last):
        if node is not None and (node.has_error or node.is_missing):
            return None
    data = original.data
    if len(data) == len(original.document):
        start, end = start_byte, end_byte
    else:
        offsets = _char_offsets(data, {start_byte, end_byte})
        start, end = offsets[start_byte], offsets[end_byte]
    window_data = data[start_byte:end_byte]
    tree = _parse(parser, window_data)
    root = tree.root_node
    if not root.child_count or not _same_node(root.child(0) if first is not None else None, first, -start_byte) \
            or not _same_node(root.child(root.child_count - 1) if last is not None else None, last, -start_byte):
        return None
    alone = [
        SyntaxProblem(p.start + start, p.end + start, p.kind, p.message)
        for p in _node_problems(tree, window_data, original.document[start:end])
    ]
    inside = tuple(p for p in original.node_problems if p.start < end and p.end > start)
    if any(p.start < start or p.end > end for p in inside) or _sorted_problems(alone) != inside:
        return None
    return _Window(start_byte, end_byte, start, end, first, last, inside)


# ---------------------------------------------------------------------------------------------------------------
# The gate


class _OldProblems:
    """The original document's problems moved through an edit, to tell which problems of the filled one are new."""

    def __init__(self, problems: Iterable[SyntaxProblem], edit: Edit) -> None:
        self.starts = {(p.kind, edit.moved(p.start)) for p in problems}
        errors = sorted((edit.moved(p.start), edit.moved(p.end)) for p in problems if p.kind == "error")
        self.error_starts = [start for start, _ in errors]
        self.widest_end: list[int] = []  # widest_end[i]: the largest end among errors[: i + 1], at least start + 1
        for start, end in errors:
            self.widest_end.append(max(end, start + 1, self.widest_end[-1] if self.widest_end else 0))

    def explain(self, problem: SyntaxProblem) -> bool:
        """Whether an old problem explains this one: same kind and start, or an overlapping ERROR node."""
        if (problem.kind, problem.start) in self.starts:
            return True
        if problem.kind != "error":
            return False
        # Among the old errors starting before this one ends (empty ranges count one character), does any reach
        # past its start?
        count = bisect.bisect_left(self.error_starts, max(problem.end, problem.start + 1))
        return count > 0 and self.widest_end[count - 1] > problem.start


def check_fill(
    document: str, start: int, end: int, fill: str, language: str | None, *, window: bool = True
) -> GateResult:
    """Would replacing document[start:end] with fill add syntax problems that were not there before?

    The edit is first narrowed to the text that changes (the fill may repeat the start or end of what it replaces).
    Each original problem is moved through it: offsets at or after its end shift by the change in length, offsets
    inside it go to its start. A problem of the filled document is old when an original problem
    of the same kind moved to the same start, or, for ERROR nodes (which grow and shrink as the parser recovers
    differently), when it overlaps the moved range of an original ERROR node. Every other problem is new, and
    the fill passes when there is none.

    In a large document the parse covers only the top-level nodes around the fill when that gives the whole
    document's verdict (`_window_problems`); `window=False` always reparses the whole document (for comparison).
    """
    if not 0 <= start <= end <= len(document):
        raise ValueError(f"fill range [{start}, {end}) is not inside a document of {len(document)} characters")
    canonical = language_for(language)
    original = _analyse(document, canonical)
    # Only the text that changes is edited: a fill that repeats the start or the end of what it replaces leaves the
    # problems there where they were (old), instead of moving them to the edit's start (new).
    replaced = document[start:end]
    same_start = len(os.path.commonprefix([fill, replaced]))
    same_end = len(os.path.commonprefix([fill[same_start:][::-1], replaced[same_start:][::-1]]))
    changed = fill[same_start : len(fill) - same_end]
    edit = Edit(start + same_start, end - same_end, len(changed))
    after = _filled_problems(original, edit, changed, canonical, window)
    old = _OldProblems(original.problems, edit)
    unprintable = _unprintable(changed, edit.start)
    new_problems = tuple(p for p in after if not old.explain(p)) + unprintable
    if new_problems:
        logger.debug("fill %r adds %d syntax problem(s), first: %s", fill[:40], len(new_problems), new_problems[0])
    return GateResult(
        ok=not new_problems,
        new_problems=new_problems,
        problems_before=len(original.problems),
        problems_after=len(after) + len(unprintable),
        checker=checker_for(canonical),
    )


def checker_for(language: str | None) -> str:
    """What gates fills in `language` here: "tree-sitter:NAME" where its grammar is installed, else "lexical"."""
    canonical = language_for(language)
    return f"tree-sitter:{canonical}" if _parser(canonical) is not None else "lexical"


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def _unprintable(fill: str, start: int) -> tuple[SyntaxProblem, ...]:
    """Control characters (other than tab and line breaks) and U+FFFD in a fill: never code a model should write.

    Byte-level tokenizers can decode a partial UTF-8 sequence to U+FFFD; inside a comment or a string the parser
    would accept such text, so it is caught here, as a problem of kind "text".
    """
    return tuple(
        SyntaxProblem(start + m.start(), start + m.end(), "text", f"unprintable character U+{ord(m.group()):04X}")
        for m in _UNPRINTABLE.finditer(fill)
    )


def rank_key(result: GateResult) -> tuple[bool, int, int]:
    """Sort key for candidates: passing ones first, then those leaving fewer problems."""
    return (not result.ok, result.problems_after, len(result.new_problems))


def problems_in_fill(result: GateResult, start: int, fill: str, margin: int = 0) -> list[tuple[int, int]]:
    """Range of each new problem relative to the fill text, widened by margin and clamped to the fill.

    A problem outside the fill is clamped to the fill's nearest end; a range left empty grows to one character
    (when the fill has one), so that a repair step always has something to act on.
    """
    ranges = []
    for problem in result.new_problems:
        begin = min(max(problem.start - start - margin, 0), len(fill))
        finish = min(max(problem.end - start + margin, 0), len(fill))
        if begin == finish and fill:
            begin, finish = (begin, begin + 1) if begin < len(fill) else (begin - 1, begin)
        ranges.append((begin, finish))
    return ranges

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


_ORIGINALS: OrderedDict[tuple[int, str | None], _Analysis] = OrderedDict()
_ORIGINALS_SIZE = 8
_ORIGINALS_LOCK = threading.Lock()


def _sorted_problems(problems: Iterable[SyntaxProblem]) -> tuple[SyntaxProblem, ...]:
    """Problems in document order."""
    return tuple(sorted(problems, key=lambda p: (p.start, p.end, p.kind)))


def _analyse(document: str, language: str | None) -> _Analysis:
    """Parse and check a document, or take the result from the cache of recent originals."""
    key = (hash(document), language)
    with _ORIGINALS_LOCK:
        cached = _ORIGINALS.get(key)
        if cached is not None and cached.document == document:
            _ORIGINALS.move_to_end(key)
            return cached
    brackets = scan_brackets(document, language)
    parser = _parser(language)
    data = tree = None
    node_problems: list[SyntaxProblem] = []
    if parser is not None:
        data = _encode(document)
        tree = _parse(parser, data)
        node_problems = _node_problems(tree, data, document)
    analysis = _Analysis(document, brackets, data, tree, _sorted_problems((*brackets.problems, *node_problems)))
    with _ORIGINALS_LOCK:
        _ORIGINALS[key] = analysis
        _ORIGINALS.move_to_end(key)
        while len(_ORIGINALS) > _ORIGINALS_SIZE:
            _ORIGINALS.popitem(last=False)
    return analysis


def find_problems(document: str, language: str | None) -> list[SyntaxProblem]:
    """All syntax problems of a document: tree-sitter ERROR/MISSING nodes plus lexical bracket problems.

    The lexical check alone runs when the language has no grammar (None or unknown). ERROR nodes are reported
    outermost only: MISSING nodes and ERROR nodes inside an ERROR node are part of it.
    """
    return list(_analyse(document, language_for(language)).problems)


def _filled_problems(original: _Analysis, edit: Edit, fill: str, language: str | None) -> tuple[SyntaxProblem, ...]:
    """Problems of the original document with the edit applied, rescanned and reparsed incrementally."""
    document = original.document
    filled = document[: edit.start] + fill + document[edit.end :]
    problems = list(filled_bracket_scan(original.brackets, filled, edit, language).problems)
    parser = _parser(language)
    if parser is not None and original.tree is not None and original.data is not None:
        data = original.data
        ascii_document = len(data) == len(document)
        start_byte = edit.start if ascii_document else len(_encode(document[: edit.start]))
        end_byte = start_byte + len(_encode(document[edit.start : edit.end]))
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
        problems += _node_problems(_parse(parser, filled_data, old_tree), filled_data, filled)
    return _sorted_problems(problems)


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


def check_fill(document: str, start: int, end: int, fill: str, language: str | None) -> GateResult:
    """Would replacing document[start:end] with fill add syntax problems that were not there before?

    The edit is first narrowed to the text that changes (the fill may repeat the start or end of what it replaces).
    Each original problem is moved through it: offsets at or after its end shift by the change in length, offsets
    inside it go to its start. A problem of the filled document is old when an original problem
    of the same kind moved to the same start, or, for ERROR nodes (which grow and shrink as the parser recovers
    differently), when it overlaps the moved range of an original ERROR node. Every other problem is new, and
    the fill passes when there is none.
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
    after = _filled_problems(original, edit, changed, canonical)
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
        checker=f"tree-sitter:{canonical}" if _parser(canonical) is not None else "lexical",
    )


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

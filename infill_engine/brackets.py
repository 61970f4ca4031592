"""The lexical bracket scan: unmatched, mismatched and unclosed brackets, outside string literals and comments.

It runs for every language (tree-sitter sometimes recovers from a bracket error without an ERROR node) and is the
only check for languages without a grammar. A scan keeps checkpoints, so that a filled document is scanned again
only from just before the hole and stops once it meets the original scan in the same state (`filled_bracket_scan`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from infill_engine.problems import SyntaxProblem


_OPENER_OF = {")": "(", "]": "[", "}": "{"}

_LINE_COMMENT = r"//[^\n]*"
_HASH_COMMENT = r"\#[^\n]*"
_BLOCK_COMMENT = r"/\*.*?(?:\*/|\Z)"  # an unterminated block comment runs to the end, as in the language
# Single-line strings only match when closed on their line, and never look past it (`_Checkpoint` relies on this).
_DQ_LINE = r'"[^"\\\n]*(?:\\[^\n][^"\\\n]*)*"'
_SQ_LINE = r"'[^'\\\n]*(?:\\[^\n][^'\\\n]*)*'"
# Multi-line constructs run to the end of the text when unterminated, and always match once started (a final lone
# backslash included: `\\.?`), so that whether they match never depends on text far ahead.
_DQ_MULTILINE = r'"[^"\\]*(?:\\.?[^"\\]*)*(?:"|\Z)'
_TRIPLE_DQ = r'"""[^"\\]*(?:(?:\\.?|"(?!""))[^"\\]*)*(?:"""|\Z)'
_TRIPLE_SQ = r"'''[^'\\]*(?:(?:\\.?|'(?!''))[^'\\]*)*(?:'''|\Z)"
_TEMPLATE = r"`[^`\\]*(?:\\.?[^`\\]*)*(?:`|\Z)"
_BACKTICK_LINE = r"`[^`\\\n]*(?:\\[^\n][^`\\\n]*)*`"
_GO_RAW = r"`[^`]*(?:`|\Z)"
# A character literal: 'x', '\n', '\x7f', '\u{1F600}'. Rust lifetimes ('a) and lone apostrophes do not match.
_CHAR = r"'(?:\\(?:u\{[0-9A-Fa-f]{1,6}\}|u[0-9A-Fa-f]{4}|x[0-9A-Fa-f]{2}|[0-7]{1,3}|[^\n])|[^'\\\n])'"
_RUST_RAW = r'(?<![A-Za-z0-9_])b?r(?P<hashes>\#*)".*?(?:"(?P=hashes)|\Z)'
_CPP_RAW = r'(?<![A-Za-z0-9_])(?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\(.*?(?:\)(?P=delim)"|\Z)'
_LUA_LONG_COMMENT = r"--\[(?P<ceq>=*)\[.*?(?:\](?P=ceq)\]|\Z)"
_LUA_LONG_STRING = r"\[(?P<seq>=*)\[.*?(?:\](?P=seq)\]|\Z)"

# What the scan skips, per lexical family, in priority order (earlier alternatives win at the same position).
_SKIPPED: dict[str, tuple[str, ...]] = {
    "python": (_HASH_COMMENT, _TRIPLE_DQ, _TRIPLE_SQ, _DQ_LINE, _SQ_LINE),
    "javascript": (_LINE_COMMENT, _BLOCK_COMMENT, _TEMPLATE, _DQ_LINE, _SQ_LINE),
    "go": (_LINE_COMMENT, _BLOCK_COMMENT, _GO_RAW, _DQ_LINE, _CHAR),
    "rust": (_LINE_COMMENT, _BLOCK_COMMENT, _RUST_RAW, _DQ_MULTILINE, _CHAR),
    "c": (_LINE_COMMENT, _BLOCK_COMMENT, _DQ_LINE, _CHAR),
    "cpp": (_LINE_COMMENT, _BLOCK_COMMENT, _CPP_RAW, _DQ_LINE, _CHAR),
    "java": (_LINE_COMMENT, _BLOCK_COMMENT, _TRIPLE_DQ, _DQ_LINE, _CHAR),
    "lua": (_LUA_LONG_COMMENT, r"--[^\n]*", _LUA_LONG_STRING, _DQ_LINE, _SQ_LINE),
    "json": (_LINE_COMMENT, _BLOCK_COMMENT, _DQ_LINE),  # comments for jsonc
    "unknown": (_HASH_COMMENT, _LINE_COMMENT, _BLOCK_COMMENT, _DQ_LINE, _SQ_LINE, _BACKTICK_LINE),
}
_FAMILY = {"typescript": "javascript", "tsx": "javascript"}


@functools.cache
def _scanner(language: str | None) -> re.Pattern[str]:
    """The token pattern of a language's lexical family: skipped strings and comments, or one bracket."""
    family = _FAMILY.get(language or "", language or "")
    skipped = _SKIPPED.get(family, _SKIPPED["unknown"])
    return re.compile("|".join((*skipped, r"(?P<bracket>[()\[\]{}])")), re.DOTALL)


CHECKPOINT_EVERY = 256  # brackets between two checkpoints of a scan
_CHECKPOINT_MAX_DEPTH = 64  # no checkpoint where more brackets are open (bounds memory on pathological text)


@dataclass(frozen=True)
class _Checkpoint:
    """The state of a bracket scan just after a bracket, from which it can be resumed."""

    offset: int  # where the scan resumes: just after the bracket
    stack: tuple[tuple[str, int], ...]  # open brackets, (opener, offset), innermost last
    reported: int  # problems reported before this point


_START = _Checkpoint(0, (), 0)


@dataclass(frozen=True)
class BracketScan:
    """Bracket problems of a text, in the order the scan found them, and checkpoints to resume the scan from."""

    problems: tuple[SyntaxProblem, ...]  # closers as met, then the openers left unclosed
    checkpoints: tuple[_Checkpoint, ...]


@dataclass(frozen=True)
class Edit:
    """document[start:end] replaced by a fill of fill_length characters."""

    start: int
    end: int
    fill_length: int

    @property
    def shift(self) -> int:
        """How far the text after the edit moves."""
        return self.fill_length - (self.end - self.start)

    def moved(self, offset: int) -> int:
        """Where an offset of the original document lands in the filled one."""
        return offset + self.shift if offset >= self.end else min(offset, self.start)


@dataclass(frozen=True)
class _Resync:
    """Lets a scan of the filled document stop where it meets the original scan in the same state."""

    original: BracketScan
    edit: Edit
    checkpoints: dict[int, _Checkpoint]  # the original's checkpoints after the edit, by offset in the filled text

    def rest(self, offset: int, stack: list[tuple[str, int]]) -> list[SyntaxProblem] | None:
        """The problems after offset, taken from the original scan, if the filled scan's state there is the same."""
        checkpoint = self.checkpoints[offset]
        if [(opener, self.edit.moved(at)) for opener, at in checkpoint.stack] != stack:
            return None
        rest = []
        for problem in self.original.problems[checkpoint.reported :]:  # each on one bracket
            at = self.edit.moved(problem.start)
            rest.append(SyntaxProblem(at, at + 1, problem.kind, problem.message))
        return rest

    def later_checkpoints(self, offset: int, reported: int) -> tuple[_Checkpoint, ...]:
        """The original's checkpoints after the one at offset (filled text), moved into the filled text."""
        at = self.checkpoints[offset]
        return tuple(
            _Checkpoint(cp.offset + self.edit.shift, tuple((opener, self.edit.moved(o)) for opener, o in cp.stack),
                        cp.reported - at.reported + reported)
            for cp in self.original.checkpoints if cp.offset > at.offset
        )


def scan_brackets(
    text: str,
    language: str | None,
    resume: _Checkpoint = _START,
    reported: tuple[SyntaxProblem, ...] = (),
    resync: _Resync | None = None,
    keep_checkpoints: bool = False,
) -> BracketScan:
    """Unexpected, mismatched and unclosed brackets outside strings and comments.

    The scan can resume from a checkpoint, given the problems reported before it, and stop early where `resync`
    says that the rest is known; with `keep_checkpoints` it then still returns checkpoints (its own and the
    original's after that point), so that the result can serve as an original itself.
    """
    problems = list(reported)
    stack = list(resume.stack)
    checkpoints: list[_Checkpoint] = []
    brackets = 0
    for match in _scanner(language).finditer(text, resume.offset):
        if match.lastgroup != "bracket":
            continue
        brackets += 1
        bracket, offset = match.group(), match.start()
        opener = _OPENER_OF.get(bracket)
        if opener is None:
            stack.append((bracket, offset))
        elif not stack:
            problems.append(SyntaxProblem(offset, offset + 1, "bracket", f"unexpected '{bracket}'"))
        elif stack[-1][0] == opener:
            stack.pop()
        else:
            message = f"'{bracket}' does not match '{stack[-1][0]}'"
            problems.append(SyntaxProblem(offset, offset + 1, "bracket", message))
            # Recover: a closer that matches a deeper opener closes it and the openers above it (already reported
            # by this mismatch); one that matches nothing is dropped.
            for depth in range(len(stack) - 2, -1, -1):
                if stack[depth][0] == opener:
                    del stack[depth:]
                    break
        if resync is not None:
            rest = resync.rest(match.end(), stack) if match.end() in resync.checkpoints else None
            if rest is not None:
                later = resync.later_checkpoints(match.end(), len(problems)) if keep_checkpoints else ()
                return BracketScan((*problems, *rest), (*checkpoints, *later) if keep_checkpoints else ())
        if (resync is None or keep_checkpoints) and brackets % CHECKPOINT_EVERY == 0 \
                and len(stack) <= _CHECKPOINT_MAX_DEPTH:
            checkpoints.append(_Checkpoint(match.end(), tuple(stack), len(problems)))
    problems.extend(SyntaxProblem(offset, offset + 1, "bracket", f"unclosed '{opener}'") for opener, offset in stack)
    return BracketScan(tuple(problems), tuple(checkpoints))


def filled_bracket_scan(
    original: BracketScan, filled: str, edit: Edit, language: str | None, keep_checkpoints: bool = False
) -> BracketScan:
    """Bracket problems of the filled document, rescanning only from the last safe checkpoint before the edit.

    A checkpoint is safe when a newline lies between it and the edit: tokens before it ended there, and the
    patterns that failed before it looked no further than the end of their line. With `keep_checkpoints` the scan
    has checkpoints all through, as a full scan of the filled document has (for a new version of a document).
    """
    last_newline = filled.rfind("\n", 0, edit.start)
    resume = _START
    for checkpoint in original.checkpoints:
        if checkpoint.offset > last_newline:
            break
        resume = checkpoint
    after_edit = {cp.offset + edit.shift: cp for cp in original.checkpoints if cp.offset > edit.end}
    resync = _Resync(original, edit, after_edit)
    scan = scan_brackets(filled, language, resume, original.problems[: resume.reported], resync, keep_checkpoints)
    if not keep_checkpoints:
        return scan
    before = tuple(cp for cp in original.checkpoints if cp.offset <= resume.offset)
    return BracketScan(scan.problems, (*before, *scan.checkpoints))

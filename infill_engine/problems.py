"""What the syntax gate reports: problems as character offsets, and its verdict on one fill."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyntaxProblem:
    """One syntax problem, as character offsets into the document it was found in."""

    start: int  # character offset (Python str index)
    end: int  # exclusive character offset
    kind: str  # "error" (tree-sitter ERROR node), "missing" (MISSING node), "bracket" (lexical bracket problem),
    #            "text" (an unprintable character in a fill)
    message: str  # human readable, e.g. "missing ')'", "unexpected 'x'", "unclosed '('"


@dataclass(frozen=True)
class GateResult:
    """The verdict on one candidate fill."""

    ok: bool  # True if the fill adds no new problem
    new_problems: tuple[SyntaxProblem, ...]  # problems of the filled document (its offsets) not there before
    problems_before: int  # number of problems in the original document
    problems_after: int  # number of problems in the filled document
    checker: str  # "tree-sitter:<language>" or "lexical"

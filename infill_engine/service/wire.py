"""The engine's dataclasses as plain msgpack dicts, and back: the only place that converts them.

InfillRequest goes in as a dict of its fields; InfillResult comes out with its candidates (text, token ids, score,
repairs, gate verdict), the rejected ones and the FillStats fields. Bad input raises ValueError saying what is wrong.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from infill_engine.request import Candidate, InfillRequest, InfillResult
from infill_engine.stats import FillStats
from infill_engine.syntax import GateResult, SyntaxProblem

_REQUEST_FIELDS = {f.name for f in fields(InfillRequest)}
_STATS_FIELDS = {f.name for f in fields(FillStats)}


def request_to_wire(request: InfillRequest) -> dict[str, Any]:
    """The request's fields."""
    return asdict(request)


def request_from_wire(data: Any) -> InfillRequest:
    """A validated request; ValueError names unknown or missing fields and bad values."""
    if not isinstance(data, dict):
        raise ValueError(f"a request must be a map of InfillRequest fields (got {type(data).__name__})")
    unknown = sorted(set(map(str, data)) - _REQUEST_FIELDS)
    if unknown:
        raise ValueError(f"unknown request fields: {', '.join(unknown)}")
    missing = sorted({"prefix", "suffix"} - set(data))
    if missing:
        raise ValueError(f"missing request fields: {', '.join(missing)}")
    request = InfillRequest(**data)
    request.validate()
    for name in ("language", "seed", "repair_rounds", "budget_ms"):
        value = getattr(request, name)
        if value is not None and not isinstance(value, str if name == "language" else int):
            raise ValueError(f"{name} has the wrong type ({type(value).__name__})")
    if not all(isinstance(getattr(request, name), bool) for name in ("gate", "single_line", "require_content")):
        raise ValueError("gate, single_line and require_content must each be true or false")
    return request


def result_to_wire(result: InfillResult) -> dict[str, Any]:
    """Candidates, rejected candidates and stats as plain data."""
    return {
        "candidates": [_candidate_to_wire(c) for c in result.candidates],
        "rejected": [_candidate_to_wire(c) for c in result.rejected],
        "stats": asdict(result.stats),
    }


def result_from_wire(data: Any) -> InfillResult:
    """The result an engine sent (ValueError when it is not one)."""
    try:
        stats = FillStats(**{k: v for k, v in data["stats"].items() if k in _STATS_FIELDS})
        return InfillResult(
            [_candidate_from_wire(c) for c in data["candidates"]],
            [_candidate_from_wire(c) for c in data["rejected"]],
            stats,
        )
    except (KeyError, TypeError, AttributeError) as failure:
        raise ValueError(f"the engine sent a malformed result ({failure!r})") from None


def _candidate_to_wire(candidate: Candidate) -> dict[str, Any]:
    gate = candidate.gate
    return {
        "text": candidate.text,
        "token_ids": list(candidate.token_ids),
        "score": float(candidate.score),
        "repairs": candidate.repairs,
        "lowest": float(candidate.lowest),
        "gate": None if gate is None else {
            "ok": gate.ok,
            "problems": [asdict(p) for p in gate.new_problems],
            "problems_before": gate.problems_before,
            "problems_after": gate.problems_after,
            "checker": gate.checker,
        },
    }


def _candidate_from_wire(data: dict[str, Any]) -> Candidate:
    gate = data["gate"]
    verdict = None if gate is None else GateResult(
        ok=gate["ok"], new_problems=tuple(SyntaxProblem(**p) for p in gate["problems"]),
        problems_before=gate["problems_before"], problems_after=gate["problems_after"], checker=gate["checker"],
    )
    return Candidate(data["text"], list(data["token_ids"]), data["score"], verdict, data["repairs"],
                     data.get("lowest", 1.0))

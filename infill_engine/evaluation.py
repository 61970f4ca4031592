"""HumanEval single-line infilling: pass@1, exact match, syntax-valid rate, tokens per forward and milliseconds.

Two protocols, reported side by side: `unknown` length (the engine decides where the span ends) and `oracle` length
(the canvas has exactly as many positions as the true middle has tokens, and the span may not end early).
Completions run in a subprocess with a timeout and resource limits, as the benchmark's authors prescribe.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.request import Candidate, InfillResult

PROTOCOLS = ("unknown", "oracle")
DEFAULT_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "humaneval-singleline-infilling.jsonl.gz"
TEST_TIMEOUT_S = 10.0
TEST_MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class Problem:
    """One infilling problem: the prompt (prefix), the hidden middle, the suffix and its test."""

    task_id: str
    prompt: str
    suffix: str
    canonical_solution: str
    test: str
    entry_point: str


@dataclass
class Outcome:
    """What the engine wrote for one problem and how it scored."""

    task_id: str
    completion: str
    passed: bool = False
    exact: bool = False
    syntax_ok: bool = False
    tokens_per_forward: float = 0.0
    forward_passes: int = 0
    tokens: int = 0  # span tokens written (before the end-of-span)
    positions: int = 0  # canvas positions
    ms: float = 0.0
    candidates: int = 1  # canvases denoised together; the completion is the first as the engine ranks them
    lines_right: bool = False  # the completion has as many lines with text as the hidden middle
    depth_right: bool = False  # the completion's first line with text is indented as the hidden middle's


@dataclass
class Report:
    """Scores of one protocol over the problems."""

    protocol: str
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Percentages and means."""
        count = max(len(self.outcomes), 1)
        passes = max(sum(o.forward_passes for o in self.outcomes), 1)
        return {
            "protocol": self.protocol,
            "problems": len(self.outcomes),
            "pass@1": round(100 * sum(o.passed for o in self.outcomes) / count, 2),
            "exact_match": round(100 * sum(o.exact for o in self.outcomes) / count, 2),
            "syntax_valid": round(100 * sum(o.syntax_ok for o in self.outcomes) / count, 2),
            # all fills' tokens (or canvas positions) over all their passes, as `diffill bench fill` counts them
            "tokens_per_forward": round(sum(o.tokens for o in self.outcomes) / passes, 3),
            "canvas_positions_per_forward": round(sum(o.positions for o in self.outcomes) / passes, 3),
            "ms_per_problem": round(statistics.mean(o.ms for o in self.outcomes), 1) if self.outcomes else 0.0,
            "blank_fills": sum(not o.completion.strip() for o in self.outcomes),  # no suggestion for the user
            "right_line_count": round(100 * sum(o.lines_right for o in self.outcomes) / count, 2),
            # a right line at another depth is exact (stripped) but fails: the depth is judged on its own
            "right_depth": round(100 * sum(o.depth_right for o in self.outcomes) / count, 2),
        }


@dataclass(frozen=True)
class PairedComparison:
    """One protocol's outcomes against an earlier run's, on the problems both scored: what changed, and whether the
    change in pass@1 is more than chance (McNemar's exact test on the problems gained and lost)."""

    protocol: str
    problems: int  # scored by both runs
    passing_before: int
    passing_now: int
    gained: int  # passing now, failing before
    lost: int  # failing now, passing before
    identical: int  # the same completion in both runs
    p_value: float  # two-sided; near 1 where gains and losses balance, small where one side dominates
    blank_before: int  # completions that are only whitespace: no suggestion
    blank_now: int

    def summary(self) -> dict[str, Any]:
        """The comparison as plain data."""
        return {"protocol": self.protocol, "problems": self.problems, "passing_before": self.passing_before,
                "passing_now": self.passing_now, "gained": self.gained, "lost": self.lost,
                "identical_fills": self.identical, "p_value": round(self.p_value, 4),
                "blank_fills_before": self.blank_before, "blank_fills_now": self.blank_now}

    def line(self) -> str:
        """One line for a person."""
        return (f"{self.protocol}: {self.problems} problems in both: passing {self.passing_before} -> "
                f"{self.passing_now} ({self.gained} gained, {self.lost} lost; McNemar p = {self.p_value:.2f}), "
                f"identical fills {self.identical}, blank fills {self.blank_before} -> {self.blank_now}")


def mcnemar_p(gained: int, lost: int) -> float:
    """McNemar's exact two-sided p-value: the chance of a split at least this uneven between `gained` and `lost`
    problems if each changed problem were a fair coin."""
    changed = gained + lost
    if changed == 0:
        return 1.0
    tail = sum(math.comb(changed, k) for k in range(min(gained, lost) + 1)) / 2**changed
    return min(1.0, 2 * tail)


def read_outcomes(path: str | os.PathLike[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The outcomes of an earlier `diffill eval humaneval-infill --out` file: per protocol, per task id."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        outcomes = {protocol: {o["task_id"]: o for o in rows} for protocol, rows in saved["outcomes"].items()}
        for rows in outcomes.values():
            for outcome in rows.values():
                if not isinstance(outcome["passed"], bool) or not isinstance(outcome["completion"], str):
                    raise TypeError("passed must be true or false and completion a string")
    except OSError as error:
        raise ValueError(f"cannot read {str(path)!r}: {error.strerror or error}") from None
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{str(path)!r} is not the --out file of `diffill eval humaneval-infill` ({error})") from None
    return outcomes


def compare_outcomes(earlier: dict[str, dict[str, dict[str, Any]]], reports: list[Report]) -> list[PairedComparison]:
    """Each report against the earlier run's outcomes of its protocol, on the problems both scored (none where the
    earlier run did not score that protocol)."""
    comparisons = []
    for report in reports:
        before = earlier.get(report.protocol, {})
        pairs = [(before[o.task_id], o) for o in report.outcomes if o.task_id in before]
        if not pairs:
            continue
        gained = sum(now.passed and not then["passed"] for then, now in pairs)
        lost = sum(then["passed"] and not now.passed for then, now in pairs)
        comparisons.append(PairedComparison(
            report.protocol, len(pairs), sum(then["passed"] for then, _ in pairs), sum(now.passed for _, now in pairs),
            gained, lost, sum(then["completion"] == now.completion for then, now in pairs), mcnemar_p(gained, lost),
            sum(not then["completion"].strip() for then, _ in pairs),
            sum(not now.completion.strip() for _, now in pairs)))
    return comparisons


def load_problems(path: str | os.PathLike[str], limit: int | None = None) -> list[Problem]:
    """Read a HumanEval-infilling JSONL file (gzip or plain)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"benchmark file {str(path)!r} does not exist; pass --data PATH")
    opener = gzip.open if path.suffix == ".gz" else open
    problems = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                problems.append(Problem(**{k: row[k] for k in Problem.__dataclass_fields__}))
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a HumanEval-infilling problem ({error})") from error
            if limit is not None and len(problems) >= limit:
                break
    return problems


def text_lines(text: str) -> int:
    """How many lines of `text` hold more than whitespace."""
    return sum(1 for line in text.split("\n") if line.strip())


def first_depth(text: str) -> str | None:
    """The leading whitespace of the first line of `text` that holds more than whitespace; None when none does."""
    for line in text.split("\n"):
        if line.strip():
            return line[: len(line) - len(line.lstrip())]
    return None


def line_spans(problems: list[Problem], lines: int) -> list[Problem]:
    """Holes of `lines` consecutive lines, derived from single-line problems (task ids ending in /L<line>): for each
    run of that many of one task's holes, the first's prompt, the last's suffix, and all between them (blank lines
    included) as the middle; ValueError where the ids or the programs do not allow it."""
    if lines < 1:
        raise ValueError(f"a hole spans at least 1 line (got {lines})")
    if lines == 1:
        return problems
    tasks: dict[str, list[tuple[int, Problem]]] = {}
    for problem in problems:
        task, _, line = problem.task_id.rpartition("/L")
        if not task or not line.isdigit():
            raise ValueError(f"holes of several lines are derived from single-line problems whose ids end in "
                             f"/L<line>, as HumanEval-infilling's do (got {problem.task_id!r})")
        tasks.setdefault(task, []).append((int(line), problem))
    spans = []
    for task, holes in tasks.items():
        holes.sort(key=lambda hole: hole[0])
        for (first_line, first), (last_line, last) in zip(holes, holes[lines - 1 :]):
            program = first.prompt + first.canonical_solution + first.suffix
            middle = program[len(first.prompt) : len(program) - len(last.suffix)]
            if not (program.endswith(last.suffix) and middle.startswith(first.canonical_solution)
                    and middle.endswith(last.canonical_solution)
                    and len(middle) >= len(first.canonical_solution) + len(last.canonical_solution)):
                raise ValueError(f"{first.task_id} and {last.task_id} are not holes of one program")
            spans.append(replace(first, task_id=f"{task}/L{first_line}_L{last_line}", suffix=last.suffix,
                                 canonical_solution=middle))
    return spans


def spread_sample(problems: list[Problem], count: int) -> list[Problem]:
    """`count` problems spread evenly over the list (each of HumanEval's tasks has its lines in a row), in order."""
    if count < 1:
        raise ValueError(f"a sample needs at least 1 problem (got {count})")
    if count >= len(problems):
        return problems
    return [problems[i * len(problems) // count] for i in range(count)]


TEST_FILE_BYTES = 16 << 20  # the largest file a test program may write
# Put first in the test program: the child caps its own memory, CPU time and file size (no preexec_fn, which is
# unsafe when tests run from several threads), and an audit hook refuses sockets, new processes, native code and
# writes outside its temporary working directory. The hook is a guard against a wrong completion doing damage by
# accident (as HumanEval's own reliability_guard is), not a wall against code written to escape it; the limits are
# the kernel's, and where user namespaces are allowed the program also runs without a network (`unshare -rn`).
SANDBOX_PRELUDE = (
    "import os, resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({TEST_MEMORY_BYTES}, {TEST_MEMORY_BYTES}))\n"
    f"resource.setrlimit(resource.RLIMIT_CPU, ({int(TEST_TIMEOUT_S)}, {int(TEST_TIMEOUT_S) + 1}))\n"
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({TEST_FILE_BYTES}, {TEST_FILE_BYTES}))\n"
    "def _sandbox(event, args, _home=os.getcwd() + os.sep,\n"
    "             _write=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND):\n"
    "    if event.startswith(('socket.', 'subprocess.', 'os.exec', 'os.spawn', 'os.posix_spawn', 'os.fork',\n"
    "                         'os.forkpty', 'os.system', 'os.kill', 'os.killpg', 'pty.', 'ctypes.', 'winreg.',\n"
    "                         'webbrowser.', 'urllib.', 'http.', 'ftplib.', 'smtplib.')):\n"
    "        raise PermissionError(f'the evaluation sandbox refuses {event}')\n"
    "    writes = event in ('os.remove', 'os.rename', 'os.rmdir', 'os.mkdir', 'os.chmod', 'os.chown', 'os.link',\n"
    "                       'os.symlink', 'os.truncate', 'os.utime', 'shutil.rmtree', 'shutil.move')\n"
    "    if event == 'open' and isinstance(args[0], (str, bytes, os.PathLike)):\n"
    "        mode, flags = args[1] or 'r', args[2] or 0\n"
    "        writes = any(c in str(mode) for c in 'wax+') or bool(flags & _write)\n"
    "    if writes and args and isinstance(args[0], (str, bytes, os.PathLike)):\n"
    "        path = os.path.realpath(os.fsdecode(args[0]))\n"
    "        if not path.startswith(_home):\n"
    "            raise PermissionError(f'the evaluation sandbox refuses {event} outside its directory: {path}')\n"
    "sys.addaudithook(_sandbox)\n"
    "del _sandbox\n"
)


@functools.cache
def network_isolation() -> list[str]:
    """`unshare -rn` (a new user and network namespace: no network at all) where this machine allows it, else []."""
    command = ["unshare", "--map-root-user", "--net"]
    if shutil.which("unshare") is None:
        return []
    try:
        probe = subprocess.run([*command, "true"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return command if probe.returncode == 0 else []


def run_test(problem: Problem, completion: str) -> bool:
    """True when prompt + completion + suffix passes the problem's check() in a sandboxed subprocess."""
    program = (
        f"{SANDBOX_PRELUDE}{problem.prompt}{completion}{problem.suffix}\n{problem.test}\ncheck({problem.entry_point})\n"
    )
    with tempfile.TemporaryDirectory() as directory:
        try:
            completed = subprocess.run(
                [*network_isolation(), sys.executable, "-I", "-c", program], cwd=directory, capture_output=True,
                timeout=TEST_TIMEOUT_S, stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "")},
            )
        except subprocess.TimeoutExpired:
            return False
    return completed.returncode == 0


def first_fill(result: InfillResult) -> Candidate | None:
    """What a fill is scored by: its first candidate as the engine ranks them, or its first rejected one, or None."""
    if result.candidates:
        return result.candidates[0]
    return result.rejected[0] if result.rejected else None


def oracle_length(engine: InfillEngine, problem: Problem) -> int:
    """Token count of the true middle, tokenized as the model sees a span."""
    ids = engine.denoiser.tokenizer(problem.canonical_solution, add_special_tokens=False)["input_ids"]
    return max(len(ids), 1)


def evaluate(
    engine: InfillEngine,
    problems: list[Problem],
    protocols: tuple[str, ...] = PROTOCOLS,
    max_tokens: int = 48,
    workers: int = 2,
    progress: Any = None,
    budget_ms: int | None = None,
    candidates: int = 1,
) -> list[Report]:
    """Fill every problem under each protocol, then run the tests in parallel subprocesses; `budget_ms` is each
    fill's time budget, as the language server sets it (InfillRequest.budget_ms; None: no limit), and the first of
    the fill's `candidates`, as the engine ranks them, is the one scored."""
    reports = []
    base = engine.sampler
    for protocol in protocols:
        report = Report(protocol)
        for problem in problems:
            exact_length = protocol == "oracle"
            engine.sampler = replace(base, allow_end_of_span=not exact_length)
            length = oracle_length(engine, problem) if exact_length else max_tokens
            result = engine.fill(InfillRequest(problem.prompt, problem.suffix, "python", max_tokens=length,
                                               budget_ms=budget_ms, candidates=candidates))
            best = first_fill(result)
            completion = best.text if best is not None else ""
            report.outcomes.append(Outcome(
                task_id=problem.task_id,
                completion=completion,
                exact=completion.strip() == problem.canonical_solution.strip(),
                syntax_ok=best is not None and best.passed,
                tokens_per_forward=result.stats.tokens_per_forward,
                forward_passes=result.stats.forward_passes,
                tokens=result.stats.tokens_generated,
                positions=result.stats.canvas_positions,
                ms=result.stats.ms.get("total", 0.0),
                candidates=result.stats.candidates,
                lines_right=text_lines(completion) == text_lines(problem.canonical_solution),
                depth_right=bool(completion.strip())
                and first_depth(completion) == first_depth(problem.canonical_solution),
            ))
            if progress is not None:
                progress(protocol, len(report.outcomes), len(problems))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            verdicts = pool.map(lambda pair: run_test(*pair), zip(problems, (o.completion for o in report.outcomes)))
            for outcome, passed in zip(report.outcomes, verdicts):
                outcome.passed = passed
        reports.append(report)
    engine.sampler = base
    return reports

"""The `diffill` command: `fill` a hole from the command line, `doctor` to see what would be used."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

MAX_FILE_BYTES = 64 * 1024 * 1024


class UsageError(Exception):
    """Bad input from the command line, reported as one clear line without a traceback."""


@dataclass(frozen=True)
class Hole:
    """The document split at the hole."""

    path: str
    prefix: str
    suffix: str


def read_text(path: str) -> str:
    """A file (or standard input for '-') as text, refusing binary and non-UTF-8 content."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; refusing to read it")
    if b"\x00" in data:
        raise UsageError(f"{path}: looks binary (contains NUL bytes); diffill fills text files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not UTF-8 text (byte {error.start} is invalid); diffill reads UTF-8 files") from None


def split_at_position(text: str, line: int, column: int, path: str) -> tuple[str, str]:
    """Split text at a 1-based line and a 1-based column counted in characters."""
    lines = text.split("\n")
    if line < 1 or line > len(lines):
        raise UsageError(f"{path}: line {line} is outside the file (it has lines 1 to {len(lines)})")
    width = len(lines[line - 1].rstrip("\r"))
    if column < 1 or column > width + 1:
        raise UsageError(f"{path}:{line}: column {column} is outside the line (columns 1 to {width + 1})")
    offset = sum(len(previous) + 1 for previous in lines[: line - 1]) + column - 1
    return text[:offset], text[offset:]


def parse_target(target: str, hole_marker: str | None) -> Hole:
    """FILE:LINE:COL, or FILE with --hole MARKER; '-' reads standard input."""
    path, line, column = target, None, None
    parts = target.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        path, line, column = parts[0], int(parts[1]), int(parts[2])
    if line is None and hole_marker is None:
        raise UsageError(f"{target}: say where the hole is: FILE:LINE:COL (1-based), or FILE --hole MARKER")
    if line is not None and hole_marker is not None:
        raise UsageError("give either FILE:LINE:COL or --hole MARKER, not both")
    text = read_text(path)
    if hole_marker is not None:
        if not hole_marker:
            raise UsageError("--hole MARKER must not be empty")
        index = text.find(hole_marker)
        if index == -1:
            raise UsageError(f"{path}: the marker {hole_marker!r} does not occur in the file")
        return Hole(path, text[:index], text[index + len(hole_marker) :])
    prefix, suffix = split_at_position(text, line, column, path)
    return Hole(path, prefix, suffix)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from infill_engine.loading import FAMILIES

    parser = argparse.ArgumentParser(prog="diffill", description="Code infilling with a diffusion language model.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to standard error")
    commands = parser.add_subparsers(dest="command", required=True)

    def model_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--model", metavar="PATH", help="model directory (default: the embedded model)")
        command.add_argument("--family", choices=FAMILIES, help="override the family read from config.json")
        command.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
        command.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
        command.add_argument(
            "--trust-remote-code", action="store_true", help="allow a checkpoint's own modelling code (off by default)"
        )

    def measured_options(command: argparse.ArgumentParser) -> None:
        model_options(command)
        command.add_argument("--threads", type=int, help="torch threads (default: torch's)")

    fill = commands.add_parser("fill", help="fill the hole at a position or marker and print the fill")
    fill.add_argument("target", help="FILE:LINE:COL (1-based), or FILE with --hole; '-' reads standard input")
    fill.add_argument("--hole", metavar="MARKER", help="fill where this marker string stands (it is removed)")
    model_options(fill)
    fill.add_argument("--max-tokens", type=int, default=64, help="span positions on the canvas (default: 64)")
    fill.add_argument("--candidates", type=int, default=1, help="canvases denoised in one batch (default: 1)")
    fill.add_argument("--steps", type=int, help="denoising steps per block (default: the family's)")
    fill.add_argument("--block-size", type=int, help="positions per block (default: the family's)")
    fill.add_argument("--commit", help="threshold, schedule or entropy_bound (default: the family's)")
    fill.add_argument("--order", help="confidence, margin, entropy or random (default: confidence)")
    fill.add_argument("--threshold", type=float, help="confidence a position needs with --commit threshold")
    fill.add_argument("--temperature", type=float, help="sampling temperature (0 = greedy)")
    fill.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    fill.add_argument("--language", help="language or file name for the syntax gate (default: from FILE)")
    fill.add_argument("--no-gate", action="store_true", help="show the raw candidates without the syntax gate")
    fill.add_argument("--json", action="store_true", help="print JSON: text, candidates, steps, timings")

    doctor = commands.add_parser("doctor", help="show the device, dtype, model, tokenizer and grammars in use")
    model_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print JSON")

    from lsp_server.cli import add_serve_arguments

    add_serve_arguments(commands.add_parser("serve", help="run the language server for editors (stdio or --tcp)"))

    from infill_engine.service.command import add_engine_arguments

    add_engine_arguments(commands.add_parser("engine", help="the shared engine: serve one model to many servers"))

    from infill_engine.training.cli import add_train_parser

    add_train_parser(commands)

    bench = commands.add_parser("bench", help="measure what fills cost on this machine")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    spans = bench_kinds.add_parser("spans", help="ms per denoising step and tokens per forward by span length")
    measured_options(spans)
    spans.add_argument("--spans", type=int, nargs="+", default=[16, 64, 256], help="span lengths (default: 16 64 256)")
    spans.add_argument("--repeats", type=int, default=3, help="measured runs per span (default: 3)")
    spans.add_argument("--json", action="store_true", help="print JSON")
    ghost = bench_kinds.add_parser("ghost", help="single-line ghost-text latency at the benchmark's holes")
    measured_options(ghost)
    ghost.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    ghost.add_argument("--sample", type=int, default=30, metavar="N", help="holes, spread over the file (default 30)")
    ghost.add_argument("--max-tokens", type=int, default=24, help="span positions (default 24, as mid-line)")
    ghost.add_argument("--candidates", type=int, default=1, help="canvases denoised together (default 1)")
    ghost.add_argument("--json", action="store_true", help="print JSON")

    evaluation = commands.add_parser("eval", help="score a model on an infilling benchmark")
    suites = evaluation.add_subparsers(dest="suite", required=True)
    humaneval = suites.add_parser("humaneval-infill", help="HumanEval single-line infilling: pass@1 and more")
    measured_options(humaneval)
    humaneval.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    humaneval.add_argument("--limit", type=int, help="only the first N problems")
    humaneval.add_argument("--sample", type=int, metavar="N",
                           help="N problems spread evenly over the file, so every part of it is represented")
    humaneval.add_argument("--protocol", choices=["both", "unknown", "oracle"], default="both",
                           help="span length unknown (the engine decides), oracle (the true length), or both")
    humaneval.add_argument("--max-tokens", type=int, default=48, help="canvas positions, unknown length (default 48)")
    humaneval.add_argument("--workers", type=int, default=2, help="parallel test subprocesses (default: 2)")
    humaneval.add_argument("--out", help="also write every completion and verdict to this JSON file")
    humaneval.add_argument("--json", action="store_true", help="print JSON")
    return parser


def load_engine(args: argparse.Namespace) -> Any:
    """The engine of the command line's model options (and --threads where the command has it)."""
    from infill_engine.engine import InfillEngine
    from infill_engine.loading import ModelLoadError

    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        return InfillEngine.load(args.model, family=args.family, device=args.device, dtype=args.dtype,
                                 trust_remote_code=args.trust_remote_code)
    except (ModelLoadError, ValueError) as error:
        raise UsageError(str(error)) from None


def sampler_from_args(args: argparse.Namespace, base: Any) -> Any:
    """The family's default sampler with the command line's overrides."""
    from dataclasses import replace

    overrides: dict[str, Any] = {"seed": args.seed}
    for name, field_name in (("steps", "steps"), ("block_size", "block_size"), ("commit", "commit"),
                             ("order", "order"), ("threshold", "threshold")):
        if getattr(args, name) is not None:
            overrides[field_name] = getattr(args, name)
    if args.temperature is not None:
        overrides["temperature_start"] = overrides["temperature_end"] = args.temperature
    try:
        return replace(base, **overrides)
    except ValueError as error:
        raise UsageError(str(error)) from None


def run_fill(args: argparse.Namespace) -> int:
    """`diffill fill`: print the best fill, all candidates with --no-gate, or JSON."""
    from infill_engine.engine import InfillRequest
    from infill_engine.syntax import language_for

    hole = parse_target(args.target, args.hole)
    language = args.language or (None if hole.path == "-" else hole.path)
    if args.language and language_for(args.language) is None:
        logging.getLogger(__name__).warning("unknown language %r: only brackets are checked", args.language)
    engine = load_engine(args)
    engine.sampler = sampler_from_args(args, engine.sampler)
    request = InfillRequest(
        prefix=hole.prefix, suffix=hole.suffix, language=language, max_tokens=args.max_tokens,
        candidates=args.candidates, gate=not args.no_gate,
    )
    try:
        result = engine.fill(request)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.json:
        print(json.dumps(result_as_json(result), indent=2, ensure_ascii=False))
    elif args.no_gate:
        for index, candidate in enumerate(result.candidates + result.rejected):
            print(f"--- candidate {index + 1} (score {candidate.score:.3f})")
            print(candidate.text)
    elif result.text is None:
        print("diffill: no candidate passed the syntax gate (see them with --no-gate)", file=sys.stderr)
        return 1
    else:
        sys.stdout.write(result.text + ("" if result.text.endswith("\n") else "\n"))
    return 0


def result_as_json(result: Any) -> dict[str, Any]:
    """The JSON form of an InfillResult."""

    def candidate_json(candidate: Any) -> dict[str, Any]:
        gate = candidate.gate
        return {
            "text": candidate.text,
            "score": round(candidate.score, 4),
            "passed": candidate.passed,
            "repairs": candidate.repairs,
            "checker": None if gate is None else gate.checker,
            "problems": [] if gate is None else [
                {"start": p.start, "end": p.end, "kind": p.kind, "message": p.message} for p in gate.new_problems
            ],
        }

    stats = result.stats.as_dict()
    return {
        "text": result.text,
        "candidates": [candidate_json(c) for c in result.candidates],
        "rejected": [candidate_json(c) for c in result.rejected],
        "steps": stats["forward_passes"],
        "tokens_per_forward": stats["tokens_per_forward"],
        "ms": stats["ms"],
        "stats": stats,
    }


def run_doctor(args: argparse.Namespace) -> int:
    """`diffill doctor`: report the device, dtype, model, tokenizer and grammars, and whether each loads."""
    from infill_engine.doctor import diagnose

    report = diagnose(args.model, args.family, args.device, args.dtype, args.trust_remote_code)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for section, values in report.items():
            print(f"{section}:")
            for key, value in values.items():
                print(f"  {key}: {value}")
    healthy = all(values.get("ok", True) for values in report.values())
    return 0 if healthy else 1


def run_bench(args: argparse.Namespace) -> int:
    """`diffill bench spans|ghost`: per-step cost by span length, or ghost-text latency at real holes."""
    import torch

    from infill_engine.bench import bench_ghost, bench_spans
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems, spread_sample

    try:
        holes = []
        if args.bench == "ghost":
            problems = spread_sample(load_problems(args.data or DEFAULT_BENCH), args.sample)
            holes = [(p.prompt, p.suffix) for p in problems]
        engine = load_engine(args)
        if args.bench == "ghost":
            report = bench_ghost(engine, holes, args.max_tokens, args.candidates)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.bench == "ghost":
        report = {"model": engine.denoiser.path, "threads": torch.get_num_threads(), **report}
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print("\n".join(f"{key}: {value}" for key, value in report.items()))
        return 0
    rows = bench_spans(engine, args.spans, args.repeats)
    if args.json:
        print(json.dumps({"model": engine.denoiser.path, "family": engine.denoiser.family, "rows": rows}, indent=2))
        return 0
    print(f"model: {engine.denoiser.path} ({engine.denoiser.family}, {engine.denoiser.device}, threads "
          f"{torch.get_num_threads()})")
    print(f"{'span':>6} {'ms/step':>9} {'encode ms':>10} {'steps':>6} {'tok/fwd':>8} {'total ms':>9}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['span']:>6}  skipped: {row['skipped']}")
            continue
        print(f"{row['span']:>6} {row['ms_per_step']:>9} {row['ms_encode']:>10} {row['steps']:>6} "
              f"{row['tokens_per_forward']:>8} {row['ms_total']:>9}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """`diffill eval humaneval-infill`: the score table of both protocols."""
    from dataclasses import asdict

    from infill_engine.evaluation import DEFAULT_BENCH, PROTOCOLS, evaluate, load_problems, spread_sample

    try:
        problems = load_problems(args.data or DEFAULT_BENCH, args.limit)
        if args.sample is not None:
            problems = spread_sample(problems, args.sample)
    except ValueError as error:
        raise UsageError(str(error)) from None
    engine = load_engine(args)
    protocols = PROTOCOLS if args.protocol == "both" else (args.protocol,)

    def progress(protocol: str, done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total or done % 100 == 0:
            print(f"\r{protocol}: {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)

    reports = evaluate(engine, problems, protocols, max_tokens=args.max_tokens, workers=args.workers,
                       progress=progress)
    summaries = [report.summary() for report in reports]
    if args.out:
        details = {r.protocol: [asdict(o) for o in r.outcomes] for r in reports}
        from infill_engine.atomic import write_text_atomic

        write_text_atomic(args.out, json.dumps({"summary": summaries, "outcomes": details}, indent=1))
    if args.json:
        print(json.dumps({"model": engine.denoiser.path, "summary": summaries}, indent=2))
        return 0
    print(f"model: {engine.denoiser.path} ({engine.denoiser.family}); {len(problems)} problems")
    print(f"{'protocol':<9} {'pass@1':>7} {'exact':>7} {'syntax':>7} {'tok/fwd':>8} {'ms/problem':>11}")
    for row in summaries:
        print(f"{row['protocol']:<9} {row['pass@1']:>7} {row['exact_match']:>7} {row['syntax_valid']:>7} "
              f"{row['tokens_per_forward']:>8} {row['ms_per_problem']:>11}")
    return 0


def parse_own_command(
    argv: list[str], name: str, description: str, add_arguments: Any
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse `[-v] NAME [options]` for a subcommand with its own start-up path, and set up logging to stderr."""
    parser = argparse.ArgumentParser(prog="diffill", description=description)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to standard error")
    commands = parser.add_subparsers(dest="command", required=True)
    add_arguments(commands.add_parser(name, help=description))
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return parser, args


def subcommand(argv: list[str]) -> str | None:
    """The subcommand a command line names after the global options (`-v`), or None."""
    index = 0
    while index < len(argv) and argv[index] in ("-v", "--verbose"):
        index += 1
    return argv[index] if index < len(argv) else None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `diffill` console command."""
    words = sys.argv[1:] if argv is None else argv
    command = subcommand(words)
    if command == "serve":  # its own start-up path: answers initialize before torch is imported
        from lsp_server.cli import run_serve

        return run_serve(words)
    if command == "engine":  # serve/status/stop; only `serve` imports torch
        from infill_engine.service.command import run_engine

        return run_engine(words)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        if args.command == "fill":
            return run_fill(args)
        if args.command == "bench":
            return run_bench(args)
        if args.command == "eval":
            return run_eval(args)
        if args.command == "train":
            from infill_engine.training.cli import run_train

            return run_train(args)
        return run_doctor(args)
    except UsageError as error:
        print(f"diffill: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Where the model ends a fill: the choice at a hole's first line break, and the length its first pass settles.

    python -m infill_engine.training.end_probe MODEL [MODEL ...] [--holes 200] [--data PATH] [--threads 1]
        [--json PATH]

Holes of HumanEval single-line infilling, single lines on a 48-position canvas and two of a task's lines in a row
on a 64-position one (as `diffill eval humaneval-infill [--span-lines 2]` gives them), two measures each:

- **The line break.** The middle's first line without its line break is given at the start of the canvas, the rest
  is noise, and one pass says what comes next. The byte-level tokenizer writes a line break together with the next
  line's indentation (`"\\n   "`), so a bare line break token is what a span ends with: after a single line the true
  token is the bare break, after a two-line hole's first line the break with the second line's indentation. Reported:
  the true token's probability, how often it is the argmax, and the probability of a bare break.
- **The first pass's tail.** Everything noise, one pass: the run of positions reaching the canvas's end whose argmax
  is end-of-span with at least the sampler's `tail_floor` is what `settle_tail` commits at once. Reported: how often
  that run starts before the true middle ends (the fill is cut short before a token of it is written).

One or two passes a hole, so seconds a model (docs/MODEL.md, "Holes of two lines").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infill_engine.training.measurement import add_measure_arguments, measure_models

CANVASES = {1: 48, 2: 64}  # lines in a hole -> canvas positions, as the evaluation gives them


@dataclass(frozen=True)
class LineBreak:
    """A hole's middle as tokens and where its first line break is."""

    ids: list[int]
    at: int  # index of the token holding the first line break (len(ids) where there is none)


@dataclass
class HoleProbe:
    """One model at holes of one number of lines (medians and shares over the holes)."""

    model: str
    lines: int
    holes: int
    break_token: float  # median P(the true token at the first line break)
    break_argmax: float  # share of holes where it is the argmax
    bare_break: float  # median P(a bare line break there): the span would end after the line
    tail_cuts_short: float  # share of holes whose first pass settles the span's end before the true end
    tail_start_minus_length: float  # median positions between that settled end and the true end


def first_line_break(tokenizer: Any, middle: str) -> LineBreak:
    """The middle's token ids and the index of the token that holds its first line break."""
    encoded = tokenizer(middle, add_special_tokens=False, return_offsets_mapping=True)
    spans = encoded["offset_mapping"]
    at = next((i for i, (start, end) in enumerate(spans) if "\n" in middle[start:end]), len(spans))
    return LineBreak(list(encoded["input_ids"]), at)


def predict_canvas(engine: Any, prefix: str, suffix: str, given_ids: list[int], canvas: int) -> Any:
    """The model's logits (N, V) over a canvas of `canvas` positions that starts with `given_ids` and is noise after
    them, between `prefix` and `suffix` (cut to the engine's context budget)."""
    import torch

    from infill_engine.canvas import trim_context
    from infill_engine.commit_rules import fresh_noise

    denoiser = engine.denoiser
    trimmed = trim_context(denoiser.tokenizer, prefix, suffix, engine.context_budget(canvas))
    tokens = fresh_noise(denoiser, (1, canvas), torch.Generator(device=denoiser.device).manual_seed(0))
    tokens[0, : len(given_ids)] = torch.tensor(given_ids, dtype=torch.long, device=tokens.device)
    context = denoiser.encode(trimmed.prefix_ids, trimmed.suffix_ids, canvas, 1)
    with torch.no_grad():
        logits = denoiser.predict(context, tokens)  # (1, N, V)
    return logits[0].float().cpu()


def tail_start(engine: Any, logits: Any) -> int:
    """Where the engine's sampler would settle end-of-span from after a first pass of `logits` (N, V) over a canvas
    of noise: its own vocabulary bias, token pick and `settle_tail` (the canvas length where nothing settles)."""
    import torch

    from infill_engine.commit_rules import initial_state, settle_tail
    from infill_engine.sampler import pick_tokens, vocabulary_bias

    denoiser, sampler = engine.denoiser, engine.sampler
    length = logits.shape[0]
    generator = torch.Generator().manual_seed(0)
    bias = vocabulary_bias(sampler, denoiser.special, logits.shape[-1], logits.device)
    biased = (logits if bias is None else logits + bias)[None]  # (1, N, V)
    prediction = pick_tokens(biased, torch.zeros(1), sampler.order, generator, sampler.draw)
    state = initial_state(denoiser, 1, length, generator, None, None)
    settle_tail(denoiser, state, prediction, torch.ones(1, length, dtype=torch.bool), sampler.tail_floor)
    settled = state.committed[0].nonzero()
    return int(settled[0]) if len(settled) else length


def measure(engine: Any, model: str, problems: list[Any], lines: int, holes: int) -> HoleProbe:
    """Probe `holes` holes of `lines` lines made from the single-line `problems`, spread over them."""
    from infill_engine.evaluation import line_spans, spread_sample

    denoiser = engine.denoiser
    # line breaks with no indentation after them: the last token of a span that ends with its line
    bare = [i for i, text in enumerate(denoiser.token_texts) if text and not text.strip() and text[-1] in "\r\n"]
    canvas = CANVASES[lines]
    true_probs, argmax_hits, bare_probs, short, gaps = [], [], [], [], []
    for problem in spread_sample(line_spans(problems, lines), holes):
        middle = first_line_break(denoiser.tokenizer, problem.canonical_solution)
        if middle.at >= len(middle.ids) or len(middle.ids) > canvas:
            continue
        logits = predict_canvas(engine, problem.prompt, problem.suffix, middle.ids[: middle.at], canvas)[middle.at]
        probs = logits.softmax(dim=-1)
        true_probs.append(float(probs[middle.ids[middle.at]]))
        argmax_hits.append(int(probs.argmax()) == middle.ids[middle.at])
        bare_probs.append(float(probs[bare].sum()))
        first_pass = predict_canvas(engine, problem.prompt, problem.suffix, [], canvas)
        start = tail_start(engine, first_pass)
        short.append(start < len(middle.ids))
        gaps.append(start - len(middle.ids))
    count = max(len(true_probs), 1)
    return HoleProbe(
        model=model, lines=lines, holes=len(true_probs),
        break_token=round(statistics.median(true_probs), 4) if true_probs else 0.0,
        break_argmax=round(sum(argmax_hits) / count, 4), bare_break=round(statistics.median(bare_probs), 4)
        if bare_probs else 0.0,
        tail_cuts_short=round(sum(short) / count, 4),
        tail_start_minus_length=float(statistics.median(gaps)) if gaps else 0.0,
    )


def main(argv: list[str] | None = None) -> int:
    """Probe each model at single-line and two-line holes; print a table (and write JSON)."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.end_probe",
                                     description=__doc__.split("\n\n")[0])
    add_measure_arguments(parser, 200, "holes of each kind, spread over the file")
    parser.add_argument("--data", type=Path, help="JSONL(.gz) in the HumanEval-infilling format (default: "
                        "../shared/bench's single-line file)")
    args = parser.parse_args(argv)
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems

    try:
        if args.holes < 1:
            raise ValueError(f"--holes must be at least 1 (got {args.holes})")
        problems = load_problems(args.data or DEFAULT_BENCH)
    except ValueError as error:
        print(f"end_probe: {error}", file=sys.stderr)
        return 2

    import torch


    def probe_model(engine: Any, model: str) -> list[HoleProbe]:
        rows = [measure(engine, model, problems, lines, args.holes) for lines in CANVASES]
        for row in rows:
            print(f"{row.lines:>5} {row.holes:>5} {row.break_token:>13} {row.break_argmax:>6} {row.bare_break:>13} "
                  f"{row.tail_cuts_short:>15} {row.tail_start_minus_length:>13}  {model}", flush=True)
        return rows

    torch.set_num_threads(args.threads)
    print(f"{'lines':>5} {'holes':>5} {'P(true break)':>13} {'argmax':>6} {'P(bare break)':>13} "
          f"{'tail cuts short':>15} {'tail - length':>13}  model")
    return measure_models("end_probe", args.models, probe_model, args.json)


if __name__ == "__main__":
    sys.exit(main())

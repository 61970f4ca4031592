"""`python -m infill_engine.training.end_probe`: the choice at a hole's first line break, and the first pass's tail."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from infill_engine.training.end_probe import first_line_break, main, tail_start
from tests.test_evaluation import SUM_PROGRAM, single_line_holes


def test_the_line_break_token_is_found_with_the_indentation_it_carries(tokenizer) -> None:
    middle = "    s = 0\n    for x in xs:\n"
    found = first_line_break(tokenizer, middle)
    assert tokenizer.decode(found.ids) == middle
    before, at = tokenizer.decode(found.ids[: found.at]), tokenizer.decode([found.ids[found.at]])
    assert "\n" not in before and "\n" in at and middle.startswith(before + at)
    assert first_line_break(tokenizer, "    return s").at == len(first_line_break(tokenizer, "    return s").ids)


def test_the_tail_is_where_the_sampler_itself_would_settle_the_end(model_dirs) -> None:
    from dataclasses import replace

    from infill_engine.training.measurement import measured_engine

    engine = measured_engine(str(model_dirs["diffill"]))
    special = engine.denoiser.special
    end = special.end_of_span_ids[0]
    text = next(i for i in range(engine.denoiser.vocab_size) if i not in (*special.ids_never_generated, end))

    def logits_for(argmax: list[int], sure: list[float]) -> torch.Tensor:
        """(N, V) logits whose softmax gives `argmax[i]` the probability `sure[i]` and the rest evenly the remainder."""
        vocab = engine.denoiser.vocab_size
        rows = []
        for token, p in zip(argmax, sure):
            probs = torch.full((vocab,), (1 - p) / (vocab - 1))
            probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)

    own = engine.sampler
    engine.sampler = replace(own, tail_floor=0.1, end_bias=0.0)
    assert tail_start(engine, logits_for([text] * 3 + [end] * 3, [0.9] * 6)) == 3
    # an end the run to the canvas end does not reach settles nothing
    assert tail_start(engine, logits_for([text, end, text, text, end, end], [0.9] * 6)) == 4
    # an end below the floor breaks the run
    engine.sampler = replace(own, tail_floor=0.5, end_bias=0.0)
    assert tail_start(engine, logits_for([text] * 3 + [end] * 3, [0.9, 0.9, 0.9, 0.9, 0.4, 0.9])) == 5
    # the sampler's end_bias counts: pushed down far enough, the ends are no longer the argmax
    engine.sampler = replace(own, tail_floor=0.1, end_bias=-10.0)
    assert tail_start(engine, logits_for([text] * 3 + [end] * 3, [0.9] * 6)) == 6


def test_the_command_probes_single_and_two_line_holes(tmp_path: Path, model_dirs, capsys) -> None:
    data = tmp_path / "lines.jsonl"
    data.write_text("".join(json.dumps(p.__dict__) + "\n" for p in single_line_holes(SUM_PROGRAM)))
    out = tmp_path / "rows.json"
    model = str(model_dirs["diffill"])
    assert main([model, "--data", str(data), "--holes", "3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["lines"] for r in rows] == [1, 2] and capsys.readouterr().out.count(model) == 2
    assert all(0 < r["holes"] <= 3 for r in rows)
    for row in rows:
        assert 0.0 <= row["break_token"] <= 1.0 and 0.0 <= row["bare_break"] <= 1.0
        assert 0.0 <= row["break_argmax"] <= 1.0 and 0.0 <= row["tail_cuts_short"] <= 1.0


def test_bad_options_are_refused_before_a_model_loads(tmp_path: Path, capsys) -> None:
    assert main(["no-such-model", "--holes", "0"]) == 2
    assert "--holes must be at least 1" in capsys.readouterr().err
    assert main(["no-such-model", "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err

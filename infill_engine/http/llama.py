"""llama.cpp server's `/infill`, mapped onto a diffusion fill: its request body in, its answer out.

The request is the one llama.vscode and llama.vim send (`input_prefix`, `input_suffix`, `input_extra` as
`[{filename, text}]` chunks of other files, `prompt`, `n_predict`, `n_indent`, `stop`, `response_fields`, ...).
llama.cpp builds `<FIM_PRE>extra + input_prefix<FIM_SUF>input_suffix<FIM_MID>prompt` and continues after `prompt`,
so here the hole's prefix is the extra chunks, then `input_prefix`, then `prompt`; its suffix is `input_suffix`.
`n_predict` is the canvas size (0: a cache warm-up, answered at once with empty content). Sampling fields of an
autoregressive sampler (`top_k`, `top_p`, `samplers`, `temperature`, `cache_prompt`, `t_max_prompt_ms`, ...) are
accepted and not used. `t_max_predict_ms` (llama.cpp: 0 off) becomes the fill's time budget: past it the canvas takes
its current best guess and repairs are skipped, as `completion.budgetMs` does in the editor (docs/TEAM.md). The answer has llama.cpp's fields (`content`, `stop`, `stop_type`, `tokens_predicted`,
`timings`, ...), reduced to `response_fields` (flat `a/b` keys) when those are given.

With `stream: true` the answer is llama.cpp's stream of chunks (`infill_chunks`, sent as server-sent events): a
chunk `{"content", "stop": false, ...}`, then the final one with `"stop": true`, empty `content` (it was in the
chunks before) and `timings`, reduced to `response_fields`. A diffusion model decides the whole span together and
the syntax gate and repairs may still change it, so the content comes in one chunk once the fill is done, not token
by token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from infill_engine.request import InfillRequest, InfillResult

DEFAULT_N_PREDICT = 64  # canvas positions when the body does not say (llama.cpp's -1, "until done", included)
IGNORED_FIELDS = (  # accepted so that existing clients work unchanged; an autoregressive sampler's knobs
    "top_k", "top_p", "min_p", "typical_p", "temperature", "samplers", "cache_prompt", "t_max_prompt_ms",
    "n_probs", "id_slot", "lora", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold", "dry_multiplier",
    "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau", "mirostat_eta", "ignore_eos",
    "n_keep", "model", "return_tokens", "timings_per_token", "post_sampling_probs", "n_cmpl", "max_tokens",
)
FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "n_indent", "stop", "seed",
          "response_fields", "t_max_predict_ms", "stream", *IGNORED_FIELDS)


@dataclass(frozen=True)
class InfillCall:
    """What one `/infill` body asks: the engine's request and what shapes the answer."""

    request: InfillRequest
    n_indent: int = 0  # stop at a later line indented less than this (llama.cpp's n_indent)
    stop: tuple[str, ...] = ()  # stop strings: the content is cut before the first one
    response_fields: tuple[str, ...] | None = None  # only these fields (flat "a/b" paths) in the answer
    warm_up: bool = False  # n_predict 0: nothing to predict
    stream: bool = False  # answer with llama.cpp's stream of chunks (`infill_chunks`)


def parse_infill(body: Any, max_tokens: int) -> InfillCall:
    """The fill an `/infill` body asks for; ValueError says which field is wrong and what is allowed.

    `n_predict` above `max_tokens` is lowered to it (llama.cpp clients ask for 128-256 tokens as a matter of course).
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    prefix = _text(body, "input_prefix")
    suffix = _text(body, "input_suffix")
    prompt = _text(body, "prompt")
    extra = _extra(body.get("input_extra"))
    n_predict = body.get("n_predict", -1)
    if isinstance(n_predict, bool) or not isinstance(n_predict, int) or n_predict < -1:
        raise ValueError(f"n_predict must be an integer >= -1 (got {n_predict!r})")
    n_indent = body.get("n_indent", 0)
    if isinstance(n_indent, bool) or not isinstance(n_indent, int) or n_indent < 0:
        raise ValueError(f"n_indent must be an integer >= 0 (got {n_indent!r})")
    stop = body.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValueError("stop must be a list of strings")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an integer (got {seed!r})")
    if seed is not None and seed < 0:  # llama.cpp's -1 (and any negative seed): a random one; ours is fixed
        seed = None
    fields = body.get("response_fields")
    if fields is not None and (not isinstance(fields, list) or not all(isinstance(f, str) for f in fields)):
        raise ValueError("response_fields must be a list of strings")
    budget = body.get("t_max_predict_ms", 0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0:
        raise ValueError(f"t_max_predict_ms must be a number of milliseconds >= 0, 0 for no limit (got {budget!r})")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be true or false (got {stream!r})")
    span = DEFAULT_N_PREDICT if n_predict == -1 else min(n_predict, max_tokens)
    request = InfillRequest(prefix=extra + prefix + prompt, suffix=suffix, max_tokens=max(span, 1), seed=seed,
                            budget_ms=int(budget) if budget > 0 else None)
    return InfillCall(request, n_indent, tuple(s for s in stop if s), None if fields is None else tuple(fields),
                      warm_up=n_predict == 0, stream=stream)


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string (got {type(value).__name__})")
    return value


def _extra(chunks: Any) -> str:
    """Other files' chunks as text before the prefix: a line with the file name, then the chunk."""
    if chunks is None:
        return ""
    if not isinstance(chunks, list):
        raise ValueError("input_extra must be a list of {\"filename\": ..., \"text\": ...} objects")
    parts = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise ValueError("input_extra must be a list of {\"filename\": ..., \"text\": ...} objects")
        text = chunk.get("text", "")
        if text:
            name = chunk.get("filename", "")
            parts.append((f"{name}\n" if name else "") + text + ("" if text.endswith("\n") else "\n"))
    return "".join(parts)


def shape_content(text: str, call: InfillCall) -> tuple[str, str, str]:
    """The fill cut as llama.cpp cuts it: (content, stop_type, stopping_word).

    At a stop string ("word"), or before the first later line that is indented less than `n_indent` ("eos");
    otherwise "eos" when the fill ended itself, as a diffusion fill does within its canvas.
    """
    for word in call.stop:
        if word in text:
            return text[: text.index(word)], "word", word
    if call.n_indent > 0:
        offset = 0
        for number, line in enumerate(text.split("\n")):
            if number > 0 and line.strip() and len(line) - len(line.lstrip(" \t")) < call.n_indent:
                return text[:offset], "eos", ""
            offset += len(line) + 1
    return text, "eos", ""


def infill_answer(call: InfillCall, result: InfillResult | None, prompt_tokens: int, model: str,
                  elapsed_ms: float) -> dict[str, Any]:
    """llama.cpp's `/infill` answer for a fill (None: the warm-up, nothing predicted)."""
    answer = _full_answer(call, result, prompt_tokens, model, elapsed_ms)
    return answer if call.response_fields is None else select_fields(answer, call.response_fields)


def infill_chunks(call: InfillCall, result: InfillResult | None, prompt_tokens: int, model: str,
                  elapsed_ms: float) -> list[dict[str, Any]]:
    """llama.cpp's streamed `/infill` answer: a chunk with the content (none when it is empty), then the final
    chunk (`stop` true, empty content, `timings`; reduced to `response_fields`, as llama.cpp reduces only it)."""
    answer = _full_answer(call, result, prompt_tokens, model, elapsed_ms)
    chunks = []
    if answer["content"]:
        chunks.append({key: answer[key] for key in ("index", "content", "tokens", "id_slot", "tokens_predicted",
                                                    "tokens_evaluated")} | {"stop": False})
    final = {**answer, "content": ""}
    chunks.append(final if call.response_fields is None else select_fields(final, call.response_fields))
    return chunks


def _full_answer(call: InfillCall, result: InfillResult | None, prompt_tokens: int, model: str,
                 elapsed_ms: float) -> dict[str, Any]:
    text = result.text if result is not None and result.text is not None else ""
    content, stop_type, word = shape_content(text, call)
    stats = result.stats if result is not None else None
    predicted = len(result.candidates[0].token_ids) if result is not None and result.candidates else 0
    prompt_ms = stats.ms.get("tokenize", 0.0) + stats.ms.get("encode", 0.0) if stats else 0.0
    predicted_ms = max(elapsed_ms - prompt_ms, 0.0)
    answer: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": predicted,
        "tokens_evaluated": prompt_tokens,
        "generation_settings": {"n_predict": call.request.max_tokens, "seed": call.request.seed,
                                "n_indent": call.n_indent, "stop": list(call.stop), "sampler": "diffusion",
                                "forward_passes": stats.forward_passes if stats else 0},
        "prompt": "",
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": "none" if call.warm_up else stop_type,
        "stopping_word": word,
        "tokens_cached": 0,
        "timings": {
            "prompt_n": prompt_tokens,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_tokens, 3) if prompt_tokens else 0.0,
            "prompt_per_second": round(prompt_tokens / prompt_ms * 1000.0, 3) if prompt_ms else 0.0,
            "predicted_n": predicted,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_ms / predicted, 3) if predicted else 0.0,
            "predicted_per_second": round(predicted / predicted_ms * 1000.0, 3) if predicted_ms else 0.0,
        },
    }
    return answer


def select_fields(answer: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """Only the named fields, as llama.cpp's `response_fields` does: "timings/prompt_n" becomes that flat key."""
    selected: dict[str, Any] = {}
    for path in paths:
        value: Any = answer
        for part in re.split("/", path):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            selected[path] = value
    return selected

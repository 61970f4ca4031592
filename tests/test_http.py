"""The team server (`diffill http`) over real HTTP on loopback: llama.cpp's /infill as llama.vscode and llama.vim
send it, diffill's own endpoints, keys, limits, bad input, and a client that hangs up in the middle of a fill.

One real server (uvicorn, the scripted engine of tests/lsp/fake_engine.py) serves the module; the llama.cpp
mapping's pure parts are tested in process, and the tiny random checkpoint serves one /infill at the end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from infill_engine.http.llama import infill_answer, parse_infill, select_fields, shape_content
from tests import tiny_models
from tests.http_server import KEY, WAIT, request, start_server, stop

MAX_BODY = 64 * 1024
ADD_PREFIX = "def add(a, b):\n"
ADD_LINE = "    return "

# llama.vscode's FIM request body (src/llama-server.ts, createRequestPayload), with the ring chunks it sends
LLAMA_VSCODE = {
    "input_prefix": ADD_PREFIX, "input_suffix": "\n", "prompt": ADD_LINE, "n_predict": 128,
    "input_extra": [{"text": "import math\n", "time": 1732990000, "filename": "util.py"}],
    "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
    "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 2500,
}
# ... and its warm-up of the extra context (noPredict): nothing to predict
LLAMA_VSCODE_WARM_UP = {
    "input_prefix": "", "input_suffix": "", "input_extra": LLAMA_VSCODE["input_extra"], "prompt": "",
    "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1,
}
# llama.vim's FIM request body (autoload/llama.vim, llama#fim)
LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
LLAMA_VIM = {
    "input_prefix": ADD_PREFIX, "input_suffix": "\n\n", "input_extra": [], "prompt": ADD_LINE, "n_predict": 256,
    "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1500, "response_fields": LLAMA_VIM_FIELDS,
}
# ... and its ring-buffer update (s:ring_update): no samplers, no fields wanted back
LLAMA_VIM_RING = {
    "input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x = 1\n", "time": [1, 2], "filename": "a.py"}],
    "prompt": "", "n_predict": 0, "temperature": 0.0, "stream": False, "samplers": [], "cache_prompt": True,
    "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""],
}


@pytest.fixture(scope="module")
def server():
    process, port = start_server("--api-key", KEY, "--max-body-bytes", str(MAX_BODY), "--max-tokens", "256")
    yield port
    stop(process)


def post(port: int, path: str, body, key: str | None = KEY):
    return request(port, "POST", path, body, key=key)


# ------------------------------------------------------------------------------------------------- llama.cpp
def test_health_needs_no_key_and_everything_else_does(server):
    assert request(server, "GET", "/health") == (200, {"status": "ok"})
    for key in (None, "wrong-key"):
        status, body = post(server, "/infill", LLAMA_VSCODE, key=key)
        assert status == 401
        assert body == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    assert request(server, "GET", "/v1/model")[0] == 401


def test_llama_vscode_gets_the_fill_with_llama_cpp_answer_fields(server):
    status, body = post(server, "/infill", LLAMA_VSCODE)
    assert status == 200, body
    assert body["content"] == "a + b"
    assert body["stop"] is True and body["tokens_predicted"] > 0
    assert set(body["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
    status, warm = post(server, "/infill", LLAMA_VSCODE_WARM_UP)  # warming the cache predicts nothing
    assert status == 200 and warm["content"] == "" and warm["tokens_predicted"] == 0


def test_llama_vim_gets_the_fields_it_asks_for_as_flat_keys(server):
    status, body = post(server, "/infill", LLAMA_VIM)
    assert status == 200, body
    assert list(body) == LLAMA_VIM_FIELDS  # "timings/prompt_n" and the others, as llama.cpp flattens them
    assert body["content"] == "a + b"
    assert post(server, "/infill", LLAMA_VIM_RING) == (200, {})


# -------------------------------------------------------------------------------------------- diffill's own
def test_fill_offers_several_candidates_with_their_verdicts(server):
    status, body = post(server, "/v1/fill", {"prefix": ADD_PREFIX + ADD_LINE, "suffix": "\n", "candidates": 2,
                                             "max_tokens": 16, "language": "python"})
    assert status == 200, body
    assert body["text"] == "a + b"
    assert [c["text"] for c in body["candidates"]] == ["a + b", "b + a"]
    assert all(c["gate"]["ok"] for c in body["candidates"])
    status, gated = post(server, "/v1/fill", {"prefix": "broken = ", "suffix": "\n", "language": "python"})
    assert status == 200 and gated["text"] is None and gated["rejected"]  # "foo(" does not pass the syntax gate


def test_rewrite_puts_the_instruction_before_the_selection_and_refine_keeps_what_it_can(server):
    status, body = post(server, "/v1/rewrite", {"prefix": "def mul(a, b):\n    ", "selection": "return a + b",
                                                "suffix": "\n", "instruction": "make it a product",
                                                "comment": "#", "max_tokens": 16})
    assert status == 200, body
    assert body["replaces"] == "return a + b"
    status, body = post(server, "/v1/rewrite", {"prefix": "def mul(a, b):\n    return ", "selection": "a + b",
                                                "suffix": "\n", "instruction": "make it a product", "max_tokens": 16})
    assert status == 200 and body["text"] == "a * b", body
    status, body = post(server, "/v1/refine", {"prefix": "def sub(a, b):\n    return ", "suffix": "\n",
                                               "original": "a + b", "keep_above": None, "renoise": [[0, 5]]})
    assert status == 200 and body["text"] == "a - b", body


def test_a_streamed_fill_reports_each_step_then_the_result(server):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=WAIT)
    connection.request("POST", "/v1/fill", json.dumps({"prefix": ADD_PREFIX + ADD_LINE, "suffix": "\n",
                                                       "stream": True}),
                       {"Authorization": f"Bearer {KEY}"})
    response = connection.getresponse()
    lines = [json.loads(line) for line in response.read().splitlines()]
    connection.close()
    assert response.status == 200
    assert lines[0] == {"block": 0, "step": 0}
    assert lines[-1]["result"]["text"] == "a + b"


def test_a_streamed_infill_sends_llama_cpp_chunks_the_last_with_timings(server):
    import http.client

    def events(body) -> tuple[int, str, list]:
        connection = http.client.HTTPConnection("127.0.0.1", server, timeout=WAIT)
        connection.request("POST", "/infill", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
        assert text.endswith("\n\n") and all(e.startswith("data: ") for e in text[:-2].split("\n\n")), text
        return (response.status, response.getheader("content-type"),
                [json.loads(e[len("data: "):]) for e in text[:-2].split("\n\n")])

    status, kind, chunks = events({**LLAMA_VSCODE, "stream": True})
    assert status == 200 and kind == "text/event-stream"
    assert "".join(c["content"] for c in chunks) == "a + b"  # what a client that appends the chunks shows
    assert [c["stop"] for c in chunks] == [False, True]
    assert chunks[-1]["content"] == "" and chunks[-1]["timings"]["predicted_n"] > 0
    status, _, chunks = events({**LLAMA_VIM, "stream": True})  # the final chunk alone is reduced to the fields
    assert status == 200 and chunks[0]["content"] == "a + b" and list(chunks[-1]) == LLAMA_VIM_FIELDS
    status, body = post(server, "/infill", {**LLAMA_VIM, "stream": "yes"})
    assert status == 400 and "stream" in body["error"]["message"]


# ------------------------------------------------------------------------------------------ limits and errors
def test_bad_requests_get_a_clear_answer_and_the_server_keeps_serving(server):
    big = json.dumps({"prefix": "x" * MAX_BODY, "suffix": ""}).encode()
    status, body = request(server, "POST", "/v1/fill", raw=big, key=KEY)
    assert status == 413 and str(MAX_BODY) in body["error"]["message"]
    status, body = request(server, "POST", "/infill", raw=b'{"input_prefix": "x",', key=KEY)
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = post(server, "/v1/fill", {"prefix": "x", "suffix": "", "colour": "red"})
    assert status == 400 and "colour" in body["error"]["message"]
    status, body = post(server, "/v1/fill", {"prefix": "x", "suffix": "", "max_tokens": 257})
    assert status == 400 and "256" in body["error"]["message"]
    status, body = post(server, "/infill", {"input_prefix": 3})
    assert status == 400 and "input_prefix" in body["error"]["message"]
    assert request(server, "GET", "/infill", key=KEY)[0] == 405
    assert request(server, "GET", "/nowhere", key=KEY)[0] == 404
    assert post(server, "/infill", LLAMA_VSCODE)[1]["content"] == "a + b"


def test_a_client_that_hangs_up_stops_its_fill(server):
    before = request(server, "GET", "/v1/status", key=KEY)[1]
    body = json.dumps({"prefix": "slow = ", "suffix": "\n", "max_tokens": 24}).encode()
    with socket.create_connection(("127.0.0.1", server), timeout=WAIT) as sock:
        sock.sendall(b"POST /v1/fill HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        deadline = time.monotonic() + WAIT
        while request(server, "GET", "/v1/status", key=KEY)[1]["queued"] == 0:  # the slow fill is on the model
            assert time.monotonic() < deadline, "the slow fill never started"
            time.sleep(0.05)
    # the fill (24 steps of 0.15 s) stops at its next step: the next request is answered, the hang-up counted
    assert post(server, "/infill", LLAMA_VSCODE)[1]["content"] == "a + b"
    after = request(server, "GET", "/v1/status", key=KEY)[1]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["served"] == before["served"] + 1  # the /infill; the slow fill was not served


# ---------------------------------------------------------------------------------------- in process, pure
def test_infill_body_becomes_a_hole_after_extra_context_prefix_and_prompt():
    call = parse_infill({**LLAMA_VSCODE, "n_predict": 5000}, max_tokens=256)
    assert call.request.prefix == "util.py\nimport math\n" + ADD_PREFIX + ADD_LINE
    assert call.request.suffix == "\n"
    assert call.request.max_tokens == 256  # lowered to the server's limit
    assert parse_infill({"input_prefix": "x"}, 256).request.max_tokens == 64  # llama.cpp's -1: our default
    with pytest.raises(ValueError, match="input_extra"):
        parse_infill({"input_extra": "not a list"}, 256)
    with pytest.raises(ValueError, match="n_predict"):
        parse_infill({"n_predict": "many"}, 256)
    assert call.request.budget_ms == 2500  # t_max_predict_ms: the fill's time budget
    assert parse_infill({"t_max_predict_ms": 0}, 256).request.budget_ms is None  # llama.cpp's 0: no limit
    with pytest.raises(ValueError, match="t_max_predict_ms"):
        parse_infill({"t_max_predict_ms": "soon"}, 256)


def test_content_is_cut_as_llama_cpp_cuts_it():
    call = parse_infill({"n_indent": 4, "stop": ["<END>"]}, 256)
    assert shape_content("a + b\n    c\nd = 1\n", call) == ("a + b\n    c\n", "eos", "")
    assert shape_content("a<END>b", call) == ("a", "word", "<END>")
    answer = infill_answer(call, None, 3, "m", 1.0)
    assert select_fields(answer, ("content", "timings/prompt_n", "no/such")) == {"content": "", "timings/prompt_n": 3}


def test_a_non_loopback_address_without_a_key_is_refused(capsys, monkeypatch):
    from diffill.cli import main

    monkeypatch.delenv("DIFFILL_API_KEY", raising=False)
    assert main(["http", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert "0.0.0.0" in error and "--api-key" in error


def test_the_tiny_model_answers_infill_and_several_candidates(tmp_path):
    from infill_engine.engine import InfillEngine
    from infill_engine.http.app import InfillApp
    from infill_engine.interface import ModelSpec

    app = InfillApp(InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path / "diffill")))))
    status, body = asyncio.run(call_app(app, "/infill", {**LLAMA_VIM, "n_predict": 8}))
    assert status == 200, body
    assert isinstance(body["content"], str) and list(body) == LLAMA_VIM_FIELDS
    status, body = asyncio.run(call_app(app, "/v1/fill", {"prefix": "x = ", "suffix": "\n", "candidates": 3,
                                                          "max_tokens": 8, "gate": False}))
    assert status == 200 and body["stats"]["candidates"] == 3 and 1 <= len(body["candidates"]) <= 3, body


async def call_app(app, path: str, body) -> tuple[int, dict]:
    """One POST through the ASGI interface itself (the tiny model in this process; uvicorn is tested above)."""
    data = json.dumps(body).encode()
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": data, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_a_ray_replica_answers_each_call_of_a_batch_and_one_bad_call_fails_alone():
    from infill_engine.batched_fill import FillBatcher
    from infill_engine.http.ray_serve import run_calls
    from tests.lsp.fake_engine import build_engine

    fill = {"method": "fill", "args": {"request": {"prefix": ADD_PREFIX + ADD_LINE, "suffix": "\n"}}, "options": {}}
    bad = {"method": "fill", "args": {"request": {"prefix": "x", "suffix": "", "max_tokens": 0}}, "options": {}}
    count = {"method": "count_tokens", "args": {"text": "return a + b"}, "options": {"steps": 4}}
    engine = build_engine(None)
    answers = run_calls(FillBatcher(engine), [fill, bad, count, fill])
    assert answers[0]["result"]["candidates"][0]["text"] == "a + b" and answers[3] == answers[0]
    assert answers[1]["error"]["kind"] == "ValueError" and "max_tokens" in answers[1]["error"]["message"]
    assert answers[2]["result"] == engine.count_tokens("return a + b")
    assert engine.denoiser.encodes == 1  # the two equal fills were denoised once


def test_a_ray_replica_stops_the_canvas_of_a_caller_that_went_away_and_answers_the_others():
    import threading

    from infill_engine.batched_fill import FillBatcher
    from infill_engine.http.ray_serve import run_calls
    from tests.lsp.fake_engine import build_engine

    slow = {"method": "fill", "args": {"request": {"prefix": "slow = ", "suffix": "\n", "max_tokens": 24}},
            "options": {}}
    fill = {"method": "fill", "args": {"request": {"prefix": ADD_PREFIX + ADD_LINE, "suffix": "\n"}}, "options": {}}
    gone = [threading.Event(), threading.Event()]
    gone[0].set()  # the slow fill's client hung up while its batch waited (24 steps of 0.15 s otherwise)
    answers = run_calls(FillBatcher(build_engine(None)), [slow, fill], gone)
    assert answers[0] == {"error": {"kind": "FillCancelled", "message": "the caller went away"}}
    assert answers[1]["result"]["candidates"][0]["text"] == "a + b"

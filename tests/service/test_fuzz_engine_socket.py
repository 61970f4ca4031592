"""Fuzzing the shared engine's socket: random, truncated and wrong-shaped msgpack frames from a client of its own.

A real `diffill engine serve` (the fake engine of tests/service: a real InfillEngine around a scripted denoiser)
serves the module. Each example connects, maybe says hello, sends a random mix of well-formed requests with junk
params, messages of the wrong shape, random values, random bytes and frames cut short, and reads until every request
is answered or the engine closes the connection. Properties: that happens in time (no hang); every answer is a
well-formed response whose error, if any, has a type and a message and is never an internal error (an exception
that escaped the engine's checks); the engine process lives on; a well-behaved client connected all along is served
the same fill before and after every example.
"""

from __future__ import annotations

import os
import socket as sockets
import struct

import msgpack
import pytest
from hypothesis import example, given, strategies as st

from infill_engine.request import InfillRequest
from infill_engine.service.api import EngineClient
from tests.fuzzing import examples
from tests.service.conftest import WAIT

ADD = InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", language="python", candidates=2, max_tokens=16)
FIELDS = ["prefix", "suffix", "language", "max_tokens", "candidates", "seed", "repair_rounds", "gate", "single_line"]
VALID = {"prefix": "def add(a, b):\n    return ", "suffix": "\n", "language": "python", "max_tokens": 8}

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.integers(-3, 40) | st.floats()
           | st.text(max_size=16) | st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
ids = st.integers(-(2**63), 2**64 - 1) | st.integers(0, 20) | values


@st.composite
def fill_params(draw: st.DrawFn) -> dict:
    """A fill or refine: a valid request with some fields replaced by junk, config and refine fields now and then."""
    request = dict(VALID)
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        request[name] = draw(values)
    params: dict = {"request": draw(st.just(request) | values)}
    for name in draw(st.lists(st.sampled_from(["config", "document", "original", "renoise", "keep_above", "grow"]),
                              max_size=3, unique=True)):
        params[name] = draw(values | st.sampled_from([{"steps": 2**63}, {"seed": -1}, {"steps": "x"},
                                                      [[0, 2**40]], [[5, 1]], "return a"]))
    return params


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """(bytes to send, the id of a request that must be answered, or None)."""
    kind = draw(st.sampled_from(["fill", "fill", "refine", "tokenize", "status", "unknown", "cancel", "response",
                                 "shape", "value", "bytes", "bad map key"]))
    call_id = draw(st.integers(1, 2**31))
    if kind in ("fill", "refine"):
        return frame([0, call_id, kind, draw(fill_params())]), call_id
    if kind == "tokenize":
        params = draw(st.fixed_dictionaries({"text": values}, optional={"add_special_tokens": values}) | values)
        return frame([0, call_id, "tokenize", params]), call_id
    if kind == "status":
        return frame([0, call_id, "status", draw(values)]), call_id
    if kind == "unknown":
        return frame([0, call_id, draw(st.text(max_size=12).filter(lambda m: m != "shutdown")), draw(values)]), call_id
    if kind == "cancel":
        return frame([2, "cancel", draw(st.fixed_dictionaries({"id": ids}) | values)]), None
    if kind == "response":
        return frame([1, draw(ids), draw(values), draw(values)]), None
    if kind == "shape":  # the right kind of message with the wrong parts, or of the wrong length
        return frame(draw(st.lists(values, max_size=6).map(lambda rest: [draw(st.sampled_from([0, 1, 2, 3, True])),
                                                                          *rest]))), None
    if kind == "value":
        return frame(draw(values)), None
    if kind == "bad map key":  # valid msgpack that the engine must refuse: a map with a non-string key
        return struct.pack(">I", 4) + b"\x81\x01\x02\xc0", None
    return draw(st.binary(max_size=40)), None


def frame(message: object) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def exchange(path, data: bytes, wanted: set[int], end: str) -> list:
    """Send the bytes, end as told, and read answers until every wanted id is answered or the engine closes."""
    sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(str(path))
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):  # the engine closed on an earlier bad frame
        pass
    if end == "half close":
        sock.shutdown(sockets.SHUT_WR)
    answers, buffer = [], b""
    while True:
        while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
            size = struct.unpack(">I", buffer[:4])[0]
            answers.append(msgpack.unpackb(buffer[4 : 4 + size], raw=False, strict_map_key=False))
            buffer = buffer[4 + size :]
        answered = {a[1] for a in answers if isinstance(a, list) and len(a) == 4 and a[0] == 1}
        if wanted <= answered and end != "half close":
            break
        try:
            chunk = sock.recv(65536)
        except sockets.timeout:
            raise AssertionError(f"no answer within {WAIT} s for {sorted(wanted - answered)}") from None
        except ConnectionResetError:
            break
        if not chunk:
            break
        buffer += chunk
    sock.close()
    return answers


@pytest.fixture(scope="module")
def good(engine):
    """A well-behaved client connected all through the module."""
    _, path = engine
    client = EngineClient.connect(str(path))
    yield client
    client.close()


@examples(60)
@given(hello=st.sampled_from(["valid", "valid", "valid", "none", "wrong"]), sent=st.lists(messages(), max_size=6),
       end=st.sampled_from(["wait", "wait", "half close", "cut frame", "oversized"]))
@example(hello="valid", sent=[(frame([0, 7, "fill", {"request": {**VALID, "seed": 2**64 - 1}}]), 7)], end="wait")
# A seed of false passed the request's checks (a bool is an int) and torch's manual_seed raised: an internal error.
@example(hello="valid", sent=[(frame([0, 1, "fill", {"request": {**VALID, "seed": False}}]), 1)], end="wait")
def test_any_bytes_get_answers_or_a_closed_connection_and_others_are_served(engine, good, hello, sent, end):
    process, path = engine
    data = {"valid": frame([0, 0, "hello", {"protocol": 1, "client": "fuzz"}]), "none": b"",
            "wrong": frame([0, 0, "hello", {"protocol": 99}])}[hello]
    wanted = {0} if hello != "none" else set()
    for message, call_id in sent:
        data += message
        if call_id is not None:
            wanted.add(call_id)
    if end == "cut frame":
        data += struct.pack(">I", 100) + os.urandom(10)
    elif end == "oversized":
        data += struct.pack(">I", 2**32 - 1)
    answers = exchange(path, data, wanted if hello == "valid" and end == "wait" else set(), end)
    for answer in answers:
        if answer[:2] == [2, "progress"]:  # a fill's denoising steps
            continue
        assert isinstance(answer, list) and len(answer) == 4 and answer[0] == 1, answer
        failure = answer[2]
        if failure is not None:
            assert isinstance(failure["type"], str) and isinstance(failure["message"], str), answer
            assert failure["type"] != "Internal", f"an exception escaped the engine's checks: {failure['message']}"
    assert process.poll() is None, "the engine died"
    assert good.fill(ADD).text == "a + b"  # another client is served as before

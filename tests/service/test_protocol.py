"""The engine's socket protocol: fills as in process, bad input from one client never hurts another, the
handshake, the socket's permissions and the TCP listener's rules."""

from __future__ import annotations

import os
import socket as sockets
import stat
import struct
import subprocess
import sys
import threading

import msgpack
import pytest

from infill_engine.request import FillCancelled, InfillRequest
from infill_engine.service import address
from infill_engine.service.api import EngineClient, HandshakeError, RemoteStep
from tests.service.conftest import WAIT, engine_env, start_engine, stop

ADD = InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", language="python", candidates=2, max_tokens=16)
SLOW = InfillRequest(prefix="slow = ", suffix="\n", language="python", max_tokens=24)


def raw(path) -> sockets.socket:
    sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(str(path))
    return sock


def frame(message) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def answers_then_closes(sock: sockets.socket) -> list:
    """Every message the engine sends until it closes the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread bytes still in its buffer
        pass
    messages = []
    while len(data) >= 4:
        (size,) = struct.unpack(">I", data[:4])
        messages.append(msgpack.unpackb(data[4 : 4 + size]))
        data = data[4 + size :]
    return messages


def test_fill_over_the_socket_is_the_in_process_fill(engine):
    from tests.lsp.fake_engine import build_engine

    _, path = engine
    client = EngineClient.connect(str(path))
    steps = []
    result = client.fill(ADD, on_step=lambda view: steps.append(view))
    local = build_engine(None).fill(ADD)
    assert [c.text for c in result.candidates] == [c.text for c in local.candidates] == ["a + b", "b + a"]
    assert result.candidates[0].gate is not None and result.candidates[0].gate.ok
    assert result.stats.forward_passes == local.stats.forward_passes == len(steps) > 0
    assert isinstance(steps[0], RemoteStep)
    assert client.tokenize("return a") == build_engine(None).tokenize("return a")
    assert client.hello["model"]["dtype"] == build_engine(None).describe().dtype == "float32"  # shown in logs
    client.close()


def test_on_step_false_cancels_the_remote_fill(engine):
    _, path = engine
    client = EngineClient.connect(str(path))
    seen = []
    steps_before = client.status()["steps"]
    with pytest.raises(FillCancelled):
        client.fill(SLOW, on_step=lambda view: seen.append(view) or len(seen) < 2)
    assert len(seen) == 2
    assert client.fill(ADD).text == "a + b"  # the connection is still good (and the slow fill has stopped)
    fast_steps = client.fill(ADD).stats.forward_passes
    # the slow fill (24 steps, one position each) stopped within a few steps of the cancel
    assert client.status()["steps"] - steps_before - 2 * fast_steps < 8
    client.close()


def test_invalid_request_is_a_value_error_and_the_connection_survives(engine):
    _, path = engine
    client = EngineClient.connect(str(path))
    with pytest.raises(ValueError, match="max_tokens"):
        client.fill(InfillRequest(prefix="x", suffix="", max_tokens=2000))  # over the engine's per-request limit
    assert client.fill(ADD).text == "a + b"
    client.close()


@pytest.mark.parametrize("bad", ["random", "truncated", "oversized", "wrong_shape", "no_handshake"])
def test_bad_input_gets_an_error_or_a_closed_connection_and_others_are_unaffected(engine, bad):
    _, path = engine
    good = EngineClient.connect(str(path))
    results = []
    worker = threading.Thread(target=lambda: results.append(good.fill(SLOW).text))
    worker.start()  # a well-behaved client's slow fill runs meanwhile
    sock = raw(path)
    hello = frame([0, 1, "hello", {"protocol": 1, "token": None}])
    if bad == "random":
        sock.sendall(os.urandom(64) + b"\xc1" * 64)  # 0xc1 is never valid msgpack
    elif bad == "truncated":
        sock.sendall(hello + frame([0, 2, "fill", {"request": {"prefix": "x", "suffix": ""}}])[:-5])
        sock.shutdown(sockets.SHUT_WR)
    elif bad == "oversized":
        sock.sendall(hello + struct.pack(">I", 64 * 1024 * 1024) + b"x" * 100)
    elif bad == "wrong_shape":
        sock.sendall(hello + frame({"method": "fill"}))
    else:
        sock.sendall(frame([0, 1, "fill", {"request": {"prefix": "x", "suffix": ""}}]))
    messages = answers_then_closes(sock)  # returns only when the engine has closed the connection
    errors = [m[2] for m in messages if m[0] == 1 and m[2] is not None]
    if bad != "truncated":  # a frame cut short by a closed connection can only be answered by closing
        assert errors, messages
    worker.join(WAIT)
    from tests.lsp.fake_engine import build_engine

    assert results == [build_engine(None).fill(SLOW).text]  # the same fill as in process
    assert good.fill(ADD).text == "a + b"
    good.close()


def test_wrong_frame_contents_get_error_replies_without_closing(engine):
    _, path = engine
    sock = raw(path)
    sock.sendall(frame([0, 1, "hello", {"protocol": 1}]) + frame([0, 2, "fill", {"request": {"prefix": 1}}])
                 + frame([0, 3, "nonsense", {}]) + frame([0, 4, "status", {}]))
    received, data = {}, b""
    while len(received) < 4:
        data += sock.recv(65536)
        while len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
            size = struct.unpack(">I", data[:4])[0]
            message = msgpack.unpackb(data[4 : 4 + size])
            data = data[4 + size :]
            if message[0] == 1:
                received[message[1]] = message
    assert received[2][2]["type"] == "ValueError"
    assert received[3][2]["type"] == "NoSuchMethod"
    assert received[4][2] is None and received[4][3]["loads"] == 1
    sock.close()


def test_version_mismatch_is_refused_with_a_clear_error(engine):
    _, path = engine
    with pytest.raises(HandshakeError, match="protocol 1.*client speaks 99"):
        EngineClient.connect(str(path), protocol=99)
    with pytest.raises(HandshakeError, match="another model"):
        EngineClient.connect(str(path), expect_key="not-this-model")


def test_socket_and_directory_are_private(runtime):
    directory = address.runtime_dir()
    assert directory == runtime / "diffill"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    path = directory / "engine-test.sock"
    process = start_engine(runtime, path)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        stop(process)


def test_runtime_dir_refuses_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(PermissionError, match="not a directory"):
        address.ensure_private_dir(tmp_path / "link")


def free_port() -> int:
    with sockets.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tcp_needs_the_token(runtime, monkeypatch):
    port = free_port()
    monkeypatch.setenv("DIFFILL_ENGINE_TOKEN", "s3cret-token")
    process = start_engine(runtime, runtime / "tcp.sock", "--tcp", str(port))
    try:
        with pytest.raises(HandshakeError, match="token"):
            EngineClient.connect(f"tcp://127.0.0.1:{port}", token="wrong")
        with pytest.raises(HandshakeError, match="token"):
            EngineClient.connect(f"tcp://127.0.0.1:{port}")
        client = EngineClient.connect(f"tcp://127.0.0.1:{port}", token="s3cret-token")
        assert client.fill(ADD).text == "a + b"
        client.close()
    finally:
        stop(process)


def test_tcp_refuses_a_non_loopback_host_unless_allowed(runtime):
    assert address.parse_tcp("8123") == ("127.0.0.1", 8123)
    assert address.parse_tcp("[::1]:8123") == ("::1", 8123)
    with pytest.raises(ValueError, match="not a loopback"):
        address.parse_tcp("0.0.0.0:8123")
    assert address.parse_tcp("0.0.0.0:8123", allow_non_loopback=True) == ("0.0.0.0", 8123)
    finished = subprocess.run(
        [sys.executable, "-m", "diffill", "engine", "serve", "--tcp", "0.0.0.0:8123",
         "--socket", str(runtime / "x.sock")],
        env=engine_env(runtime), capture_output=True, text=True, timeout=WAIT,
    )
    assert finished.returncode == 2 and "not a loopback address" in finished.stderr
    assert not (runtime / "x.sock").exists()


def test_a_request_whose_write_fails_after_the_connection_closed_fails_once_with_connection_lost():
    """The reader thread may close the session (failing its pending calls) while a request's write is failing:
    the request's future then holds ConnectionLost once; it used to be set twice, an InvalidStateError that reached
    the language server as an internal error."""
    from infill_engine.service.session import ConnectionLost, Session

    class Closing:
        """A stream whose peer went away while a frame was being written."""

        stream = None

        def write(self, message: object) -> None:
            session.close("the peer closed the connection")
            raise ConnectionResetError("connection reset by peer")

    class Stream:
        def close(self) -> None:
            pass

    closing = Closing()
    closing.stream = Stream()
    session = Session(closing)  # type: ignore[arg-type]
    call = session.request("fill", {})
    with pytest.raises(ConnectionLost, match="the peer closed the connection"):
        call.future.result(timeout=WAIT)


def test_sampler_overrides_travel_with_the_request(engine):
    """A client's sampler settings (the editor's `sampling.overrides`) reach the shared engine: the remote fill is
    the in-process fill with the same settings, and differs from the one without them."""
    from infill_engine.interface import EngineOptions
    from tests.lsp.fake_engine import build_engine

    _, path = engine
    options = EngineOptions(sampler=(("allow_end_of_span", False),))  # every canvas position written
    client = EngineClient.connect(str(path))
    client.configure(options)
    remote, local = client.fill(ADD), build_engine(None).with_options(options).fill(ADD)
    written = [[c.text for c in result.candidates + result.rejected] for result in (remote, local)]
    assert written[0] == written[1] and all(len(text) > len("a + b") for text in written[0])
    client.configure(EngineOptions())
    assert [c.text for c in client.fill(ADD).candidates] == ["a + b", "b + a"]
    client.close()

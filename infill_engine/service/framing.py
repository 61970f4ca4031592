"""Framed msgpack: each message is a 4-byte big-endian length and that many bytes of msgpack.

A frame larger than the limit, a frame cut short, or bytes that are not msgpack raise FrameError: the stream cannot
be trusted after that, so the session answers with an error and closes the connection.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from infill_engine.service.stream import ByteStream, StreamClosed

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 8 * 1024 * 1024  # bytes of msgpack in one frame
BODY_TIMEOUT = 30.0  # seconds the rest of a frame may take once its header has arrived


class FrameError(Exception):
    """A frame that is oversized, truncated or not msgpack; the connection must be closed."""


class FramedStream:
    """Reads and writes whole msgpack messages over a byte stream."""

    def __init__(self, stream: ByteStream, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self.max_frame = max_frame

    def read(self) -> Any:
        """The next message; StreamClosed(at_boundary=True) when the peer closed between frames."""
        (size,) = HEADER.unpack(self._read(HEADER.size, None, first=True))
        if size > self.max_frame:
            raise FrameError(f"a frame of {size} bytes exceeds the limit of {self.max_frame} bytes")
        body = self._read(size, BODY_TIMEOUT, first=False)
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as error:  # noqa: BLE001 - msgpack raises several types for bad input
            raise FrameError(f"the frame is not valid msgpack ({type(error).__name__})") from None

    def _read(self, size: int, timeout: float | None, first: bool) -> bytes:
        try:
            return self.stream.read_exactly(size, timeout)
        except StreamClosed as closed:
            if first and closed.at_boundary:
                raise
            raise FrameError("the connection closed in the middle of a frame") from None
        except TimeoutError:
            raise FrameError(f"a frame was cut short (no more bytes for {BODY_TIMEOUT:g} s)") from None

    def write(self, message: Any) -> None:
        """Send one message; FrameError (nothing sent) when it would exceed the limit."""
        body = msgpack.packb(message, use_bin_type=True)
        if len(body) > self.max_frame:
            raise FrameError(f"a message of {len(body)} bytes exceeds the frame limit of {self.max_frame} bytes")
        self.stream.write(HEADER.pack(len(body)) + body)

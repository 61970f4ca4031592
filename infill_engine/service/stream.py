"""The byte stream: exact reads and whole writes over one connected socket."""

from __future__ import annotations

import socket
import threading


class StreamClosed(ConnectionError):
    """The peer closed the connection (cleanly, between messages, when `at_boundary` is True)."""

    def __init__(self, message: str, at_boundary: bool) -> None:
        super().__init__(message)
        self.at_boundary = at_boundary


class ByteStream:
    """A connected socket: `read_exactly` for the reader thread, `write` from any thread (writes never interleave)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._write_lock = threading.Lock()
        self._closed = False

    def read_exactly(self, size: int, timeout: float | None = None) -> bytes:
        """`size` bytes; StreamClosed when the peer closes first, TimeoutError when `timeout` s pass in between."""
        chunks, left = [], size
        self._sock.settimeout(timeout)
        try:
            while left:
                chunk = self._sock.recv(min(left, 1 << 20))
                if not chunk:
                    raise StreamClosed("the connection was closed", at_boundary=left == size)
                chunks.append(chunk)
                left -= len(chunk)
        except socket.timeout:
            raise TimeoutError(f"{size - left} of {size} bytes arrived before the timeout") from None
        finally:
            if timeout is not None and not self._closed:
                self._sock.settimeout(None)
        return b"".join(chunks)

    def write(self, data: bytes) -> None:
        """Send all of `data` (OSError when the connection is gone)."""
        with self._write_lock:
            self._sock.sendall(data)

    def close(self) -> None:
        """Close both directions; a blocked reader wakes up with StreamClosed or OSError."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed


def connect(address: str, timeout: float) -> ByteStream:
    """A stream to `address`: a Unix socket path, or `tcp://HOST:PORT` (OSError when nothing listens there)."""
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://"):].rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
    sock.settimeout(None)
    return ByteStream(sock)

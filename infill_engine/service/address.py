"""Where an engine listens: a Unix socket in a directory only the user can enter, or loopback TCP with a token.

The directory is `$XDG_RUNTIME_DIR/diffill/` when the runtime directory exists and belongs to the user, else
`/tmp/diffill-$UID/`; it is created with mode 0700 and refused when another user owns it. Each model gets its own
socket, `engine-<key>.sock` (mode 0600), where the key is a hash of what identifies the model, so language servers
configured for the same model share one engine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import stat
from pathlib import Path

LOOPBACK_NAMES = ("localhost",)


def runtime_dir() -> Path:
    """The private directory for sockets, locks and logs (created 0700; PermissionError if it is not private)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base) and os.stat(base).st_uid == os.getuid():
        directory = Path(base) / "diffill"
    else:
        directory = Path("/tmp") / f"diffill-{os.getuid()}"
    return ensure_private_dir(directory)


def ensure_private_dir(directory: Path) -> Path:
    """`directory`, created 0700 if missing; PermissionError when it is a link or another user's."""
    try:
        directory.mkdir(mode=0o700, parents=False)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{directory} is not a directory (a link or a file); refusing to use it")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user (uid {info.st_uid}); refusing to use it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


def model_key(identity: dict[str, object]) -> str:
    """A short stable hash of what identifies a model (path, family, device, dtype, factory)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def socket_path(key: str) -> Path:
    """The Unix socket of the engine for the model with this key."""
    return runtime_dir() / f"engine-{key}.sock"


def parse_tcp(value: str, allow_non_loopback: bool = False) -> tuple[str, int]:
    """(host, port) from `[HOST:]PORT`; ValueError for a bad port, or a non-loopback host not explicitly allowed."""
    host, _, port_text = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--tcp needs PORT or HOST:PORT with a port from 1 to 65535 (got {value!r})")
    if not allow_non_loopback and not is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host}, which is not a loopback address; name it with --allow-non-loopback "
            "as well if other machines should reach the engine"
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

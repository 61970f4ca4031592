"""Models by name: a Hugging Face id (`owner/name[@revision]`) resolved to a directory in huggingface_hub's cache.

    resolve_model_path("Dream-org/DreamOn-v0-7B")          # the cached snapshot, downloaded first if needed
    resolve_model_path("apple/DiffuCoder-7B-Base@a2c3305")  # a pinned revision (branch, tag or commit)
    resolve_model_path("~/models/mine")                     # a directory that exists always wins

The cache is huggingface_hub's own (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), read
on every call so that a changed environment counts, and `HF_HUB_OFFLINE` is honoured: offline, only what is
cached can be used, and a model that is not gets one message naming the id and how to fetch it. A snapshot already
in the cache is used without asking the network, so starting the editor offline works once a model was fetched.
Downloads are huggingface_hub's `snapshot_download` (resumable; progress on the command line as its own bars, or
reported to a callback). This module does not import torch; huggingface_hub is imported only to download.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# owner/name with an optional @revision; the characters the hub allows in repository names
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "on", "yes", "true"}

Progress = Callable[[str, float, float | None], None]  # (what, done, total or None), called while downloading


class HubError(Exception):
    """A hub id could not be resolved to a directory; the message says why and what to do."""


@dataclass(frozen=True)
class HubId:
    """A model on the Hugging Face hub, at a revision."""

    repo_id: str  # "owner/name"
    revision: str | None = None  # branch, tag or commit; None: the default branch ("main")

    @property
    def ref(self) -> str:
        """The revision asked for, "main" when none was."""
        return self.revision or "main"

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_id(text: str) -> HubId | None:
    """The hub id `text` names, or None when it is a local path (one that exists, or looks like one)."""
    if not text or text.startswith((".", "/", "~")) or Path(text).expanduser().exists():
        return None
    match = _HUB_ID.match(text)
    if match is None:
        return None
    return HubId(match["repo"], match["revision"])


def cache_dir() -> Path:
    """huggingface_hub's cache directory, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    """Whether `HF_HUB_OFFLINE` forbids the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def repo_folder(repo_id: str) -> Path:
    """The cache folder of a model repository (`models--owner--name`)."""
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(hub_id: HubId) -> Path | None:
    """The cached snapshot directory of `hub_id` (with a config.json), found without the network; None if absent."""
    folder = repo_folder(hub_id.repo_id)
    commit = hub_id.ref if _COMMIT.match(hub_id.ref) else None
    if commit is None:
        ref_file = folder / "refs" / hub_id.ref
        if not ref_file.is_file():
            return None
        commit = ref_file.read_text(encoding="utf-8").strip()
    snapshot = folder / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None


def repo_id_of(path: str | os.PathLike[str]) -> str | None:
    """The `owner/name` of a snapshot directory inside a hub cache (`.../models--owner--name/snapshots/<commit>`)."""
    parts = Path(path).parts
    for index, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[index + 1] == "snapshots":
            return part[len("models--"):].replace("--", "/", 1)
    return None


def fetch_command(hub_id: HubId) -> str:
    """The command that downloads `hub_id` into the cache."""
    revision = f" --revision {hub_id.revision}" if hub_id.revision else ""
    return f"huggingface-cli download {hub_id.repo_id}{revision}"


def resolve_model_path(path: str, progress: Progress | None = None) -> str:
    """The local directory of `path`: itself when it is not a hub id, else the cached (or downloaded) snapshot."""
    hub_id = parse_hub_id(path)
    if hub_id is None:
        return path
    snapshot = cached_snapshot(hub_id)
    if snapshot is not None:
        return str(snapshot)
    if offline():
        raise HubError(
            f"{hub_id} is not in the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE is set, so it cannot be "
            f"downloaded; fetch it once with `{fetch_command(hub_id)}` (or run diffill once with the network and "
            "without HF_HUB_OFFLINE)"
        )
    return str(download(hub_id, progress))


def download(hub_id: HubId, progress: Progress | None = None) -> Path:
    """Download (or finish downloading) `hub_id` into the cache with huggingface_hub; its snapshot directory."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, \
        RevisionNotFoundError

    try:
        folder = snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=str(cache_dir()),
                                   tqdm_class=_progress_class(str(hub_id), progress))
    except RepositoryNotFoundError:
        raise HubError(f"{hub_id.repo_id} is neither a local directory nor a model on the Hugging Face hub "
                       "(or it is private and you are not logged in: `huggingface-cli login`)") from None
    except RevisionNotFoundError:
        raise HubError(f"{hub_id.repo_id} has no revision {hub_id.ref!r}") from None
    except LocalEntryNotFoundError:
        raise HubError(f"{hub_id} could not be downloaded (no network?) and is not in the cache ({cache_dir()}); "
                       f"fetch it with `{fetch_command(hub_id)}` when you are online") from None
    except (HfHubHTTPError, OSError) as error:
        raise HubError(f"downloading {hub_id} failed: {error}") from None
    return Path(folder)


def _progress_class(name: str, progress: Progress | None) -> Any:
    """The tqdm class snapshot_download draws with: its own bars on the terminal, or one reporting to `progress`."""
    from tqdm.auto import tqdm

    if progress is None:
        return tqdm  # shown even when HF_HUB_DISABLE_PROGRESS_BARS quiets the rest of huggingface_hub

    class Reporter(tqdm):  # type: ignore[misc, valid-type]
        """Draws nowhere; reports each update of a byte-counting bar."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(file=io.StringIO(), disable=False)
            kwargs.pop("name", None)
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.unit == "B":
                progress(f"Downloading {name}", float(self.n), float(self.total) if self.total else None)
            return shown

    return Reporter

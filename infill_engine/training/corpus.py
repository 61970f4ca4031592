"""The training corpus: source files collected from directories, filtered, deduplicated and free of benchmark text.

Every file is kept or dropped for exactly one reason, counted in the manifest. A file that shares even one 13-word
shingle with the evaluation benchmark is dropped, so that benchmark scores measure infilling, not recall.

A source directory fetched from the package registries (`registry_corpus`) is described by a sources.json in it or
in the nearest directory above it. Then only the listed packages' directories are read, and each package's record,
its licence included, goes into the manifest with the number of its files kept.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from infill_engine.training.registry_corpus import find_sources_file, read_sources

logger = logging.getLogger(__name__)

SOURCE_EXTENSIONS = frozenset(
    {".py", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".go", ".rs", ".c", ".h", ".cpp", ".java", ".lua", ".json"}
)
# Directories never walked: installed third-party packages (the stdlib directory holds site-packages), caches and
# version-control metadata. Test and test-data directories are kept.
SKIPPED_DIRECTORIES = frozenset(
    {"site-packages", "dist-packages", "__pycache__", ".git", ".hg", ".svn", "node_modules", ".venv", ".tox"}
)
MAX_FILE_BYTES = 200 * 1024  # larger files are data or generated code, not code a person writes
MAX_LINE_CHARS = 400  # a single line longer than this marks a minified or data file
MAX_MEAN_LINE_CHARS = 120  # so does a mean line length above this
GENERATED_MARKERS = ("generated", "do not edit")  # looked for, case-insensitively, in the first lines
GENERATED_HEADER_LINES = 5
SHINGLE_WORDS = 13  # benchmark overlap: a shared run of this many whitespace-separated words
DEFAULT_BENCH_NAME = "humaneval-singleline-infilling.jsonl.gz"
DEFAULT_BENCH = Path("/work/shared/bench") / DEFAULT_BENCH_NAME
EVAL_FRACTION = 0.02  # share of documents held out for the evaluation loss
MAX_EXAMPLE_OVERLAPS = 20  # overlapping files listed by name in the manifest

# Reasons a file is dropped, in the order the checks run.
DROP_REASONS = ("huge", "non_utf8", "binary", "empty", "duplicate", "generated", "minified", "bench_overlap")


@dataclass(frozen=True)
class Document:
    """One source file of the corpus."""

    path: str  # where it was read from
    text: str
    sha256: str  # of its UTF-8 bytes
    split: str = "train"  # "train" or "eval" (held out for the evaluation loss)


@dataclass
class CorpusManifest:
    """What went into the corpus and what was dropped, per reason."""

    sources: list[str]
    files: int = 0
    bytes: int = 0
    eval_files: int = 0
    files_by_extension: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=lambda: {reason: 0 for reason in DROP_REASONS})
    bench: dict[str, Any] = field(default_factory=dict)  # path, problems, shingles, matches, example files
    tokens: int | None = None  # filled in once the tokenizer exists
    chars_per_token_python: float | None = None
    tokens_counted_share: float | None = None  # of the characters tokenized for `tokens` (1.0: all; below: scaled)
    # registry packages read (from sources.json): ecosystem, name, version, licence, ..., kept_files, kept_bytes
    packages: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "sources": self.sources,
            "files": self.files,
            "bytes": self.bytes,
            "eval_files": self.eval_files,
            "files_by_extension": dict(sorted(self.files_by_extension.items())),
            "dropped": self.dropped,
            "bench": self.bench,
            "tokens": self.tokens,
            "chars_per_token_python": self.chars_per_token_python,
            "tokens_counted_share": self.tokens_counted_share,
            "packages": self.packages,
        }


@dataclass
class Corpus:
    """The kept documents and the manifest that describes them."""

    documents: list[Document]
    manifest: CorpusManifest

    def split(self, name: str) -> list[Document]:
        """The documents of one split ("train" or "eval")."""
        return [d for d in self.documents if d.split == name]

    def training_documents(self, extensions: tuple[str, ...] = ()) -> list[Document]:
        """The train split, only the files whose names end with one of `extensions` where any are given; a
        ValueError naming the endings the split has when none matches."""
        documents = self.split("train")
        if not extensions:
            return documents
        chosen = [d for d in documents if d.path.endswith(extensions)]
        if not chosen:
            counts = Counter(Path(d.path).suffix or "(none)" for d in documents)
            have = ", ".join(f"{suffix} ({count})" for suffix, count in counts.most_common())
            raise ValueError(f"no training file ends with {' or '.join(extensions)}; the corpus has: {have}")
        return chosen


def stdlib_directory() -> Path:
    """The running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def default_bench_path() -> Path:
    """The benchmark file: the shared copy, or one in a `shared/bench` folder beside the repository."""
    beside_repo = Path(__file__).resolve().parents[3] / "shared" / "bench" / DEFAULT_BENCH_NAME
    for candidate in (DEFAULT_BENCH, beside_repo):
        if candidate.is_file():
            return candidate
    return DEFAULT_BENCH


def iter_source_files(directory: Path) -> Iterator[Path]:
    """Files with a source extension under `directory`, in sorted order, skipping SKIPPED_DIRECTORIES."""
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRECTORIES)
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix in SOURCE_EXTENSIONS and path.is_file() and not path.is_symlink():
                yield path


def package_roots(directory: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """The directories to read under `directory`, each with its registry package record (None for a plain directory).

    With a sources.json in `directory` or above it, only the directories of its packages that lie under `directory`
    (or the one package `directory` lies in) are read: files of packages not on the list never enter the corpus.
    """
    sources_file = find_sources_file(directory)
    if sources_file is None:
        return [(directory, None)]
    base = sources_file.parent
    resolved = directory.resolve()
    roots: list[tuple[Path, dict[str, Any] | None]] = []
    for record in read_sources(sources_file):
        package_dir = (base / record["path"]).resolve()
        entry = {**record, "kept_files": 0, "kept_bytes": 0}
        if package_dir == resolved or resolved in package_dir.parents:
            roots.append((directory / package_dir.relative_to(resolved), entry))
        elif package_dir in resolved.parents:
            roots.append((directory, entry))
    if not roots:
        logger.warning("%s lists no package under %s: nothing is read from it", sources_file, directory)
    return roots


def iter_directory_files(
    directory: Path, packages: list[dict[str, Any]]
) -> Iterator[tuple[Path, dict[str, Any] | None]]:
    """Each source file under `directory` with its package record, appending each record to `packages` when reached."""
    for root, package in package_roots(directory):
        if package is not None:
            packages.append(package)
        for path in iter_source_files(root):
            yield path, package


def word_shingles(text: str, size: int = SHINGLE_WORDS) -> set[str]:
    """Every run of `size` consecutive whitespace-separated words, joined by one space."""
    words = text.split()
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


def load_bench_shingles(path: Path) -> tuple[set[str], int]:
    """The shingles of every benchmark problem (prompt + canonical_solution + suffix), and the problem count."""
    shingles: set[str] = set()
    problems = 0
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            shingles |= word_shingles(row["prompt"] + row["canonical_solution"] + row["suffix"])
            problems += 1
    return shingles, problems


def drop_reason(data: bytes) -> tuple[str | None, str | None]:
    """Why a file's bytes are not corpus material (None if they are), and its text when it decodes."""
    if len(data) > MAX_FILE_BYTES:
        return "huge", None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "non_utf8", None
    if "\x00" in text:
        return "binary", None
    if not text.strip():
        return "empty", None
    return None, text


def quality_reason(text: str) -> str | None:
    """"generated" or "minified" when the text is one of those, else None."""
    lines = text.splitlines()
    header = "\n".join(lines[:GENERATED_HEADER_LINES]).lower()
    if any(marker in header for marker in GENERATED_MARKERS):
        return "generated"
    if any(len(line) > MAX_LINE_CHARS for line in lines):
        return "minified"
    if sum(len(line) for line in lines) / max(len(lines), 1) > MAX_MEAN_LINE_CHARS:
        return "minified"
    return None


def bench_overlap(text: str, bench: set[str]) -> list[str]:
    """The benchmark shingles that occur in `text` (empty when none do)."""
    words = text.split()
    found = []
    for i in range(len(words) - SHINGLE_WORDS + 1):
        shingle = " ".join(words[i : i + SHINGLE_WORDS])
        if shingle in bench:
            found.append(shingle)
    return found


def is_eval_document(sha256: str, fraction: float = EVAL_FRACTION) -> bool:
    """Held out for evaluation: a stable choice from the content hash, independent of the other files."""
    return int(sha256[:8], 16) < fraction * 16**8


def build_corpus(
    sources: Iterable[str | os.PathLike[str]],
    bench_path: str | os.PathLike[str] | None = None,
    eval_fraction: float = EVAL_FRACTION,
) -> Corpus:
    """Collect, filter and deduplicate the source files under `sources`, dropping any that overlap the benchmark."""
    directories = [Path(s) for s in sources]
    manifest = CorpusManifest(sources=[str(d) for d in directories])
    bench: set[str] = set()
    bench_file = Path(bench_path) if bench_path is not None else default_bench_path()
    if bench_file.is_file():
        bench, problems = load_bench_shingles(bench_file)
        manifest.bench = {"path": str(bench_file), "problems": problems, "shingles": len(bench)}
    else:
        logger.warning("benchmark file %s not found: the corpus is NOT checked for benchmark overlap", bench_file)
        manifest.bench = {"path": str(bench_file), "checked": False}
    seen: set[str] = set()
    matched: Counter[str] = Counter()
    overlapping: list[dict[str, Any]] = []
    documents = []
    for directory in directories:
        if not directory.is_dir():
            raise FileNotFoundError(f"source directory {directory} does not exist or is not a directory")
        for path, package in iter_directory_files(directory, manifest.packages):
            try:
                if path.stat().st_size > MAX_FILE_BYTES:
                    manifest.dropped["huge"] += 1
                    continue
                data = path.read_bytes()
            except OSError as error:
                logger.info("skipping unreadable %s: %s", path, error)
                continue
            reason, text = drop_reason(data)
            digest = hashlib.sha256(data).hexdigest()
            if reason is None and digest in seen:
                reason = "duplicate"
            if reason is None:
                seen.add(digest)
                reason = quality_reason(text)
            if reason is None and bench:
                found = bench_overlap(text, bench)
                if found:
                    reason = "bench_overlap"
                    matched.update(found)
                    if len(overlapping) < MAX_EXAMPLE_OVERLAPS:
                        overlapping.append({"path": str(path), "shingles": len(found), "first": found[0]})
            if reason is not None:
                manifest.dropped[reason] += 1
                continue
            split = "eval" if is_eval_document(digest, eval_fraction) else "train"
            documents.append(Document(str(path), text, digest, split))
            manifest.files += 1
            manifest.bytes += len(data)
            manifest.files_by_extension[path.suffix] = manifest.files_by_extension.get(path.suffix, 0) + 1
            if package is not None:
                package["kept_files"] += 1
                package["kept_bytes"] += len(data)
    if bench:
        manifest.bench.update(
            {
                "files_dropped": manifest.dropped["bench_overlap"],
                "distinct_shingles_matched": len(matched),
                "shingle_occurrences_matched": sum(matched.values()),
                "most_common_shingles": [s for s, _ in matched.most_common(5)],
                "example_files": overlapping,
            }
        )
    _ensure_both_splits(documents)
    manifest.eval_files = sum(d.split == "eval" for d in documents)
    logger.info(
        "corpus: %d files, %d bytes (%d held out); dropped %s",
        manifest.files, manifest.bytes, manifest.eval_files, manifest.dropped,
    )
    return Corpus(documents, manifest)


def _ensure_both_splits(documents: list[Document]) -> None:
    """A corpus of two or more files always has at least one training and one evaluation document."""
    if len(documents) < 2:
        return
    splits = {d.split for d in documents}
    if splits == {"train"}:
        documents[-1] = Document(documents[-1].path, documents[-1].text, documents[-1].sha256, "eval")
    elif splits == {"eval"}:
        documents[0] = Document(documents[0].path, documents[0].text, documents[0].sha256, "train")


def write_corpus(corpus: Corpus, directory: str | os.PathLike[str]) -> None:
    """Write `corpus.jsonl` (one document a line) and `manifest.json`, each atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"path": d.path, "sha256": d.sha256, "split": d.split, "text": d.text}) + "\n"
             for d in corpus.documents)
    _write_atomically(directory / "corpus.jsonl", "".join(lines))
    write_manifest(corpus.manifest, directory)


def write_manifest(manifest: CorpusManifest, directory: str | os.PathLike[str]) -> None:
    """Write `manifest.json` atomically."""
    _write_atomically(Path(directory) / "manifest.json", json.dumps(manifest.as_dict(), indent=2) + "\n")


def read_corpus(directory: str | os.PathLike[str]) -> Corpus:
    """The corpus written by `write_corpus`."""
    directory = Path(directory)
    documents = []
    with open(directory / "corpus.jsonl", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            documents.append(Document(row["path"], row["text"], row["sha256"], row["split"]))
    raw = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    manifest = CorpusManifest(
        sources=raw["sources"], files=raw["files"], bytes=raw["bytes"], eval_files=raw["eval_files"],
        files_by_extension=raw["files_by_extension"], dropped=raw["dropped"], bench=raw["bench"],
        tokens=raw.get("tokens"), chars_per_token_python=raw.get("chars_per_token_python"),
        tokens_counted_share=raw.get("tokens_counted_share"),
        packages=raw.get("packages", []),
    )
    return Corpus(documents, manifest)


def _write_atomically(path: Path, text: str) -> None:
    """Write a file through a temporary name and rename it into place, so readers never see half of it."""
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)

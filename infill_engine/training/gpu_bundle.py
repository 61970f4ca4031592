"""Prepare what a GPU run needs beside the working tree, within the size that travels to the GPU machine.

    python -m infill_engine.training.gpu_bundle --run-dir ~/diffill-runs/dense-1      (or scripts/gpu-bundle)

    .gpu-bundle/                      ignored by git; named in the device call's `carry`
      corpus.jsonl.xz                 the run's corpus.jsonl, xz-compressed: all documents, or a deterministic share
      manifest.json                   the run's corpus manifest (sources, licences, filters)
      bench/*.jsonl.gz                the HumanEval infilling file, for a quick evaluation there
      wheels/*.whl                    packages the GPU machine lacks (tree-sitter: export and evaluation import it)
      bundle.json                     what went in, and the sizes

The GPU machine receives the working tree (tracked and untracked files that git does not ignore) plus the carried
paths. The bundle is refused when that sum exceeds the limit (60 MiB by default, the issue's figure; the device
tool's own limit is 64 MiB). The corpus is stored as compressed text rather than token ids: on a 4 MB sample of
dense-1's corpus, xz made the JSONL 5.3 times smaller and 16-bit ids of the same text only 5% smaller than that, while
text lets the GPU side cut holes by lines and characters with the training objective exactly as a CPU run does. The
tokenizer is the shipped model's, already in the tree (infill_engine/model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import lzma
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

logger = logging.getLogger(__name__)

MIB = 1 << 20
LIMIT_MIB = 60.0  # the limit for everything the GPU run receives
TOOL_LIMIT_MIB = 64.0  # the device tool refuses a larger working tree
MARGIN_BYTES = MIB  # headroom for files that appear in the tree between bundling and the run
CORPUS_FILE = "corpus.jsonl.xz"
BUNDLE_FILE = "bundle.json"
DEFAULT_OUT = Path(".gpu-bundle")
GPU_PYTHON = "3.12"  # the GPU machine's python3 (see docs/MODEL.md, "GPU run")
# the GPU image has torch, transformers, tokenizers, safetensors, numpy, msgpack and tqdm; not tree-sitter
DEFAULT_WHEELS = ("tree-sitter", "tree-sitter-python")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


class BundleTooLarge(ValueError):
    """What would travel to the GPU machine exceeds the limit."""


@dataclass
class BundleReport:
    """What a bundle holds and how big each part is, in bytes."""

    limit_bytes: int
    tree_bytes: int  # tracked files and untracked files git does not ignore
    corpus_bytes: int = 0
    wheel_bytes: int = 0
    other_bytes: int = 0  # manifest, bench file, bundle.json
    documents: int = 0  # kept in the shard
    documents_in_run: int = 0
    corpus_source_bytes: int = 0  # of the kept documents' corpus.jsonl lines, uncompressed
    source: str = ""
    source_stamp: str = ""  # size and mtime of the run's corpus.jsonl: a rebuilt corpus is compressed again
    wheels: list[str] = field(default_factory=list)

    @property
    def bundle_bytes(self) -> int:
        """The carried directory."""
        return self.corpus_bytes + self.wheel_bytes + self.other_bytes

    @property
    def total_bytes(self) -> int:
        """Everything that travels."""
        return self.tree_bytes + self.bundle_bytes

    def table(self) -> str:
        """A human-readable breakdown."""
        rows = [
            ("working tree (git ls-files + untracked)", self.tree_bytes),
            (f"corpus shard ({self.documents} of {self.documents_in_run} documents, "
             f"{self.corpus_source_bytes / MIB:.1f} MiB as JSONL)", self.corpus_bytes),
            (f"wheels ({', '.join('-'.join(w.split('-')[:2]) for w in self.wheels) or 'none'})", self.wheel_bytes),
            ("manifest, bench file, bundle.json", self.other_bytes),
            ("total that travels", self.total_bytes),
            ("limit", self.limit_bytes),
        ]
        return "\n".join(f"{name:<72} {size / MIB:8.2f} MiB" for name, size in rows)


def travelling_tree_bytes(repo: Path) -> int:
    """Bytes of the files the device tool copies: tracked files and untracked files that git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode("utf-8", "surrogateescape")
    total = 0
    for name in set(filter(None, listed.split("\0"))):
        path = repo / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def _ordered_lines(corpus_path: Path) -> list[tuple[bool, str, str]]:
    """(is_eval, sha256, line) of every document: held-out ones first, then the rest in sha256 order (a shuffle)."""
    rows = []
    with open(corpus_path, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            rows.append((row["split"] == "eval", row["sha256"], line if line.endswith("\n") else line + "\n"))
    rows.sort(key=lambda r: (not r[0], r[1]))
    return rows


def _compress(lines: list[str], destination: Path, preset: int) -> int:
    """Write `lines` xz-compressed to `destination` (atomically); its size."""
    staging = destination.with_name(destination.name + ".tmp")
    with lzma.open(staging, "wt", encoding="utf-8", preset=preset) as out:
        for line in lines:
            out.write(line)
    staging.replace(destination)
    return destination.stat().st_size


def write_corpus_shard(corpus_path: Path, destination: Path, budget: int, preset: int = 6) -> tuple[int, int, int]:
    """Compress as many documents as fit in `budget` bytes (held-out ones first); (documents, source bytes, size)."""
    rows = _ordered_lines(corpus_path)
    kept = len(rows)
    for _ in range(6):
        lines = [r[2] for r in rows[:kept]]
        size = _compress(lines, destination, preset)
        if size <= budget:
            return kept, sum(len(line.encode("utf-8")) for line in lines), size
        # keep the share of the text that the measured ratio says fits, with 3% to spare
        source = sum(len(line.encode("utf-8")) for line in lines)
        allowed, total, fitting = budget / size * source * 0.97, 0, 0
        for line in lines:
            total += len(line.encode("utf-8"))
            if total > allowed:
                break
            fitting += 1
        evals = sum(1 for r in rows if r[0])
        if fitting <= evals:
            break
        kept = fitting
        logger.info("the corpus is %.1f MiB compressed; keeping %d of %d documents", size / MIB, kept, len(rows))
    destination.unlink(missing_ok=True)
    raise BundleTooLarge(
        f"the corpus does not fit in the {budget / MIB:.1f} MiB left for it: even its held-out documents and a "
        "share of the training ones compress to more"
    )


def _wheel_name(spec: str) -> str:
    """The file-name form of a distribution name (tree-sitter -> tree_sitter)."""
    return spec.split("==")[0].replace("-", "_").lower()


def pinned(spec: str) -> str:
    """`spec` pinned to the installed version when it names none (the GPU side runs what the tests here ran)."""
    if "==" in spec:
        return spec
    try:
        return f"{spec}=={metadata.version(spec)}"
    except metadata.PackageNotFoundError:
        return spec


def download_wheels(specs: list[str], directory: Path, python_version: str) -> list[Path]:
    """Wheels for the GPU machine's Python (x86-64 manylinux), fetched with pip unless already in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    wheels = []
    for spec in map(pinned, specs):
        name, _, version = spec.partition("==")
        prefix = f"{_wheel_name(name)}-{version}" if version else f"{_wheel_name(name)}-"
        present = sorted(p for p in directory.glob("*.whl") if p.name.lower().startswith(prefix))
        if not present:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--python-version", python_version, "--implementation", "cp", "-d", str(directory)]
            for platform in PLATFORMS:
                command += ["--platform", platform]
            result = subprocess.run(command + [spec], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"pip could not download {spec} for Python {python_version}:\n{result.stderr}")
            present = sorted(p for p in directory.glob("*.whl") if p.name.lower().startswith(prefix))
        if not present:
            raise RuntimeError(f"pip downloaded no wheel named {prefix}* into {directory}")
        wheels.append(present[-1])
    return wheels


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def build_bundle(
    run_dir: Path,
    out: Path = DEFAULT_OUT,
    repo: Path = Path("."),
    limit_mib: float = LIMIT_MIB,
    wheels: list[str] | None = None,
    wheel_dir: Path | None = None,
    python_version: str = GPU_PYTHON,
    bench: Path | None = None,
    xz_preset: int = 6,
) -> BundleReport:
    """Write the bundle into `out`; raise BundleTooLarge when the tree and the bundle exceed `limit_mib`."""
    if not 0 < limit_mib <= TOOL_LIMIT_MIB:
        raise ValueError(f"the limit must be above 0 and at most the device tool's {TOOL_LIMIT_MIB:g} MiB "
                         f"(got {limit_mib:g})")
    run_dir, out, repo = Path(run_dir).expanduser(), Path(out), Path(repo)
    corpus_path = run_dir / "corpus.jsonl"
    if not corpus_path.is_file() or not (run_dir / "manifest.json").is_file():
        raise FileNotFoundError(f"{run_dir} has no corpus.jsonl and manifest.json (a run directory of diffill train)")
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / BUNDLE_FILE).read_text()) if (out / BUNDLE_FILE).is_file() else {}
    (out / BUNDLE_FILE).unlink(missing_ok=True)  # a bundle without its bundle.json is unfinished
    report = BundleReport(limit_bytes=int(limit_mib * MIB), tree_bytes=travelling_tree_bytes(repo),
                          source=str(run_dir.resolve()), source_stamp=_stamp(corpus_path))

    shutil.copyfile(run_dir / "manifest.json", out / "manifest.json")
    shutil.rmtree(out / "bench", ignore_errors=True)
    if bench is None:
        from infill_engine.training.corpus import default_bench_path

        bench = default_bench_path()
    if bench.is_file():
        (out / "bench").mkdir()
        shutil.copyfile(bench, out / "bench" / bench.name)
    if wheel_dir is not None:  # wheels gathered beforehand (tests, or a machine without pip's network)
        shutil.rmtree(out / "wheels", ignore_errors=True)
        shutil.copytree(wheel_dir, out / "wheels")
        wheel_files = sorted((out / "wheels").glob("*.whl"))
    elif wheels:
        wheel_files = download_wheels(wheels, out / "wheels", python_version)
        for stale in set((out / "wheels").glob("*.whl")) - set(wheel_files):
            stale.unlink()
    else:
        shutil.rmtree(out / "wheels", ignore_errors=True)
        wheel_files = []
    report.wheels = [w.name for w in wheel_files]
    report.wheel_bytes = sum(w.stat().st_size for w in wheel_files)
    report.other_bytes = sum(p.stat().st_size for p in (out / "bench").glob("*")) if (out / "bench").is_dir() else 0
    report.other_bytes += (out / "manifest.json").stat().st_size + 4096  # bundle.json, written last

    budget = report.limit_bytes - report.tree_bytes - report.wheel_bytes - report.other_bytes - MARGIN_BYTES
    if budget <= 0:
        shutil.rmtree(out, ignore_errors=True)
        raise BundleTooLarge(
            f"no room for a corpus: the working tree ({report.tree_bytes / MIB:.1f} MiB), wheels "
            f"({report.wheel_bytes / MIB:.1f} MiB) and the rest already reach the {limit_mib:g} MiB limit; "
            "remove large untracked files or carry fewer wheels"
        )
    shard = out / CORPUS_FILE
    reuse = (previous.get("source_stamp") == report.source_stamp and previous.get("source") == report.source
             and shard.is_file() and shard.stat().st_size <= budget and previous.get("corpus_bytes") == shard.stat().st_size)
    if reuse:
        logger.info("reusing %s (the run's corpus is unchanged)", shard)
        report.documents, report.corpus_source_bytes = previous["documents"], previous["corpus_source_bytes"]
        report.corpus_bytes = shard.stat().st_size
    else:
        logger.info("compressing %s into at most %.1f MiB", corpus_path, budget / MIB)
        report.documents, report.corpus_source_bytes, report.corpus_bytes = write_corpus_shard(
            corpus_path, shard, budget, xz_preset)
    with open(corpus_path, "rb") as lines:
        report.documents_in_run = sum(1 for _ in lines)
    if report.total_bytes > report.limit_bytes:  # the tree grew while the corpus was compressed
        raise BundleTooLarge(f"the tree and bundle come to {report.total_bytes / MIB:.1f} MiB, over the "
                             f"{limit_mib:g} MiB limit:\n{report.table()}")
    data = asdict(report) | {"total_bytes": report.total_bytes, "bundle_bytes": report.bundle_bytes,
                             "tokenizer_sha256": _tokenizer_digest(repo)}
    (out / BUNDLE_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return report


def _tokenizer_digest(repo: Path) -> str | None:
    """The shipped tokenizer the corpus is meant for (the GPU run checks it against the tree it finds)."""
    path = repo / "infill_engine" / "model" / "tokenizer.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    """Build the bundle and print its size; exit 2 with a message when it would not fit."""
    parser = argparse.ArgumentParser(prog="gpu-bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="a diffill train run directory (read only)")
    parser.add_argument("--out", default=DEFAULT_OUT, type=Path, help=f"bundle directory (default: {DEFAULT_OUT})")
    parser.add_argument("--repo", default=Path("."), type=Path, help="the repository root (default: .)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB,
                        help=f"working tree + bundle at most this (default: {LIMIT_MIB:g})")
    parser.add_argument("--wheel", action="append", metavar="SPEC",
                        help=f"a package to carry as a wheel (repeatable; default: {', '.join(DEFAULT_WHEELS)} at "
                             "the versions installed here)")
    parser.add_argument("--no-wheels", action="store_true", help="carry no wheels (the run then cannot export)")
    parser.add_argument("--wheel-dir", type=Path, help="copy the wheels from this directory instead of pip")
    parser.add_argument("--python-version", default=GPU_PYTHON,
                        help=f"the GPU machine's Python, for the wheels (default: {GPU_PYTHON})")
    parser.add_argument("--xz-preset", type=int, default=6, choices=range(10), metavar="0-9",
                        help="xz compression level (default: 6)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    wheels = [] if args.no_wheels else (args.wheel or list(DEFAULT_WHEELS))
    try:
        report = build_bundle(args.run_dir, args.out, args.repo, args.limit_mib, wheels, args.wheel_dir,
                              args.python_version, xz_preset=args.xz_preset)
    except (BundleTooLarge, FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"gpu-bundle: {error}", file=sys.stderr)
        return 2
    print(report.table())
    print(f"bundle written to {args.out}; carry it as {args.out.as_posix()!r} (see docs/MODEL.md, 'GPU run')")
    return 0


if __name__ == "__main__":
    sys.exit(main())

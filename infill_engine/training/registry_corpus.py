"""A training corpus from the package registries: permissively licensed PyPI wheels and npm tarballs.

`corpus_packages.tsv` names every package with an exact version and its SPDX licence. `fetch_corpus` downloads each
one with the registry's own client (`pip download` of a binary wheel, `npm pack` of a tarball), checks the licence the
downloaded metadata declares against the list, extracts the hand-written source files and records what it kept in
`sources.json`. `build_corpus` reads that file and copies the records, licences included, into the corpus manifest.

Layout under DEST:
    downloads/pypi/*.whl, downloads/npm/*.tgz   the archives as the clients wrote them (kept: a rerun skips them)
    src/pypi/NAME-VERSION/..., src/npm/NAME-VERSION/...   the extracted source files
    sources.json   one record per package: ecosystem, name, version, licence, files, bytes, path

    python -m infill_engine.training.registry_corpus DEST [--list PATH] [--only pypi|npm] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator

from infill_engine.training.package_licences import (
    DEFAULT_LIST,
    ECOSYSTEMS,
    Package,
    canonical_pypi_name,
    licence_mismatch,
    npm_licence,
    read_package_list,
    wheel_licence,
)

logger = logging.getLogger(__name__)

SOURCES_FILE = "sources.json"
SOURCES_FORMAT = "diffill-registry-corpus/1"  # marks a sources.json written here
CHARS_PER_TOKEN_ESTIMATE = 3.26  # the shipped tokenizer on Python; only for the size report
CLIENT_TIMEOUT_S = 900  # one download

# pip only downloads wheels: an sdist would have to be built. One interpreter and platform, so every run picks the
# same file.
PIP_DOWNLOAD_OPTIONS = (
    "--no-deps", "--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp",
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
)
PYTHON_EXTENSIONS = (".py",)
JAVASCRIPT_EXTENSIONS = (".js", ".mjs", ".cjs", ".ts", ".tsx")
# Type declarations hold signatures without bodies, mostly written by tsc from the .js beside them; minified and
# bundled files are one build's output of the sources we keep anyway.
JAVASCRIPT_EXCLUDED_SUFFIXES = (".d.ts", ".d.mts", ".d.cts", ".min.js", ".min.mjs", ".min.cjs", "-min.js",
                                ".bundle.js", ".umd.js")
# Directories never extracted: build output (npm), installed dependencies, and vendored copies of other projects,
# which carry their own licences rather than the package's.
NPM_EXCLUDED_DIRECTORIES = frozenset({"dist", "build", "bundles", "umd", "min", "node_modules", "coverage"})
VENDORED_DIRECTORIES = frozenset({"_vendor", "vendor", "vendors", "vendored", "_vendored", "third_party",
                                  "thirdparty", "_extern", "extern", "externals", "node_modules", "__pycache__"})

@dataclass
class PackageResult:
    """What fetching one package came to."""

    package: Package
    record: dict[str, Any] | None = None  # the sources.json record when it succeeded
    error: str | None = None  # why it did not
    downloaded: bool = False  # False when the archive was already there


@dataclass
class FetchReport:
    """All packages' results, in list order."""

    results: list[PackageResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every package was fetched and its licence confirmed."""
        return all(r.error is None for r in self.results)

    def summary(self) -> dict[str, dict[str, int]]:
        """Per ecosystem: packages, files, bytes and estimated tokens of the succeeded packages."""
        totals: dict[str, dict[str, int]] = {}
        for result in self.results:
            if result.record is None:
                continue
            entry = totals.setdefault(result.package.ecosystem, {"packages": 0, "files": 0, "bytes": 0})
            entry["packages"] += 1
            entry["files"] += result.record["files"]
            entry["bytes"] += result.record["bytes"]
        for entry in totals.values():
            entry["tokens_estimate"] = round(entry["bytes"] / CHARS_PER_TOKEN_ESTIMATE)
        return totals


# --- extraction ---------------------------------------------------------------------------------------------------


def keep_wheel_member(name: str) -> bool:
    """Whether a file of a wheel belongs in the corpus: Python source outside metadata and vendored copies."""
    parts = PurePosixPath(name).parts
    if not parts or not name.endswith(PYTHON_EXTENSIONS) or ".." in parts or name.startswith("/"):
        return False
    if parts[0].endswith(".dist-info"):
        return False
    return not any(part in VENDORED_DIRECTORIES for part in parts[:-1])


def keep_npm_member(name: str) -> bool:
    """Whether a file of an npm tarball (path without the top directory) is hand-written JavaScript/TypeScript."""
    parts = PurePosixPath(name).parts
    if not parts or ".." in parts or name.startswith("/"):
        return False
    lowered = parts[-1].lower()
    if not lowered.endswith(JAVASCRIPT_EXTENSIONS) or lowered.endswith(JAVASCRIPT_EXCLUDED_SUFFIXES):
        return False
    return not any(part in NPM_EXCLUDED_DIRECTORIES or part in VENDORED_DIRECTORIES for part in parts[:-1])


def iter_archive_sources(ecosystem: str, archive: Path) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) of every source file of a wheel or npm tarball the corpus keeps."""
    if ecosystem == "pypi":
        with zipfile.ZipFile(archive) as wheel:
            for info in wheel.infolist():
                if not info.is_dir() and keep_wheel_member(info.filename):
                    yield info.filename, wheel.read(info)
        return
    with tarfile.open(archive, "r:gz") as tarball:
        for member in tarball:
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) < 2:
                continue
            inner = "/".join(parts[1:])  # without package/
            if keep_npm_member(inner):
                handle = tarball.extractfile(member)
                if handle is not None:
                    yield inner, handle.read()


def extract_sources(ecosystem: str, archive: Path, target: Path) -> tuple[int, int]:
    """Write the kept source files of `archive` under `target`, all at once (a temporary directory renamed into
    place); the number of files and bytes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    files = size = 0
    try:
        for inner, data in iter_archive_sources(ecosystem, archive):
            path = temporary / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files += 1
            size += len(data)
        if target.exists():
            shutil.rmtree(target)
        os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return files, size


def counted_files(directory: Path) -> tuple[int, int]:
    """Files and bytes already extracted under `directory`."""
    files = size = 0
    for root, _, names in os.walk(directory):
        for name in names:
            files += 1
            size += (Path(root) / name).stat().st_size
    return files, size


# --- downloading --------------------------------------------------------------------------------------------------

# Downloads one package's archive into the (empty) directory given and returns its path.
Downloader = Callable[[Package, Path], Path]


def client_command(package: Package, directory: Path) -> list[str]:
    """The pip or npm command that downloads `package` into `directory`."""
    if package.ecosystem == "pypi":
        return [sys.executable, "-m", "pip", "download", "--quiet", *PIP_DOWNLOAD_OPTIONS,
                "--dest", str(directory), package.spec]
    return ["npm", "pack", "--silent", "--ignore-scripts", "--pack-destination", str(directory), package.spec]


def download_with_client(package: Package, directory: Path) -> Path:
    """Download with `pip download` or `npm pack`; the one archive it wrote."""
    command = client_command(package, directory)
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                                   cwd=directory)
    except FileNotFoundError:
        raise RuntimeError(f"{command[0]} is not installed: it is needed to download {package.ecosystem} packages")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(command[:3])} gave no result within {CLIENT_TIMEOUT_S} s") from None
    if completed.returncode != 0:
        lines = (completed.stderr or completed.stdout).strip().splitlines()
        detail = " | ".join(lines[-3:]) if lines else f"exit status {completed.returncode}"
        raise RuntimeError(f"{' '.join(command[:3])} {package.spec} failed: {detail}")
    archives = [p for p in directory.iterdir() if p.suffix in (".whl", ".tgz")]
    if len(archives) != 1:
        raise RuntimeError(f"{' '.join(command[:3])} {package.spec} wrote {len(archives)} archives, expected one")
    return archives[0]


def archive_matches(package: Package, filename: str) -> bool:
    """Whether a file in downloads/ECOSYSTEM is this package's archive."""
    if package.ecosystem == "pypi":
        parts = filename.split("-")
        return (filename.endswith(".whl") and len(parts) >= 5
                and canonical_pypi_name(parts[0]) == canonical_pypi_name(package.name) and parts[1] == package.version)
    return filename == npm_archive_name(package)


def npm_archive_name(package: Package) -> str:
    """The file name `npm pack` gives a package: @scope/name 1.0.0 -> scope-name-1.0.0.tgz."""
    return f"{package.name.lstrip('@').replace('/', '-')}-{package.version}.tgz"


def find_archive(package: Package, downloads: Path) -> Path | None:
    """The package's archive when an earlier run downloaded it."""
    if not downloads.is_dir():
        return None
    for path in sorted(downloads.iterdir()):
        if path.is_file() and archive_matches(package, path.name):
            return path
    return None


def obtain_archive(package: Package, downloads: Path, downloader: Downloader) -> tuple[Path, bool]:
    """The package's archive in `downloads`, downloaded unless already there; and whether it was downloaded."""
    existing = find_archive(package, downloads)
    if existing is not None:
        return existing, False
    downloads.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".download-{package.key}.", dir=downloads))
    try:
        archive = downloader(package, temporary)
        if not archive_matches(package, archive.name):
            raise RuntimeError(f"the client wrote {archive.name}, which is not {package.spec}")
        final = downloads / archive.name
        os.replace(archive, final)
        return final, True
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


# --- one package, all packages ------------------------------------------------------------------------------------


def fetch_package(package: Package, dest: Path, downloader: Downloader = download_with_client) -> PackageResult:
    """Download, check the licence of and extract one package; errors become the result's `error`."""
    target = dest / "src" / package.ecosystem / package.key
    try:
        archive, downloaded = obtain_archive(package, dest / "downloads" / package.ecosystem, downloader)
        declared = wheel_licence(archive) if package.ecosystem == "pypi" else npm_licence(archive)
        mismatch = licence_mismatch(package.licence, declared)
        if mismatch:
            shutil.rmtree(target, ignore_errors=True)  # never leave a refused package where the corpus reads
            return PackageResult(package, error=f"licence mismatch: {mismatch}", downloaded=downloaded)
        if target.is_dir() and not downloaded:
            files, size = counted_files(target)
        else:
            files, size = extract_sources(package.ecosystem, archive, target)
    except (OSError, RuntimeError, ValueError, zipfile.BadZipFile, tarfile.TarError) as error:
        return PackageResult(package, error=str(error))
    declared_text = declared.expression or declared.describe()
    record = {
        "ecosystem": package.ecosystem, "name": package.name, "version": package.version,
        "licence": package.licence, "declared_licence": declared_text, "files": files, "bytes": size,
        "path": f"src/{package.ecosystem}/{package.key}", "archive": archive.name,
    }
    return PackageResult(package, record=record, downloaded=downloaded)


def fetch_corpus(
    dest: str | os.PathLike[str],
    packages: Iterable[Package],
    downloader: Downloader = download_with_client,
    jobs: int = 1,
    ecosystems: Iterable[str] = ECOSYSTEMS,
) -> FetchReport:
    """Fetch every package into `dest` and write `dest/sources.json`; failures are reported, the rest go on.

    `packages` is the whole list of `ecosystems`: their packages missing from it leave sources.json and src/. Records of
    other ecosystems (an earlier `--only` run) are kept as they are.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be 1 or more, got {jobs}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    packages = list(packages)

    def one(package: Package) -> PackageResult:
        result = fetch_package(package, dest, downloader)
        if result.error:
            logger.error("%s %s: %s", package.ecosystem, package.spec, result.error)
        else:
            logger.info("%s %s: %d files, %d bytes%s", package.ecosystem, package.spec, result.record["files"],
                        result.record["bytes"], "" if result.downloaded else " (already downloaded)")
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        report = FetchReport(list(pool.map(one, packages)))
    fetched = set(ecosystems)
    kept = [r for r in read_sources(dest / SOURCES_FILE) if r["ecosystem"] not in fetched] \
        if (dest / SOURCES_FILE).is_file() else []
    records = kept + [r.record for r in report.results if r.record is not None]
    _remove_unlisted(dest, fetched, {r["path"] for r in records})
    write_sources(dest / SOURCES_FILE, records)
    return report


def _remove_unlisted(dest: Path, ecosystems: set[str], listed_paths: set[str]) -> None:
    """Remove extracted package directories of `ecosystems` that no record names (dropped from the list)."""
    for ecosystem in ecosystems:
        directory = dest / "src" / ecosystem
        if not directory.is_dir():
            continue
        for child in directory.iterdir():
            if child.is_dir() and f"src/{ecosystem}/{child.name}" not in listed_paths:
                logger.info("removing %s: not in the package list", child)
                shutil.rmtree(child)


# --- sources.json -------------------------------------------------------------------------------------------------


def write_sources(path: Path, records: list[dict[str, Any]]) -> None:
    """Write sources.json atomically, records sorted by ecosystem and name."""
    records = sorted(records, key=lambda r: (r["ecosystem"], r["name"].lower()))
    document = {"format": SOURCES_FORMAT, "packages": records}
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_sources(path: Path) -> list[dict[str, Any]]:
    """The package records of a sources.json; ValueError when it is not one written by `write_sources`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != SOURCES_FORMAT:
        raise ValueError(f"{path} is not a registry corpus record (expected \"format\": {SOURCES_FORMAT!r})")
    return list(document["packages"])


def find_sources_file(directory: Path) -> Path | None:
    """The sources.json that describes `directory`: in it, or in the nearest directory above it that has one."""
    directory = directory.resolve()
    for candidate in (directory, *directory.parents):
        path = candidate / SOURCES_FILE
        if path.is_file():
            return path
    return None


# --- command line -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the fetch command."""
    parser.add_argument("dest", type=Path, metavar="DEST",
                        help="where downloads/, src/ and sources.json go (a rerun skips finished downloads)")
    parser.add_argument("--list", type=Path, default=DEFAULT_LIST, metavar="PATH",
                        help="the package list (default: the committed infill_engine/training/corpus_packages.tsv)")
    parser.add_argument("--only", choices=ECOSYSTEMS, help="fetch one ecosystem's packages (default: both)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="downloads at once (default: 1)")


def run_fetch(dest: Path, list_path: Path = DEFAULT_LIST, only: str | None = None, jobs: int = 1,
              downloader: Downloader = download_with_client) -> int:
    """Fetch the listed packages and print a summary; 0 when all succeeded, 1 when any failed."""
    packages = read_package_list(list_path)
    if only:
        packages = [p for p in packages if p.ecosystem == only]
    report = fetch_corpus(dest, packages, downloader, jobs, ecosystems=[only] if only else ECOSYSTEMS)
    for ecosystem, totals in sorted(report.summary().items()):
        print(f"{ecosystem}: {totals['packages']} packages, {totals['files']} files, {totals['bytes']} bytes, "
              f"~{totals['tokens_estimate']} tokens (bytes / {CHARS_PER_TOKEN_ESTIMATE})")
    failures = [r for r in report.results if r.error]
    for result in failures:
        print(f"FAILED {result.package.ecosystem} {result.package.spec}: {result.error}", file=sys.stderr)
    print(f"wrote {Path(dest) / SOURCES_FILE}; {len(report.results) - len(failures)} of {len(report.results)} "
          f"packages fetched", file=sys.stderr)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m infill_engine.training.registry_corpus DEST [--list PATH] [--only pypi|npm] [--jobs N]`."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.registry_corpus",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return run_fetch(args.dest, args.list, args.only, args.jobs)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

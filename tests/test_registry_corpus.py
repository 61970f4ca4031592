"""The registry corpus: the package list, the licence check, extraction, sources.json and the manifest, resuming.

No network: the archives are built here and a stand-in downloader replaces pip and npm.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from infill_engine.training import package_licences as licences
from infill_engine.training import registry_corpus as rc
from infill_engine.training.corpus import build_corpus, read_corpus, write_corpus
from infill_engine.training.package_licences import DeclaredLicence, Package, licence_mismatch, parse_package_list

HEADER = "ecosystem\tname\tversion\tlicence\n"
PYTHON_SOURCE = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n"
JS_SOURCE = "export function add(a, b) {\n  return a + b;\n}\n"


# --- the list -----------------------------------------------------------------------------------------------------


def test_the_list_parses_packages_and_skips_comments() -> None:
    text = "# a comment\n" + HEADER + "\npypi\tDjango\t5.1.4\tBSD-3-Clause\nnpm\t@babel/core\t7.1.0\tmit\n"
    packages = parse_package_list(text, "list.tsv")
    assert packages == [Package("pypi", "Django", "5.1.4", "BSD-3-Clause"), Package("npm", "@babel/core", "7.1.0", "MIT")]
    assert [p.key for p in packages] == ["django-5.1.4", "@babel+core-7.1.0"]
    assert [p.spec for p in packages] == ["Django==5.1.4", "@babel/core@7.1.0"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("pypi\tdjango\t5.1.4", "expected 4 tab-separated columns"),
        ("cargo\tserde\t1.0.0\tMIT", "ecosystem 'cargo' is not one of pypi, npm"),
        ("pypi\tdjango\t>=5\tBSD-3-Clause", "is not one exact pypi version"),
        ("npm\tlodash\t^4.17.0\tMIT", "is not one exact npm version"),
        ("npm\t-rf\t1.0.0\tMIT", "is not a valid npm package name"),
        ("pypi\tpylint\t4.1.4\tGPL-2.0-or-later", "GPL-2.0-or-later is not a permissive licence"),
        ("pypi\tcertifi\t2024.1.1\tMPL-2.0", "MPL-2.0 is not a permissive licence"),
        ("npm\tdual\t1.0.0\tMIT OR GPL-3.0", "GPL-3.0 is not a permissive licence"),
        ("pypi\tdjango\t5.1.4\t", "the licence is empty"),
    ],
)
def test_a_bad_row_is_an_error_naming_its_line(row: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_package_list("# comment\n" + HEADER + row + "\n", "list.tsv")
    assert "list.tsv:3:" in str(error.value)
    assert message in str(error.value)


def test_a_package_listed_twice_and_a_missing_header_are_errors() -> None:
    with pytest.raises(ValueError, match=r"list.tsv:3: pypi package django_x is already listed on line 2"):
        parse_package_list(HEADER + "pypi\tDjango-X\t1.0\tMIT\npypi\tdjango_x\t1.1\tMIT\n", "list.tsv")
    with pytest.raises(ValueError, match=r"list.tsv:1: the first line must be the header"):
        parse_package_list("pypi\tdjango\t5.1.4\tBSD-3-Clause\n", "list.tsv")


def test_the_committed_list_is_valid_and_only_permissive() -> None:
    packages = rc.read_package_list()
    assert {p.ecosystem for p in packages} == {"pypi", "npm"}
    for package in packages:
        licences.check_permissive(package.licence)


# --- the licence check --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listed", "declared"),
    [
        ("MIT", DeclaredLicence(expression="MIT")),
        ("Apache-2.0 AND MIT", DeclaredLicence(expression="apache-2.0 and MIT")),
        ("BSD-3-Clause", DeclaredLicence(classifiers=("License :: OSI Approved :: BSD License",))),
        ("BSD-2-Clause", DeclaredLicence(text="BSD", classifiers=("License :: OSI Approved :: BSD License",))),
        ("Apache-2.0", DeclaredLicence(text="Apache 2.0 License")),
        ("PSF-2.0", DeclaredLicence(classifiers=("License :: OSI Approved :: Python Software Foundation License",))),
        ("BSD-3-Clause", DeclaredLicence(text="Copyright (c) 2005, NumPy Developers.\nAll rights reserved.\n\n"
                                              "Redistribution and use in source and binary forms ...\n" + "x\n" * 2000
                                              + "libgfortran: GPL-3.0-or-later WITH GCC-exception-3.1\n")),
    ],
)
def test_a_licence_the_package_declares_is_accepted(listed: str, declared: DeclaredLicence) -> None:
    assert licence_mismatch(listed, declared) is None


@pytest.mark.parametrize(
    ("listed", "declared", "message"),
    [
        ("MIT", DeclaredLicence(expression="BSD-3-Clause"), "declares 'BSD-3-Clause', the list says 'MIT'"),
        ("MIT", DeclaredLicence(expression="GPL-3.0-only"), "GPL-3.0-only is not a permissive licence"),
        ("MIT", DeclaredLicence(), "declares no licence"),
        ("MIT", DeclaredLicence(text="UNKNOWN"), "declares no licence"),
        ("BSD-3-Clause", DeclaredLicence(classifiers=("License :: OSI Approved :: BSD License",
                                                      "License :: OSI Approved :: GNU General Public License (GPL)")),
         "is not a permissive licence"),
        ("MIT", DeclaredLicence(classifiers=("License :: OSI Approved :: BSD License",)), "does not fit MIT"),
        ("MIT", DeclaredLicence(text="MIT or LGPL"), "mentions a refused licence"),
        ("MIT", DeclaredLicence(text="Our own licence\nwith many\nlines"), "does not recognise"),
    ],
)
def test_a_licence_that_disagrees_is_refused_with_the_reason(listed: str, declared: DeclaredLicence,
                                                             message: str) -> None:
    mismatch = licence_mismatch(listed, declared)
    assert mismatch is not None and message in mismatch


# --- archives built here ------------------------------------------------------------------------------------------


def make_wheel(directory: Path, name: str, version: str, metadata_licence: str) -> Path:
    """A wheel with Python sources, a vendored copy, a compiled module and METADATA carrying `metadata_licence`."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", PYTHON_SOURCE)
        wheel.writestr(f"{name}/sub/stats.py", PYTHON_SOURCE.replace("mean", "average"))
        wheel.writestr(f"{name}/_vendor/other/core.py", "x = 1\n")
        wheel.writestr(f"{name}/_speedups.cpython-311-x86_64-linux-gnu.so", b"\x7fELF")
        wheel.writestr(f"{name}/data.json", "{}")
        wheel.writestr(f"{name}-{version}.dist-info/METADATA",
                       f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{metadata_licence}\n")
        wheel.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


def make_npm_tarball(directory: Path, name: str, version: str, licence: str) -> Path:
    """An npm tarball with hand-written sources beside declarations, minified files, dist/ and node_modules/."""
    path = directory / rc.npm_archive_name(Package("npm", name, version, "MIT"))
    files = {
        "package/package.json": json.dumps({"name": name, "version": version, "license": licence}),
        "package/src/add.js": JS_SOURCE,
        "package/src/add.d.ts": "export declare function add(a: number, b: number): number;\n",
        "package/src/types.ts": "export type Pair = [number, number];\n",
        "package/lib/index.cjs": "module.exports = require('./add');\n",
        "package/lib/index.mjs": "export * from './add.js';\n",
        "package/add.min.js": "function add(a,b){return a+b}\n",
        "package/dist/bundle.js": JS_SOURCE,
        "package/node_modules/dep/index.js": JS_SOURCE,
        "package/README.md": "# readme\n",
    }
    with tarfile.open(path, "w:gz") as tarball:
        for member_name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tarball.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("package/src/link.js")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tarball.addfile(link)
    return path


def test_a_wheel_gives_its_python_files_without_metadata_or_vendored_copies(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0", "License-Expression: MIT")
    assert [name for name, _ in rc.iter_archive_sources("pypi", wheel)] == ["demo/__init__.py", "demo/sub/stats.py"]
    assert rc.wheel_licence(wheel) == DeclaredLicence(expression="MIT")


def test_an_npm_tarball_gives_hand_written_sources_only(tmp_path: Path) -> None:
    tarball = make_npm_tarball(tmp_path, "@demo/lib", "1.0.0", "ISC")
    kept = sorted(name for name, _ in rc.iter_archive_sources("npm", tarball))
    assert kept == ["lib/index.cjs", "lib/index.mjs", "src/add.js", "src/types.ts"]
    assert rc.npm_licence(tarball) == DeclaredLicence(expression="ISC")


# --- fetching -----------------------------------------------------------------------------------------------------


class FakeRegistry:
    """Stands in for pip and npm: builds each archive on request and counts the requests."""

    def __init__(self, licences: dict[str, str], failing: frozenset[str] = frozenset()) -> None:
        self.licences = licences  # the licence each package declares, by name
        self.failing = failing
        self.requests: list[str] = []

    def __call__(self, package: Package, directory: Path) -> Path:
        self.requests.append(package.spec)
        if package.name in self.failing:
            raise RuntimeError(f"npm pack {package.spec} failed: 404 Not Found")
        declared = self.licences[package.name]
        if package.ecosystem == "pypi":
            return make_wheel(directory, package.name, package.version, f"License-Expression: {declared}")
        return make_npm_tarball(directory, package.name, package.version, declared)


PACKAGES = [
    Package("pypi", "demo", "1.0", "MIT"),
    Package("npm", "@demo/lib", "2.0.0", "ISC"),
]


def test_fetch_extracts_records_and_resumes_without_downloading(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    registry = FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"})
    report = rc.fetch_corpus(dest, PACKAGES, registry)
    assert report.ok and registry.requests == ["demo==1.0", "@demo/lib@2.0.0"]
    assert (dest / "src/pypi/demo-1.0/demo/sub/stats.py").read_text() == PYTHON_SOURCE.replace("mean", "average")
    assert (dest / "src/npm/@demo+lib-2.0.0/src/add.js").read_text() == JS_SOURCE
    records = rc.read_sources(dest / "sources.json")
    assert [(r["ecosystem"], r["name"], r["version"], r["licence"], r["files"]) for r in records] == [
        ("npm", "@demo/lib", "2.0.0", "ISC", 4), ("pypi", "demo", "1.0", "MIT", 2)]
    assert report.summary()["pypi"]["bytes"] == records[1]["bytes"] > 0

    again = FakeRegistry({})  # would fail on any request
    report = rc.fetch_corpus(dest, PACKAGES, again)
    assert report.ok and again.requests == []
    assert rc.read_sources(dest / "sources.json") == records


def test_a_failed_download_is_reported_and_the_rest_go_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry = FakeRegistry({"demo": "MIT"}, failing=frozenset({"@demo/lib"}))
    list_path = tmp_path / "list.tsv"
    list_path.write_text(HEADER + "".join(f"{p.ecosystem}\t{p.name}\t{p.version}\t{p.licence}\n" for p in PACKAGES))
    status = rc.run_fetch(tmp_path / "registry", list_path, downloader=registry)
    assert status == 1
    assert "FAILED npm @demo/lib@2.0.0: npm pack @demo/lib@2.0.0 failed: 404 Not Found" in capsys.readouterr().err
    assert [r["name"] for r in rc.read_sources(tmp_path / "registry/sources.json")] == ["demo"]
    assert not list((tmp_path / "registry/downloads/npm").iterdir())  # no half download left behind


def test_a_licence_mismatch_is_refused_and_nothing_is_extracted(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    rc.fetch_corpus(dest, PACKAGES, FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"}))
    relicensed = [Package("pypi", "demo", "1.0", "Apache-2.0"), PACKAGES[1]]
    report = rc.fetch_corpus(dest, relicensed, FakeRegistry({}))
    assert not report.ok
    assert report.results[0].error == ("licence mismatch: the package declares 'MIT', the list says 'Apache-2.0'")
    assert not (dest / "src/pypi/demo-1.0").exists()
    assert [r["name"] for r in rc.read_sources(dest / "sources.json")] == ["@demo/lib"]


def test_a_package_dropped_from_the_list_leaves_the_corpus(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    rc.fetch_corpus(dest, PACKAGES, FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"}))
    rc.fetch_corpus(dest, PACKAGES[1:], FakeRegistry({}))
    assert not (dest / "src/pypi/demo-1.0").exists()
    assert (dest / "src/npm/@demo+lib-2.0.0").is_dir()
    assert [r["name"] for r in rc.read_sources(dest / "sources.json")] == ["@demo/lib"]


def test_fetching_one_ecosystem_keeps_the_others_records(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    rc.fetch_corpus(dest, PACKAGES, FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"}))
    rc.fetch_corpus(dest, PACKAGES[1:], FakeRegistry({}), ecosystems=["npm"])
    assert (dest / "src/pypi/demo-1.0").is_dir()
    assert [r["name"] for r in rc.read_sources(dest / "sources.json")] == ["@demo/lib", "demo"]


# --- the manifest -------------------------------------------------------------------------------------------------


def test_the_manifest_records_each_packages_licence_and_kept_files(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    rc.fetch_corpus(dest, PACKAGES, FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"}))
    stray = dest / "src/pypi/unlisted-0.1"  # not in sources.json: never read
    stray.mkdir(parents=True)
    (stray / "code.py").write_text("def unlisted():\n    return 1\n")
    corpus = build_corpus([dest], tmp_path / "absent-bench.gz")
    packages = {p["name"]: p for p in corpus.manifest.packages}
    assert {name: (p["licence"], p["kept_files"]) for name, p in packages.items()} == {
        "@demo/lib": ("ISC", 4), "demo": ("MIT", 2)}
    assert not any("unlisted" in d.path for d in corpus.documents)
    assert corpus.manifest.files == 6

    write_corpus(corpus, tmp_path / "run")
    manifest = json.loads((tmp_path / "run/manifest.json").read_text())
    assert [p["licence"] for p in manifest["packages"]] == ["ISC", "MIT"]
    assert read_corpus(tmp_path / "run").manifest.packages == corpus.manifest.packages


def test_a_directory_below_sources_json_reads_only_its_packages(tmp_path: Path) -> None:
    dest = tmp_path / "registry"
    rc.fetch_corpus(dest, PACKAGES, FakeRegistry({"demo": "MIT", "@demo/lib": "ISC"}))
    corpus = build_corpus([dest / "src" / "npm"], tmp_path / "absent-bench.gz")
    assert [p["name"] for p in corpus.manifest.packages] == ["@demo/lib"]
    assert all("/src/npm/" in d.path for d in corpus.documents)


def test_a_plain_directory_has_no_packages(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code/a.py").write_text(PYTHON_SOURCE)
    (tmp_path / "code/b.py").write_text(PYTHON_SOURCE.replace("mean", "median"))
    corpus = build_corpus([tmp_path / "code"], tmp_path / "absent-bench.gz")
    assert corpus.manifest.files == 2 and corpus.manifest.packages == []

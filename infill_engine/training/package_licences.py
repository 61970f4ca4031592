"""The package list of the registry corpus and the licence checks: which packages, and may they be trained on.

`corpus_packages.tsv` names every package with an exact version and its SPDX licence; only permissive licences are
accepted. A downloaded archive's own metadata (a wheel's METADATA and licence files, an npm package.json) must declare
the listed licence, or the package is refused.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import Any

DEFAULT_LIST = Path(__file__).with_name("corpus_packages.tsv")
ECOSYSTEMS = ("pypi", "npm")
LIST_COLUMNS = ("ecosystem", "name", "version", "licence")

# Licences whose terms allow training on and redistributing derived models with attribution only. Anything else,
# copyleft (GPL, LGPL, AGPL, MPL, EPL, EUPL, CDDL), source-available or unknown, is refused.
PERMISSIVE_LICENCES = frozenset({
    "MIT", "MIT-0", "MIT-CMU", "BSD-2-Clause", "BSD-3-Clause", "0BSD", "Apache-2.0", "ISC", "PSF-2.0", "Python-2.0",
    "Zlib", "Unlicense", "CC0-1.0", "BSL-1.0", "HPND", "BlueOak-1.0.0",
})
SPDX_OPERATORS = frozenset({"AND", "OR"})

NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
PYPI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
NPM_VERSION = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
PYPI_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


@dataclass(frozen=True)
class Package:
    """One line of the package list."""

    ecosystem: str  # "pypi" or "npm"
    name: str  # as the registry spells it, e.g. "Django" or "@babel/core"
    version: str  # exact
    licence: str  # SPDX expression the package declares

    @property
    def key(self) -> str:
        """The package's directory name under src/ECOSYSTEM/: NAME-VERSION, with a scope's slash as '+'."""
        name = canonical_pypi_name(self.name) if self.ecosystem == "pypi" else self.name.replace("/", "+")
        return f"{name}-{self.version}"

    @property
    def spec(self) -> str:
        """The requirement the client is given: NAME==VERSION or NAME@VERSION."""
        return f"{self.name}=={self.version}" if self.ecosystem == "pypi" else f"{self.name}@{self.version}"


# --- the list ---------------------------------------------------------------------------------------------------


def licence_ids(expression: str) -> list[str]:
    """The licence identifiers of an SPDX expression (operators and parentheses left out)."""
    tokens = expression.replace("(", " ").replace(")", " ").split()
    if "WITH" in (t.upper() for t in tokens):
        raise ValueError(f"licence exceptions (WITH) are not supported: {expression!r}")
    return [t for t in tokens if t.upper() not in SPDX_OPERATORS]


def normalise_expression(expression: str) -> str:
    """An SPDX expression in one spelling: ids as the permissive list spells them, operators upper case."""
    spelled = {licence.lower(): licence for licence in PERMISSIVE_LICENCES}
    tokens = expression.replace("(", " ( ").replace(")", " ) ").split()
    out = [t.upper() if t.upper() in SPDX_OPERATORS else spelled.get(t.lower(), t) for t in tokens]
    return " ".join(out).replace("( ", "(").replace(" )", ")")


def check_permissive(expression: str) -> None:
    """Raise ValueError unless every licence of `expression` is on PERMISSIVE_LICENCES."""
    ids = licence_ids(expression)
    if not ids:
        raise ValueError("the licence is empty")
    spelled = {licence.lower() for licence in PERMISSIVE_LICENCES}
    refused = [i for i in ids if i.lower() not in spelled]
    if refused:
        raise ValueError(f"licence {', '.join(refused)} is not a permissive licence this corpus accepts "
                         f"({', '.join(sorted(PERMISSIVE_LICENCES))})")


def parse_package_list(text: str, source: str = "corpus_packages.tsv") -> list[Package]:
    """The packages of a list: a header line, then ecosystem, name, version, licence separated by tabs.

    Blank lines and lines starting with '#' are skipped. A bad line raises ValueError naming `source` and its number.
    """
    packages: list[Package] = []
    seen: dict[tuple[str, str], int] = {}
    header_seen = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{number}"
        columns = line.rstrip("\r").split("\t")
        if not header_seen:
            if tuple(c.strip().lower() for c in columns) != LIST_COLUMNS:
                raise ValueError(f"{where}: the first line must be the header {chr(9).join(LIST_COLUMNS)!r} "
                                 f"(tab-separated), found {line!r}")
            header_seen = True
            continue
        if len(columns) != len(LIST_COLUMNS):
            raise ValueError(f"{where}: expected {len(LIST_COLUMNS)} tab-separated columns "
                             f"({', '.join(LIST_COLUMNS)}), found {len(columns)}: {line!r}")
        ecosystem, name, version, licence = (c.strip() for c in columns)
        if ecosystem not in ECOSYSTEMS:
            raise ValueError(f"{where}: ecosystem {ecosystem!r} is not one of {', '.join(ECOSYSTEMS)}")
        name_pattern, version_pattern = (PYPI_NAME, PYPI_VERSION) if ecosystem == "pypi" else (NPM_NAME, NPM_VERSION)
        if not name_pattern.match(name):
            raise ValueError(f"{where}: {name!r} is not a valid {ecosystem} package name")
        if not version_pattern.match(version):
            raise ValueError(f"{where}: version {version!r} of {name} is not one exact {ecosystem} version")
        try:
            check_permissive(licence)
        except ValueError as error:
            raise ValueError(f"{where}: {name} {version}: {error}") from None
        package = Package(ecosystem, name, version, normalise_expression(licence))
        identity = (ecosystem, canonical_pypi_name(name) if ecosystem == "pypi" else name)
        if identity in seen:
            raise ValueError(f"{where}: {ecosystem} package {name} is already listed on line {seen[identity]}")
        seen[identity] = number
        packages.append(package)
    if not header_seen:
        raise ValueError(f"{source}: the list is empty")
    return packages


def read_package_list(path: str | os.PathLike[str] = DEFAULT_LIST) -> list[Package]:
    """The packages of the list file at `path`."""
    path = Path(path)
    return parse_package_list(path.read_text(encoding="utf-8"), str(path))


def canonical_pypi_name(name: str) -> str:
    """A PyPI name as PEP 503 compares it: lower case, runs of '-', '_', '.' as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- licences in the downloaded metadata --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclaredLicence:
    """What a downloaded package says about its licence."""

    expression: str | None = None  # SPDX: a wheel's License-Expression, package.json's "license"
    text: str | None = None  # a wheel's free-form License field
    classifiers: tuple[str, ...] = ()  # a wheel's "License :: ..." classifiers

    def describe(self) -> str:
        """One line for error messages."""
        if self.expression:
            return repr(self.expression)
        parts = []
        if self.text:
            first = self.text.strip().splitlines()[0] if self.text.strip() else ""
            parts.append(f"License: {first[:80]!r}")
        parts += [repr(c) for c in self.classifiers]
        return ", ".join(parts) or "no licence"


# Free-form names and classifiers, and the SPDX ids each may stand for.
LICENCE_NAMES: dict[str, frozenset[str]] = {
    "mit": frozenset({"MIT"}), "mit license": frozenset({"MIT"}), "the mit license": frozenset({"MIT"}),
    "mit no attribution license (mit-0)": frozenset({"MIT-0"}),
    "bsd": frozenset({"BSD-2-Clause", "BSD-3-Clause"}), "bsd license": frozenset({"BSD-2-Clause", "BSD-3-Clause"}),
    "new bsd": frozenset({"BSD-3-Clause"}), "new bsd license": frozenset({"BSD-3-Clause"}),
    "modified bsd": frozenset({"BSD-3-Clause"}), "3-clause bsd": frozenset({"BSD-3-Clause"}),
    "3-clause bsd license": frozenset({"BSD-3-Clause"}), "bsd 3-clause": frozenset({"BSD-3-Clause"}),
    "simplified bsd": frozenset({"BSD-2-Clause"}), "2-clause bsd": frozenset({"BSD-2-Clause"}),
    "apache": frozenset({"Apache-2.0"}), "apache 2": frozenset({"Apache-2.0"}), "apache 2.0": frozenset({"Apache-2.0"}),
    "apache license 2.0": frozenset({"Apache-2.0"}), "apache license, version 2.0": frozenset({"Apache-2.0"}),
    "apache software license": frozenset({"Apache-2.0"}), "apache software license 2.0": frozenset({"Apache-2.0"}),
    "apache license version 2.0": frozenset({"Apache-2.0"}), "apache 2.0 license": frozenset({"Apache-2.0"}),
    "isc": frozenset({"ISC"}), "isc license": frozenset({"ISC"}), "isc license (iscl)": frozenset({"ISC"}),
    "psf": frozenset({"PSF-2.0", "Python-2.0"}), "psf license": frozenset({"PSF-2.0", "Python-2.0"}),
    "python software foundation license": frozenset({"PSF-2.0", "Python-2.0"}),
    "zlib/libpng license": frozenset({"Zlib"}), "the unlicense (unlicense)": frozenset({"Unlicense"}),
    "historical permission notice and disclaimer (hpnd)": frozenset({"HPND", "MIT-CMU"}),
    "cmu license (mit-cmu)": frozenset({"MIT-CMU"}),
    "boost software license 1.0 (bsl-1.0)": frozenset({"BSL-1.0"}),
}
# Words that mark a licence this corpus refuses, wherever they appear in a short free-form declaration or in the
# opening of a pasted licence text.
REFUSED_MARKERS = re.compile(
    r"\b(a?l?gpl|general public licen[cs]e|mozilla public|mpl|eclipse public|epl|eupl|cddl|sspl|server side public"
    r"|commons clause|business source|non-commercial)\b", re.IGNORECASE)
# A pasted licence text: the package's own licence comes first; what follows it in binary wheels (numpy, scipy,
# pandas) are the notices of compiled libraries bundled beside the Python code, which is all that is extracted.
# So the text is judged by its opening: the earliest of these phrases names the licence, and refused licences are
# looked for in the same opening.
LICENCE_TEXT_OPENING_CHARS = 1500
LICENCE_TEXT_FINGERPRINTS = (
    ("apache license", frozenset({"Apache-2.0"})),
    ("permission is hereby granted, free of charge", frozenset({"MIT"})),
    ("redistribution and use in source and binary forms", frozenset({"BSD-2-Clause", "BSD-3-Clause"})),
    ("permission to use, copy, modify, and/or distribute", frozenset({"ISC", "0BSD"})),
    ("license agreement for matplotlib", frozenset({"PSF-2.0"})),  # the PSF licence with the names changed
)


def declared_licence_ids(declared: DeclaredLicence) -> tuple[frozenset[str], str | None]:
    """The SPDX ids a free-form declaration may stand for, and a reason when it cannot be accepted."""
    candidates: set[str] = set()
    problems = []
    if declared.text and declared.text.strip() and declared.text.strip().upper() != "UNKNOWN":
        text = declared.text.strip()
        lowered = " ".join(text.lower().split())
        if "\n" not in text and len(text) <= 100:
            try:
                check_permissive(text)
                candidates.update(licence_ids(normalise_expression(text)))
            except ValueError:
                named = LICENCE_NAMES.get(lowered.rstrip("."))
                if named:
                    candidates |= named
                else:
                    problems.append(f"License field {text!r} is not a licence name this check knows")
        else:
            lowered = lowered[:LICENCE_TEXT_OPENING_CHARS]
            found = sorted((lowered.find(marker), ids) for marker, ids in LICENCE_TEXT_FINGERPRINTS
                           if marker in lowered)
            if found:
                candidates |= found[0][1]
            else:
                problems.append("License field holds a text this check does not recognise")
        refused = REFUSED_MARKERS.search(lowered)
        if refused:
            problems.append(f"License field mentions a refused licence ({refused.group(0)!r})")
    for classifier in declared.classifiers:
        leaf = classifier.split("::")[-1].strip().lower()
        if leaf in ("osi approved", "other/proprietary license", "public domain"):
            if leaf != "osi approved":
                problems.append(f"classifier {classifier!r} names no licence this corpus accepts")
            continue
        named = LICENCE_NAMES.get(leaf)
        if named:
            candidates |= named
        else:
            problems.append(f"classifier {classifier!r} is not a permissive licence")
    if not candidates and not problems:
        problems.append("the package declares no licence")
    return frozenset(candidates), ("; ".join(problems) or None)


def licence_mismatch(listed: str, declared: DeclaredLicence) -> str | None:
    """Why the listed licence does not agree with what the package declares; None when it does.

    An SPDX expression in the package must equal the listed one. Otherwise every licence in the list must be one the
    free-form License field or the classifiers may stand for ("BSD License" fits BSD-2-Clause and BSD-3-Clause), and
    nothing declared may be a refused licence.
    """
    if declared.expression:
        try:
            check_permissive(declared.expression)
        except ValueError as error:
            return f"the package declares {declared.expression!r}: {error}"
        if normalise_expression(declared.expression) != normalise_expression(listed):
            return f"the package declares {declared.expression!r}, the list says {listed!r}"
        return None
    candidates, problem = declared_licence_ids(declared)
    if problem:
        return f"{problem} (the list says {listed!r})"
    missing = [i for i in licence_ids(listed) if i not in candidates]
    if missing:
        return (f"the package declares {declared.describe()}, which does not fit {', '.join(missing)} "
                f"(the list says {listed!r})")
    return None


def wheel_licence(archive: Path) -> DeclaredLicence:
    """The licence fields of a wheel's METADATA."""
    with zipfile.ZipFile(archive) as wheel:
        names = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise ValueError(f"{archive.name}: expected one .dist-info/METADATA, found {len(names)}")
        metadata = HeaderParser().parsestr(wheel.read(names[0]).decode("utf-8", errors="replace"))
    classifiers = tuple(c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::"))
    return DeclaredLicence(expression=metadata.get("License-Expression"), text=metadata.get("License"),
                           classifiers=classifiers)


def npm_licence(archive: Path) -> DeclaredLicence:
    """The "license" of an npm tarball's package.json (or the legacy "licenses" list)."""
    with tarfile.open(archive, "r:gz") as tarball:
        manifest = _npm_package_json(tarball, archive)
    licence = manifest.get("license")
    if isinstance(licence, dict):  # the deprecated {"type": ..., "url": ...}
        licence = licence.get("type")
    if licence is None and isinstance(manifest.get("licenses"), list):
        types = [entry.get("type") for entry in manifest["licenses"] if isinstance(entry, dict)]
        licence = " OR ".join(t for t in types if t) or None
    if licence is not None and not isinstance(licence, str):
        raise ValueError(f"{archive.name}: package.json has a \"license\" that is not a string: {licence!r}")
    return DeclaredLicence(expression=licence)


def _npm_package_json(tarball: tarfile.TarFile, archive: Path) -> dict[str, Any]:
    """The package.json at the top of an npm tarball (its first directory, normally package/)."""
    for member in tarball.getmembers():
        parts = PurePosixPath(member.name).parts
        if len(parts) == 2 and parts[1] == "package.json" and member.isfile():
            handle = tarball.extractfile(member)
            if handle is not None:
                return json.loads(handle.read().decode("utf-8"))
    raise ValueError(f"{archive.name}: no package.json at the top of the tarball")

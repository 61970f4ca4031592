"""The GPU run at tiny scale on CPU: the bundle is built and sized, the run trains, stops, exports and packs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from infill_engine.training.corpus import Corpus, CorpusManifest, Document, write_corpus
from infill_engine.training.gpu_bundle import MIB, BundleTooLarge, build_bundle, main as bundle_main
from infill_engine.training.gpu_run import main as run_main, seconds_per_step, unpack_result, use_wheels

REPO = Path(__file__).resolve().parents[1]


def _tiny_run_dir(path: Path) -> Path:
    """A run directory as `diffill train` leaves it, holding a few of this repository's modules as its corpus."""
    files = sorted((REPO / "infill_engine").glob("*.py"))[:12]
    documents = []
    for index, file in enumerate(files):
        text = file.read_text(encoding="utf-8")
        digest = hashlib.sha256(text.encode()).hexdigest()
        documents.append(Document(str(file), text, digest, "eval" if index == 0 else "train"))
    manifest = CorpusManifest(sources=[str(REPO / "infill_engine")], files=len(documents),
                              bytes=sum(len(d.text) for d in documents), eval_files=1)
    write_corpus(Corpus(documents, manifest), path)
    return path


def _tiny_repo(path: Path) -> Path:
    """A git repository with one tracked file, standing for the working tree that travels."""
    path.mkdir()
    (path / "code.py").write_text("x = 1\n" * 1000)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "code.py"], cwd=path, check=True)
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    report = build_bundle(_tiny_run_dir(root / "run"), root / "bundle", _tiny_repo(root / "repo"), wheels=[])
    assert report.documents == report.documents_in_run == 12
    return root / "bundle"


def test_bundle_holds_the_compressed_corpus_and_reports_its_size(bundle: Path) -> None:
    written = json.loads((bundle / "bundle.json").read_text())
    assert written["tree_bytes"] == 6000
    assert written["corpus_bytes"] == (bundle / "corpus.jsonl.xz").stat().st_size
    assert written["corpus_bytes"] < written["corpus_source_bytes"]  # compressed
    assert written["total_bytes"] == written["tree_bytes"] + written["bundle_bytes"] <= 60 * MIB


def test_bundle_over_the_limit_is_refused(tmp_path: Path) -> None:
    repo = _tiny_repo(tmp_path / "repo")
    (repo / "big.bin").write_bytes(b"\0" * (2 * MIB))  # untracked, not ignored: it travels too
    with pytest.raises(BundleTooLarge, match="limit"):
        build_bundle(_tiny_run_dir(tmp_path / "run"), tmp_path / "bundle", repo, limit_mib=2.5, wheels=[])


def test_a_corpus_larger_than_the_room_left_is_cut_to_a_share_that_fits(tmp_path: Path) -> None:
    run_dir = _tiny_run_dir(tmp_path / "run")
    full = build_bundle(run_dir, tmp_path / "full", _tiny_repo(tmp_path / "repo"), wheels=[])
    limit = (full.total_bytes - full.corpus_bytes // 2 + MIB) / MIB  # half the corpus's room (the margin is 1 MiB)
    cut = build_bundle(run_dir, tmp_path / "cut", tmp_path / "repo", limit_mib=limit, wheels=[])
    assert 1 < cut.documents < full.documents
    assert cut.total_bytes <= cut.limit_bytes


def test_the_command_refuses_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bundle_main(["--run-dir", str(_tiny_run_dir(tmp_path / "run")), "--out", str(tmp_path / "b"),
                        "--repo", str(_tiny_repo(tmp_path / "repo")), "--no-wheels", "--limit-mib", "0.5"])
    assert code == 2
    assert "limit" in capsys.readouterr().err


def test_wheels_are_importable_without_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "carried_probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("carried_probe/__init__.py", "ANSWER = 42\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    assert use_wheels(wheels, tmp_path / "site") == ["carried_probe-1.0-py3-none-any.whl"]
    import carried_probe

    assert carried_probe.ANSWER == 42
    sys.modules.pop("carried_probe")


def test_run_trains_stops_exports_and_packs_a_servable_model(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = run_main(["run", "--bundle", str(bundle), "--out", str(out), "--minutes", "0.4", "--reserve-seconds",
                     "4", "--preset", "tiny", "--dense", "--probe-steps", "3", "--workers", "1", "--threads", "1",
                     "--work", str(tmp_path / "work")])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["probe"]["steps"] == 3
    assert summary["steps"] > 3  # the second part resumed and trained on
    assert summary["stopped_by"] in ("time_limit", "steps")
    assert summary["trained_s"] < 0.4 * 60  # stopped before the limit, export included
    assert (tmp_path / "work" / "run" / "checkpoints" / f"step-{summary['steps']:08d}").is_dir()
    assert seconds_per_step(out / "train_log.csv") > 0
    assert sorted(p.name for p in out.iterdir()) == ["result.tar.00", "run.log", "summary.json", "train_log.csv"]

    result = unpack_result(out, tmp_path / "back")
    assert json.loads((result / "model" / "config.json").read_text())["causal_context"] is True  # dense
    from infill_engine.interface import ModelSpec, open_engine
    from infill_engine.request import InfillRequest

    engine = open_engine(ModelSpec(path=str(result / "model"), device="cpu", threads=1))
    filled = engine.fill(InfillRequest("def add(a, b):\n    return ", "\n"))
    assert filled.candidates or filled.rejected  # the model denoised a span; the gate judged it


def test_a_result_cut_into_parts_is_joined_back(tmp_path: Path) -> None:
    from infill_engine.training.gpu_run import pack_result

    source = tmp_path / "result"
    (source / "model").mkdir(parents=True)
    payload = bytes(range(256)) * 40
    (source / "model" / "weights.bin").write_bytes(payload)
    out = tmp_path / "out"
    out.mkdir()
    parts = pack_result(source, out, part_bytes=4096)
    assert len(parts) > 2
    assert (unpack_result(out, tmp_path / "back") / "model" / "weights.bin").read_bytes() == payload

"""Hub ids without a network: resolution from a cache built here in huggingface_hub's layout, the offline message,
revision pinning in the spec's key, the catalogue's `cached` flag, `diffill models` and doctor's fit verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffill.cli import main
from infill_engine import catalogue
from infill_engine.fit import fit_verdict
from infill_engine.hub import HubError, HubId, parse_hub_id, repo_id_of, resolve_model_path
from infill_engine.interface import ModelSpec

COMMIT_MAIN = "a" * 40
COMMIT_V1 = "b" * 40


def cache_model(cache: Path, repo_id: str, commit: str, ref: str | None = "main") -> Path:
    """A snapshot in the hub cache's real layout: models--owner--name/{refs/<ref>, snapshots/<commit>/...}."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "dream", "commit": commit}))
    (folder / "blobs").mkdir(exist_ok=True)
    if ref is not None:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty HF_HOME, offline; its hub cache directory is returned."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_hub_ids_and_local_paths_are_told_apart(tmp_path, monkeypatch):
    assert parse_hub_id("Dream-org/DreamOn-v0-7B") == HubId("Dream-org/DreamOn-v0-7B")
    assert parse_hub_id("apple/DiffuCoder-7B-Base@v1.0") == HubId("apple/DiffuCoder-7B-Base", "v1.0")
    assert parse_hub_id("./models/x") is None and parse_hub_id("/abs/x") is None and parse_hub_id("plain") is None
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id("owner/name") is None  # a directory that exists always wins
    assert resolve_model_path("owner/name") == "owner/name"


def test_a_hub_id_resolves_to_its_cached_snapshot_without_the_network(hf_home):
    snapshot = cache_model(hf_home, "owner/tiny-coder", COMMIT_MAIN)
    assert resolve_model_path("owner/tiny-coder") == str(snapshot)
    assert repo_id_of(snapshot) == "owner/tiny-coder"


def test_hf_hub_cache_overrides_hf_home(hf_home, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    snapshot = cache_model(tmp_path / "elsewhere", "owner/tiny-coder", COMMIT_MAIN)
    assert resolve_model_path("owner/tiny-coder") == str(snapshot)


def test_offline_and_not_cached_says_which_model_and_how_to_fetch_it(hf_home):
    with pytest.raises(HubError) as error:
        resolve_model_path("owner/missing-coder@v2")
    message = str(error.value)
    assert "owner/missing-coder@v2" in message and "HF_HUB_OFFLINE" in message
    assert "huggingface-cli download owner/missing-coder --revision v2" in message


def test_the_loader_reports_the_offline_message_as_a_load_error(hf_home):
    from infill_engine.loading import ModelLoadError, resolve_checkpoint

    with pytest.raises(ModelLoadError, match="huggingface-cli download owner/missing-coder"):
        resolve_checkpoint("owner/missing-coder")


def test_a_pinned_revision_is_its_own_snapshot_and_its_own_engine(hf_home):
    main_snapshot = cache_model(hf_home, "owner/tiny-coder", COMMIT_MAIN)
    v1_snapshot = cache_model(hf_home, "owner/tiny-coder", COMMIT_V1, ref="v1")
    assert resolve_model_path("owner/tiny-coder@v1") == str(v1_snapshot)
    assert resolve_model_path(f"owner/tiny-coder@{COMMIT_MAIN}") == str(main_snapshot)  # a commit, no ref needed
    assert resolve_model_path("owner/tiny-coder") == str(main_snapshot)
    keys = {ModelSpec(path=p).key for p in ("owner/tiny-coder", "owner/tiny-coder@v1", f"owner/tiny-coder@{COMMIT_V1}")}
    assert len(keys) == 3  # each revision names its own shared engine
    assert ModelSpec(path="owner/tiny-coder@v1").resolved_path == "owner/tiny-coder@v1"


def test_the_catalogue_says_what_is_cached(hf_home):
    dreamon = catalogue.find("Dream-org/DreamOn-v0-7B@main")
    assert dreamon is not None and not dreamon.cached()
    cache_model(hf_home, dreamon.hub_id, COMMIT_MAIN)
    assert dreamon.cached()
    assert catalogue.for_checkpoint(hf_home / "models--Dream-org--DreamOn-v0-7B" / "snapshots" / COMMIT_MAIN) is dreamon


def test_every_catalogue_fact_is_sourced_or_unconfirmed():
    required = {"Open-dCoder", "DiffuCoder", "Dream-Coder", "DreamOn", "LLaDA", "CoDA", "DiffusionGemma"}
    assert {name for name in required if any(name in m.name for m in catalogue.MODELS)} == required
    for model in catalogue.MODELS:
        assert set(model.sources) <= {"hub_id", "licence", "parameters"}
        assert all(score.source.startswith("https://") for score in model.scores)
        assert model.family in ("dream", "llada", "diffusion_gemma")


def test_diffill_models_lists_every_model_with_its_cached_flag(hf_home, capsys):
    cache_model(hf_home, "fredzzp/open-dcoder-0.5B", COMMIT_MAIN)
    assert main(["models", "--json"]) == 0
    rows = {row["hub_id"]: row for row in json.loads(capsys.readouterr().out)}
    assert len(rows) == len(catalogue.MODELS)
    assert rows["fredzzp/open-dcoder-0.5B"]["cached"] is True
    assert rows["Dream-org/DreamOn-v0-7B"]["cached"] is False
    assert rows["Dream-org/DreamOn-v0-7B"]["licence"] == "unconfirmed"
    assert rows["GSAI-ML/LLaDA-8B-Base"]["memory_gib"]["bf16"] == pytest.approx(8e9 * 2 / 2**30, abs=0.1)
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["hub", "id", "family"]
    open_dcoder = next(line for line in lines if line.startswith("fredzzp/open-dcoder-0.5B"))
    assert open_dcoder.split()[-1] == "yes" and "32.5 (77.4)" in open_dcoder


def test_fit_verdicts_from_the_memory_at_hand():
    llada = catalogue.find("llada-8b")
    assert fit_verdict(llada, ram=24.0, gpu=139.0)["verdict"] == "fits the GPU at bf16"
    assert "only at int8" in fit_verdict(llada, ram=24.0, gpu=12.0)["verdict"]
    assert fit_verdict(llada, ram=24.0, gpu=None)["verdict"].startswith("fits in RAM")
    too_big = fit_verdict(catalogue.find("diffusiongemma-26b"), ram=24.0, gpu=None)
    assert too_big["ok"] is False and too_big["verdict"].startswith("does not fit")


def test_fit_verdicts_name_the_dtype_the_cpu_would_run_in():
    """On the CPU the verdict follows `--dtype auto`: float32 (4 bytes a parameter) where that is what it picks."""
    open_dcoder, llada = catalogue.find("open-dcoder-0.5b"), catalogue.find("llada-8b")
    no_bf16 = fit_verdict(open_dcoder, ram=24.0, gpu=None, bfloat16_hardware=False)
    assert no_bf16["verdict"].startswith("fits in RAM at float32") and no_bf16["CPU dtype"] == "float32"
    assert no_bf16["CPU GiB"] == pytest.approx(0.5e9 * 4 / 2**30, abs=0.1)
    with_bf16 = fit_verdict(open_dcoder, ram=24.0, gpu=None, bfloat16_hardware=True)
    assert with_bf16["verdict"].startswith("fits in RAM at bf16") and with_bf16["CPU dtype"] == "bfloat16"
    # 8B in float32 (30 GiB) does not fit 24 GiB, so auto takes bfloat16 (15 GiB), which does; with 64 GiB, float32
    assert fit_verdict(llada, ram=24.0, gpu=None, bfloat16_hardware=False)["verdict"].startswith("fits in RAM at bf16")
    assert fit_verdict(llada, ram=64.0, gpu=None, bfloat16_hardware=False)["CPU dtype"] == "float32"
    small_gpu = fit_verdict(llada, ram=64.0, gpu=12.0, bfloat16_hardware=False)
    assert "at float32 (29.8 GiB) it runs on the CPU" in small_gpu["verdict"] and small_gpu["ok"] is True


def test_doctor_judges_an_uncached_hub_model_without_downloading_it(hf_home, capsys):
    status = main(["doctor", "--model", "google/diffusiongemma-26B-A4B-it", "--device", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["cached"] is False and "huggingface-cli download" in report["model"]["note"]
    assert report["fit"]["bf16 GiB"] == pytest.approx(26e9 * 2 / 2**30, abs=0.1)
    assert status == (0 if report["fit"]["ok"] else 1)
    assert not any(hf_home.glob("models--*"))  # nothing was fetched

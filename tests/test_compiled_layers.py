"""The embedded model's layers compiled ahead of time for this CPU (`infill_engine/compiled_layers.py`): the eager
layers' fills, eager wherever the package would not give the same numbers, never a damaged or half-written package,
and a server's compile in the background used once it is done."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from infill_engine.compiled_layers import (
    BackgroundCompile,
    compile_layers,
    load_compiled_layers,
    package_key,
)
from diffill.cli import main
from infill_engine.doctor import diagnose
from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.interface import ModelSpec, load_engine
from tests import tiny_models
from tests.test_evaluation import bench_file  # noqa: F401 - the fixture

# AOTInductor compiles C++: without a compiler the layers only ever run eagerly (the README's assumption).
pytestmark = [pytest.mark.skipif(not any(shutil.which(name) for name in ("c++", "g++", "clang++")),
                                 reason="no C++ compiler on this machine (AOTInductor needs one: apt install g++)"),
              pytest.mark.usefixtures("package_cache")]  # each test's own package cache (tests/conftest.py)

REQUESTS = [
    InfillRequest("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", "python", max_tokens=12, single_line=True),
    InfillRequest("def mean(values):\n    total = sum(values)\n", "\n", "python", max_tokens=16, candidates=2),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffill checkpoint read the embedded model's way (causal context, shifted logits)."""
    return tiny_models.build_diffill(tmp_path_factory.mktemp("compiled") / "diffill", seed=3, layers=3,
                                     causal_context=True, shift_logits=True)


@pytest.fixture(scope="module")
def package(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's layers compiled once for the module (a package file)."""
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"))
    return compile_layers(engine.denoiser.model, tmp_path_factory.mktemp("packages"))


def _engines(model_dir: Path, package: Path, package_cache: Path) -> tuple[InfillEngine, InfillEngine]:
    """The tiny model eager, and loaded again with its package in the cache (both float32: mixed precision has its
    own tests, tests/test_mixed_precision.py)."""
    package_cache.mkdir(parents=True, exist_ok=True)
    (package_cache / package.name).write_bytes(package.read_bytes())
    eager = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"))
    compiled = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="auto"))
    return eager, compiled


def test_compiled_layers_fill_as_the_eager_ones(model_dir, package, package_cache):
    eager, compiled = _engines(model_dir, package, package_cache)
    layers = compiled.denoiser.model.compiled_layers
    assert layers is not None and compiled.denoiser.compiled_layers_state.startswith("loaded")
    assert eager.denoiser.model.compiled_layers is None and eager.denoiser.compiled_layers_state == "off"
    for request in REQUESTS:
        expected, got = eager.fill(request), compiled.fill(request)
        assert [c.text for c in got.candidates] == [c.text for c in expected.candidates]
        assert got.stats.forward_passes == expected.stats.forward_passes
    assert layers.calls > 0 and layers.context_calls > 0  # the steps and the contexts ran compiled
    # a context encoded at once and one encoded after a cached head, and one step's logits (whole canvas and some
    # rows only) against each, agree with the eager layers'
    model, reference = compiled.denoiser.model, eager.denoiser.model
    context = torch.randint(5, model.config.vocab_size, (1, 30))
    canvas = torch.randint(5, model.config.vocab_size, (2, 10))
    positions = torch.arange(30, 40)[None].expand(2, -1)
    results, calls = [], layers.context_calls
    for m in (reference, model):
        whole_context = m.encode_context(context, torch.arange(30)[None])
        extended = m.extend_context(context[:, 12:], torch.arange(12, 30)[None],
                                    m.encode_context(context[:, :12], torch.arange(12)[None]))
        for cache in (whole_context, extended):
            plan = m.plan_denoising(positions, cache)
            whole = m.denoise_planned(canvas, plan)
            rows = m.denoise_planned(canvas, plan, columns=torch.tensor([2, 5]), rows=torch.tensor([2, 3, 5]))
            results.append((cache.keys[-1], cache.hidden, whole, rows))
    assert layers.context_calls == calls + 3  # the model's three encodes above ran compiled
    for expected, got in zip(results[:2], results[2:]):
        for a, b in zip(expected, got):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_changed_weights_and_padded_batches_run_eagerly(model_dir, package, package_cache):
    eager, compiled = _engines(model_dir, package, package_cache)
    model, reference = compiled.denoiser.model, eager.denoiser.model
    layers = model.compiled_layers
    context = torch.randint(5, model.config.vocab_size, (1, 20))
    canvas = torch.randint(5, model.config.vocab_size, (2, 8))
    positions = torch.arange(20, 28)[None].expand(2, -1)
    padding = torch.ones(2, 8, dtype=torch.bool)
    padding[1, 6:] = False  # two canvases of different lengths in one batch: an attention mask

    def logits(m, known=None):
        return m.denoise_planned(canvas, m.plan_denoising(positions, m.encode_context(context, torch.arange(20)[None]),
                                                          known))

    calls = layers.calls
    torch.testing.assert_close(logits(model, padding), logits(reference, padding), atol=1e-5, rtol=1e-5)
    assert layers.calls == calls  # masked: eager
    counted = []
    for m in (model, reference):  # `diffill bench fill` counts a step's FLOPs: the compiled call would hide them
        with FlopCounterMode(display=False) as counter:
            logits(m)
        counted.append(counter.get_total_flops())
    assert counted[0] == counted[1] > 0 and layers.calls == calls
    logits(model)
    assert layers.calls == calls + 1  # unmasked, unwatched: compiled
    calls = layers.calls
    with torch.no_grad():
        for m in (model, reference):  # the same change to both: the package holds the old weights
            m.layers[0].mlp.down_proj.weight.add_(0.05)
    torch.testing.assert_close(logits(model), logits(reference), atol=1e-5, rtol=1e-5)
    assert layers.calls == calls  # changed weights: eager


@pytest.mark.parametrize("replace", ["parameter", "submodule"])
def test_replaced_weights_run_eagerly(model_dir, package, package_cache, replace):
    eager, compiled = _engines(model_dir, package, package_cache)
    model, reference = compiled.denoiser.model, eager.denoiser.model
    layers = model.compiled_layers
    compiled.fill(REQUESTS[0])
    calls = layers.calls
    assert calls > 0
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn_like(model.layers[1].mlp.down_proj.weight) * 0.05)
    for m in (model, reference):  # set, not changed in place: the package holds the old weights
        if replace == "parameter":
            m.layers[1].mlp.down_proj.weight = torch.nn.Parameter(weight.detach().clone())
        else:
            projection = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            projection.weight = torch.nn.Parameter(weight.detach().clone())
            m.layers[1].mlp.down_proj = projection
    expected, got = eager.fill(REQUESTS[0]), compiled.fill(REQUESTS[0])
    assert [c.text for c in got.candidates] == [c.text for c in expected.candidates]
    assert layers.calls == calls  # the replaced weights: eager


def test_a_damaged_package_is_not_used_and_is_compiled_again(model_dir, package_cache, caplog):
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"))
    package_cache.mkdir(parents=True)
    (package_cache / package_key(engine.denoiser.model)).write_bytes(b"not a package")
    assert load_compiled_layers(engine.denoiser.model) is None
    assert "run eagerly" in caplog.text
    again = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="auto"))
    assert again.denoiser.model.compiled_layers is None
    assert again.fill(REQUESTS[0]).candidates  # fills go on, eagerly
    compile_layers(engine.denoiser.model)  # `diffill compile` (and a server's child) compiles it again over it
    assert load_compiled_layers(engine.denoiser.model) is not None


def test_a_checkpoint_whose_sampler_settings_changed_keeps_its_package(model_dir, package_cache, tmp_path):
    """Its config.json's `diffill_sampler` is not the layers': a copy with other sampler settings loads the same
    package (no compile); a copy with another layer setting does not."""
    own = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="off"))
    copies = {}
    for name, change in (("sampler", {"diffill_sampler": {"copy_floor": 0.1, "end_bias": -0.5}}),
                         ("layers", {"rms_norm_eps": 1e-5})):
        copy = shutil.copytree(model_dir, tmp_path / name)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        copies[name] = InfillEngine.load(ModelSpec(path=str(copy), device="cpu", dtype="float32",
                                                   compiled_layers="off"))
    assert copies["sampler"].sampler.copy_floor == 0.1  # the settings are read ...
    assert package_key(copies["sampler"].denoiser.model) == package_key(own.denoiser.model)  # ... not keyed
    assert package_key(copies["layers"].denoiser.model) != package_key(own.denoiser.model)


def test_the_compile_command_and_its_refusals(model_dir, package_cache):
    bf16 = subprocess.run([sys.executable, "-m", "diffill", "compile", "--model", str(model_dir), "--dtype",
                           "bfloat16"], capture_output=True, text=True, timeout=300)
    assert bf16.returncode == 1
    assert "nothing to compile" in bf16.stderr and "float32" in bf16.stderr
    bad = subprocess.run([sys.executable, "-m", "diffill", "fill", "-", "--compiled-layers", "always"],
                         capture_output=True, text=True, input="x = ", timeout=300)
    assert bad.returncode == 2 and "auto" in bad.stderr and "off" in bad.stderr
    with pytest.raises(ValueError, match="allowed: auto, off"):
        ModelSpec(compiled_layers="always")


def _default_in_a_fresh_process(value: str | None) -> subprocess.CompletedProcess[str]:
    """The default of the option, a spec and the server setting in a process with $DIFFILL_COMPILED_LAYERS `value`."""
    import os

    environment = {k: v for k, v in os.environ.items() if k != "DIFFILL_COMPILED_LAYERS"}
    if value is not None:
        environment["DIFFILL_COMPILED_LAYERS"] = value
    code = ("from infill_engine.interface import DEFAULT_COMPILED_LAYERS, ModelSpec; "
            "from lsp_server.settings import parse_settings; "
            "print(DEFAULT_COMPILED_LAYERS, ModelSpec().compiled_layers, "
            "parse_settings({})[0].model.spec().compiled_layers)")
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


def test_the_layers_are_compiled_by_default_unless_the_machine_says_off():
    assert _default_in_a_fresh_process(None).stdout.split() == ["auto"] * 3  # options, specs and server settings
    assert _default_in_a_fresh_process("off").stdout.split() == ["off"] * 3
    wrong = _default_in_a_fresh_process("sometimes")
    assert wrong.stdout.split() == ["off"] * 3
    assert "DIFFILL_COMPILED_LAYERS='sometimes' is not one of auto, off" in wrong.stderr


def test_with_the_layers_off_a_server_neither_compiles_nor_loads_them(model_dir, package, package_cache):
    package_cache.mkdir(parents=True, exist_ok=True)
    (package_cache / package.name).write_bytes(package.read_bytes())
    engine = load_engine(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"), serving=True)
    assert engine.denoiser.background_compile is None and engine.denoiser.model.compiled_layers is None
    assert engine.denoiser.compiled_layers_state == "off"
    (package_cache / package.name).unlink()
    again = load_engine(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"), serving=True)
    assert again.denoiser.background_compile is None and not any(package_cache.iterdir())


def test_doctor_says_whether_the_compiled_layers_are_loaded(model_dir, package, package_cache):
    package_cache.mkdir(parents=True, exist_ok=True)
    (package_cache / package.name).write_bytes(package.read_bytes())
    off = diagnose(str(model_dir), None, "cpu", "float32", False, compiled_layers="off")["model"]
    assert off["compiled layers"] == "off"
    asked = diagnose(str(model_dir), None, "cpu", "float32", False, compiled_layers="auto")["model"]
    assert asked["compiled layers"] == f"loaded ({package_cache / package.name})"
    (package_cache / package.name).unlink()
    missing = diagnose(str(model_dir), None, "cpu", "float32", False, compiled_layers="auto")["model"]
    assert missing["compiled layers"].startswith("not compiled for this model")


def test_a_server_compiles_in_the_background_and_then_uses_the_package(model_dir, package_cache):
    first = load_engine(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="auto"), serving=True)
    denoiser = first.denoiser
    job = denoiser.background_compile
    assert job is not None and denoiser.compiled_layers_state.startswith("compiling in process")
    spec = ModelSpec(path=str(model_dir), device="cpu", compiled_layers="auto")
    second = load_engine(spec, serving=True)  # another server meanwhile
    assert second.denoiser.background_compile is None
    assert second.denoiser.compiled_layers_state.startswith("being compiled by process")
    first.fill(REQUESTS[0])  # fills go on, eagerly, while it compiles (tens of seconds)
    assert first.denoiser.model.compiled_layers is None and job.process.poll() is None
    job.process.wait(timeout=600)
    assert first.denoiser.model.compiled_layers is None  # not swapped in behind a fill's back
    first.fill(REQUESTS[0])  # the next fill takes it
    assert denoiser.background_compile is None and denoiser.compiled_layers_state == "loaded"
    assert denoiser.model.compiled_layers is not None and denoiser.model.compiled_layers.calls > 0
    assert sorted(p.name for p in package_cache.iterdir()) == [package_key(denoiser.model)]  # no lock, log or staging
    third = load_engine(spec, serving=True)  # a later start: cached
    assert third.denoiser.background_compile is None and third.denoiser.model.compiled_layers is not None


def test_a_failed_background_compile_is_not_tried_again(model_dir, package_cache):
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"))
    failing = [sys.executable, "-c", "import sys; print('no compiler here'); sys.exit(3)"]
    job = BackgroundCompile(engine.denoiser.model, failing)
    assert job.start()
    job.process.wait(timeout=60)
    assert job.poll() is None and "failed (exit status 3" in job.state
    assert "no compiler here" in job.failed_marker.read_text()
    assert not job.path.exists() and not job.path.with_suffix(".lock").exists()
    again = BackgroundCompile(engine.denoiser.model, failing)
    assert not again.start() and again.state.startswith("failed before")


def test_a_compiled_package_that_does_not_load_is_not_compiled_again_at_each_start(model_dir, package_cache):
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", compiled_layers="off"))
    writes_junk = [sys.executable, "-c", "import sys, pathlib; a = sys.argv; "
                   "pathlib.Path(a[a.index('--cache-dir') + 1], a[a.index('--expect-key') + 1]).write_bytes(b'junk')"]
    job = BackgroundCompile(engine.denoiser.model, writes_junk)
    assert job.start()
    job.process.wait(timeout=60)
    assert job.poll() is None and job.state.startswith("compiled, but the package did not load")
    assert "does not load here" in job.failed_marker.read_text()
    restarted = load_engine(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="auto"),
                            serving=True)
    assert restarted.denoiser.background_compile is None and restarted.denoiser.model.compiled_layers is None
    assert restarted.denoiser.compiled_layers_state.startswith("failed before")
    assert restarted.fill(REQUESTS[0]).candidates  # it fills, eagerly


def test_compiled_layers_that_fail_give_way_to_the_eager_ones(model_dir, package, package_cache, caplog):
    eager, compiled = _engines(model_dir, package, package_cache)

    def broken(*inputs):
        raise RuntimeError("the library could not run")

    compiled.denoiser.model.compiled_layers.runner = broken
    for request in REQUESTS:
        expected, got = eager.fill(request), compiled.fill(request)
        assert [c.text for c in got.candidates] == [c.text for c in expected.candidates]
    assert compiled.denoiser.model.compiled_layers is None
    assert "run eagerly from now on" in caplog.text


def test_packages_no_server_has_loaded_for_a_month_are_removed(model_dir, package, package_cache):
    import os

    package_cache.mkdir(parents=True, exist_ok=True)
    current = package_cache / package.name
    current.write_bytes(package.read_bytes())
    month_ago = time.time() - 31 * 86400
    old = package_cache / "layers-0123456789abcdef01234567.pt2"  # another model's, or an older PyTorch's or format's
    for path in (old, old.with_suffix(".failed"), old.with_suffix(".log")):
        path.write_text("old")
        os.utime(path, (month_ago, month_ago))
    recent = package_cache / "layers-fedcba9876543210fedcba98.pt2"  # loaded by some server this week: kept
    recent.write_text("recent")
    os.utime(recent, (time.time() - 7 * 86400,) * 2)
    os.utime(current, (month_ago, month_ago))
    died = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    staging = package_cache / f".{died.stdout.strip()}.step.{package.name}"  # a compile that died mid-way left it
    staging.write_text("half")
    os.utime(staging, (time.time() - 2 * 3600,) * 2)
    recent_staging = package_cache / f".{died.stdout.strip()}.context.{package.name}"  # minutes old: kept (the
    recent_staging.write_text("half")  # cache may be shared with a machine where that process runs)
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="auto"))
    assert engine.denoiser.model.compiled_layers is not None
    assert sorted(p.name for p in package_cache.iterdir()) == sorted([current.name, recent.name, recent_staging.name])
    assert current.stat().st_mtime > time.time() - 60  # loading it counts as its use


def test_a_benchmark_compiles_the_layers_first_where_none_are_cached(model_dir, package_cache, bench_file,  # noqa: F811
                                                                       capsys):
    args = ["bench", "fill", "--data", str(bench_file), "--model", str(model_dir), "--sample", "1", "--spans", "line",
            "--compiled-layers", "auto", "--dtype", "float32", "--threads", "1", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "compiling the model's layers for this CPU before measuring" in captured.err
    assert json.loads(captured.out)["compiled_layers"] == "loaded"  # what it measured: the compiled layers
    assert main(args) == 0  # the next bench finds them cached
    captured = capsys.readouterr()
    assert "compiling" not in captured.err and json.loads(captured.out)["compiled_layers"].startswith("loaded (")


def test_a_benchmark_whose_compile_takes_too_long_measures_eagerly(model_dir, package_cache, bench_file,  # noqa: F811
                                                                   capsys, monkeypatch):
    from infill_engine.adapters import diffill as diffill_adapter

    monkeypatch.setattr(diffill_adapter, "COMPILE_WAIT_S", 0.01)  # the child is stopped at once
    assert main(["bench", "fill", "--data", str(bench_file), "--model", str(model_dir), "--sample", "1", "--spans",
                 "line", "--compiled-layers", "auto", "--dtype", "float32", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compiled_layers"].startswith("failed") and report["rows"][0]["ms_median"] > 0
    assert not any(path.suffix == ".lock" for path in package_cache.iterdir())  # nothing left held

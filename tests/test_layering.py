"""The layers' import rules (DESIGN.md, "Layers and the one interface between them"): an arrow only points down.

- The engine knows nothing of editors: no module of `infill_engine/` imports `lsp_server`, pygls, lsprotocol or the
  command table above it (`diffill`). Checked statically, every import statement of every module, those inside
  functions included, so that an import on a rarely taken path is caught too.
- Serving never imports training: loading and using any model, a delta model included, leaves
  `infill_engine.training` unimported. Checked in a fresh interpreter, so that what other tests imported cannot hide
  it; and statically, for every module outside `training/`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import tiny_models

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "infill_engine"
ABOVE_THE_ENGINE = ("lsp_server", "pygls", "lsprotocol", "diffill")  # top-level packages the engine must not import
TRAINING = "infill_engine.training"


# ---------------------------------------------------------------------------------------------------- statically


def _module_name(path: Path) -> str:
    """The dotted name of a module file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module an import statement anywhere in `source` names (functions included), relative ones made absolute.

    `from a import b` counts as importing `a` and `a.b`, since `b` may be a module.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            imported = ".".join(base + ([node.module] if node.module else []))
            names.add(imported)
            names.update(f"{imported}.{alias.name}" for alias in node.names)
    return names


def _engine_imports() -> dict[str, set[str]]:
    """Each module file of infill_engine/ (path from the repository root) -> the modules it imports."""
    return {
        path.relative_to(ROOT).as_posix(): _imported_modules(
            path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py"
        )
        for path in sorted(ENGINE.rglob("*.py"))
    }


def test_the_import_walk_sees_imports_inside_functions_and_relative_ones() -> None:
    source = (
        "import a.b\n"
        "from . import sibling\n"
        "from ..up import thing\n"
        "def serve():\n"
        "    if True:\n"
        "        from pygls import server\n"
    )
    names = _imported_modules(source, "infill_engine.x.mod")
    assert {"a.b", "infill_engine.x.sibling", "infill_engine.up", "infill_engine.up.thing", "pygls.server"} <= names
    assert "infill_engine.x.y" in _imported_modules("from .y import z", "infill_engine.x", is_package=True)
    assert "infill_engine/training/train.py" in _engine_imports()  # the walk reaches subpackages


def test_the_engine_imports_nothing_of_the_server_or_the_command_table() -> None:
    offenders = {
        path: sorted(name for name in names if name.split(".")[0] in ABOVE_THE_ENGINE)
        for path, names in _engine_imports().items()
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_only_training_imports_training() -> None:
    offenders = {
        path: sorted(name for name in names if name == TRAINING or name.startswith(TRAINING + "."))
        for path, names in _engine_imports().items()
        if not path.startswith("infill_engine/training/")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


# ------------------------------------------------------------------------------------- at run time, for real models

TRAINING_MODULES = (
    "sorted(m for m in sys.modules if m == 'infill_engine.training' or m.startswith('infill_engine.training.'))"
)
# Loads each model named on the command line in turn, fills one hole with it, and notes the training modules by then.
LOAD_AND_FILL = f"""
import json, sys
from infill_engine.interface import ModelSpec, open_engine
from infill_engine.request import InfillRequest

after = {{}}
for path in sys.argv[1:]:
    engine = open_engine(ModelSpec(path=path, device="cpu"))
    engine.fill(InfillRequest(prefix="def add(a, b):\\n    return ", suffix="\\n", max_tokens=4))
    after[path] = {TRAINING_MODULES}
print(json.dumps(after))
"""


def _fresh_interpreter(code: str, *arguments: str) -> object:
    """What `code`, run by a new Python interpreter over this checkout, prints as JSON on its last line."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code, *arguments], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_run_time_check_sees_a_training_import() -> None:
    code = f"import json, sys\nimport infill_engine.training.loss_log\nprint(json.dumps({TRAINING_MODULES}))"
    assert _fresh_interpreter(code) == ["infill_engine.training", "infill_engine.training.loss_log"]


def _delta_model(root: Path) -> Path:
    """A delta model over a tiny random Llama: its top block, final norm and mask row differ from the base's."""
    from infill_engine.diffill_model.causal_conversion import diffill_from_causal_lm
    from infill_engine.diffill_model.delta import write_delta_model

    base = tiny_models.build_llama(root / "llama")
    start, tokenizer = diffill_from_causal_lm(base)
    trained, _ = diffill_from_causal_lm(base)
    with torch.no_grad():  # what a --train-layers 1 run changes
        trained.layers[1].mlp.down_proj.weight.add_(0.01)
        trained.norm.weight.add_(0.01)
        trained.embed_tokens.weight[trained.config.mask_token_id].add_(0.01)
    destination = root / "delta"
    destination.mkdir()
    write_delta_model(trained, tokenizer, start, str(base), destination)
    assert (destination / "base_model.json").is_file() and not (destination / "model.safetensors").exists()
    return destination


@pytest.fixture(scope="module")
def training_modules_after_loading(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Model kind -> the training modules one fresh interpreter holds once it has loaded and used that model.

    One interpreter loads them all in turn (starting Python with torch takes seconds); a leak shows at the first
    model that causes it.
    """
    root = tmp_path_factory.mktemp("layering")
    embedded = ENGINE / "model"
    assert (embedded / "config.json").is_file(), "the embedded model ships in infill_engine/model"
    models = {"embedded": embedded, "tiny diffill": tiny_models.build_diffill(root / "diffill"),
              "delta": _delta_model(root)}
    after = _fresh_interpreter(LOAD_AND_FILL, *(str(path) for path in models.values()))
    return {kind: after[str(path)] for kind, path in models.items()}


@pytest.mark.parametrize("model", ["embedded", "tiny diffill", "delta"])
def test_loading_and_using_a_model_imports_no_training_module(
    model: str, training_modules_after_loading: dict[str, list[str]]
) -> None:
    assert training_modules_after_loading[model] == []

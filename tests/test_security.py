"""Security mitigations that are checked in process: weights only from safetensors, a checkpoint's code only when
trusted, the model path reads a model and nothing else, settings cannot name code to run, and the evaluation
harness's sandbox. docs/SECURITY.md names the test of each mitigation.
"""

from __future__ import annotations

import ast
import json
import pickle
import shutil
from pathlib import Path

import pytest

from infill_engine.evaluation import Problem, network_isolation, run_test
from infill_engine.loading import ModelLoadError, load_denoiser
from lsp_server.settings import parse_settings

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CODE = ("infill_engine", "lsp_server", "diffill", "scripts")


class _Trap:
    """A pickled object that creates a file when unpickled: what a malicious pytorch_model.bin does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def trap_code(marker: Path) -> str:
    """Python that leaves `marker` behind when it is imported."""
    return f"\nimport pathlib\npathlib.Path({str(marker)!r}).touch()\n"


# ------------------------------------------------------------------------------------------- weights and code


def test_pickled_weights_are_never_loaded(model_dirs, tmp_path):
    marker = tmp_path / "unpickled"
    pickled_only = tmp_path / "pickled"
    shutil.copytree(model_dirs["diffill"], pickled_only)
    (pickled_only / "model.safetensors").unlink()
    (pickled_only / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Trap(marker)}))
    with pytest.raises(ModelLoadError, match=r"no weights in safetensors format.*never loads pickled weights "
                                             r"\(pytorch_model.bin\)"):
        load_denoiser(pickled_only)
    assert not marker.exists()
    both = tmp_path / "both"  # safetensors beside a pickle: the safetensors file is what loads
    shutil.copytree(model_dirs["diffill"], both)
    (both / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Trap(marker)}))
    assert load_denoiser(both).family == "diffill"
    assert not marker.exists()


def test_every_torch_load_in_the_shipped_code_is_weights_only():
    calls = []
    for package in SHIPPED_CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "torch" and any(
                        alias.name == "load" for alias in node.names):
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} imports torch.load under another name")
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                    calls.append((path.relative_to(ROOT), node))
                elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("pickle.load", "pickle.loads"):
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} unpickles")
    assert calls, "the scan found no torch.load at all: it is looking in the wrong place"
    for path, call in calls:
        weights_only = [k for k in call.keywords if k.arg == "weights_only"]
        assert weights_only and ast.unparse(weights_only[0].value) == "True", f"{path}:{call.lineno}"


def test_a_checkpoints_own_code_runs_only_when_trusted(model_dirs, tmp_path):
    marker = tmp_path / "imported"
    remote = tmp_path / "remote"
    shutil.copytree(model_dirs["dream"], remote)
    with open(remote / "modeling_tiny_masked.py", "a", encoding="utf-8") as module:
        module.write(trap_code(marker))
    with pytest.raises(ModelLoadError, match="ships its own modelling code.*trustRemoteCode"):
        load_denoiser(remote)
    assert not marker.exists()
    assert load_denoiser(remote, trust_remote_code=True).family == "dream"
    assert marker.exists()  # the code does run once the user allows it: the refusal above is what kept it out


def test_a_tokenizer_with_its_own_code_is_refused_unless_trusted(model_dirs, tmp_path):
    marker = tmp_path / "imported"
    odd = tmp_path / "odd-tokenizer"
    shutil.copytree(model_dirs["diffill"], odd)
    (odd / "tokenization_evil.py").write_text(trap_code(marker) + "from transformers import PreTrainedTokenizerFast\n"
                                               "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    config = json.loads((odd / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    config["tokenizer_class"] = "EvilTokenizer"
    (odd / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"(?s)custom code.*trust_remote_code"):
        load_denoiser(odd)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["file", "python_file", "directory_of_code"])
def test_a_model_path_that_is_not_a_model_is_a_clear_error_and_nothing_is_run(tmp_path, kind):
    marker = tmp_path / "imported"
    if kind == "file":
        target = tmp_path / "notes.txt"
        target.write_text("not a model\n")
        message = "not a directory"
    elif kind == "python_file":
        target = tmp_path / "setup.py"
        target.write_text(trap_code(marker))
        message = "not a directory"
    else:  # a package with code but no config.json
        target = tmp_path / "package"
        target.mkdir()
        for name in ("__init__.py", "modeling_x.py", "configuration_x.py"):
            (target / name).write_text(trap_code(marker))
        message = "no config.json"
    with pytest.raises(ModelLoadError, match=message):
        load_denoiser(target)
    assert not marker.exists()


def test_settings_cannot_name_code_to_run_or_enable_remote_code_by_default():
    settings, problems = parse_settings({"engine": {"factory": "os:system"}, "model": {"factory": "os:system"}})
    assert problems == ["unknown setting 'engine.factory' ignored", "unknown setting 'model.factory' ignored"]
    assert settings.model.spec().factory is None
    assert settings.model.trust_remote_code is False
    _, problems = parse_settings({"model": {"trustRemoteCode": "yes"}})
    assert problems and "trustRemoteCode" in problems[0]  # only a real boolean turns it on


# ------------------------------------------------------------------------------------------- the evaluation sandbox

CHECK_ONE = "def check(candidate):\n    assert candidate() == 1\n"


def run_body(body: str) -> bool:
    """Whether a completion `body` of `def f():` passes a test that only needs f() == 1."""
    return run_test(Problem("Sandbox/0", "def f():\n", "", "    return 1\n", CHECK_ONE, "f"), body)


def test_the_sandbox_still_runs_an_honest_completion():
    assert run_body("    import math, re, collections, itertools, heapq, hashlib\n    return 1\n")
    assert run_body("    open('scratch.txt', 'w').write('x')\n    return 1\n")  # its own directory is writable


@pytest.mark.parametrize("body", [
    "    import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n    return 1\n",
    "    import urllib.request\n    urllib.request.urlopen('http://127.0.0.1:9', timeout=1)\n    return 1\n",
    "    import subprocess\n    subprocess.run(['true'])\n    return 1\n",
    "    import os\n    os.system('true')\n    return 1\n",
    "    import os\n    os.fork()\n    return 1\n",
    "    import ctypes\n    ctypes.CDLL(None)\n    return 1\n",
], ids=["socket", "urllib", "subprocess", "system", "fork", "ctypes"])
def test_a_completion_gets_no_network_processes_or_native_code(body):
    assert not run_body(body)


def test_a_completion_cannot_write_outside_its_directory_or_fill_the_disk(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    assert not run_body(f"    open({str(victim)!r}, 'w').write('gone')\n    return 1\n")
    assert not run_body(f"    import os\n    os.remove({str(victim)!r})\n    return 1\n")
    assert victim.read_text() == "keep me\n"
    assert not run_body("    open('big', 'wb').write(b'x' * (64 << 20))\n    return 1\n")  # over the 16 MiB cap


def test_the_network_namespace_is_used_where_the_machine_allows_it():
    if not network_isolation():
        pytest.skip("user namespaces are not allowed here: the audit hook alone refuses sockets")
    probe = Problem("Sandbox/net", "import socket\n", "", "", "def check(c):\n    assert socket.if_nameindex() == "
                    "[(1, 'lo')]\n", "print")
    assert run_test(probe, "")  # inside, the only interface is loopback


def test_vs_code_ignores_an_untrusted_workspaces_server_command_model_and_remote_code_settings():
    manifest = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text(encoding="utf-8"))
    untrusted = manifest["capabilities"]["untrustedWorkspaces"]
    assert untrusted["supported"] == "limited"
    restricted = set(untrusted["restrictedConfigurations"])
    assert {"diffill.server.command", "diffill.server.pythonPath", "diffill.server.args", "diffill.model.path",
            "diffill.model.trustRemoteCode"} <= restricted
    declared = manifest["contributes"]["configuration"]
    declared = declared if isinstance(declared, list) else [declared]
    names = {name for section in declared for name in section["properties"]}
    assert restricted <= names  # each restricted name is a real setting, not a typo that restricts nothing


def test_no_shipped_code_evaluates_text_and_only_the_harness_runs_a_completion():
    runs_text = []
    for package in SHIPPED_CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                        "exec", "eval", "compile", "__import__"):
                    runs_text.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}")
                if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                        alias.name in ("runpy", "code", "codeop") for alias in node.names) or (
                        isinstance(node, ast.ImportFrom) and node.module in ("runpy", "code", "codeop")):
                    runs_text.append(f"{path.relative_to(ROOT)}:{node.lineno} imports a code runner")
    assert runs_text == []
    # the harness puts a completion in a program only after its sandbox prelude
    from infill_engine.evaluation import SANDBOX_PRELUDE

    assert "RLIMIT_AS" in SANDBOX_PRELUDE and "RLIMIT_FSIZE" in SANDBOX_PRELUDE and "addaudithook" in SANDBOX_PRELUDE


# ------------------------------------------------------------------------------------------- the socket directory


def test_a_socket_directory_with_loose_permissions_is_made_private(tmp_path):
    import os
    import stat

    from infill_engine.service.address import ensure_private_dir

    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    assert ensure_private_dir(loose) == loose
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700


def test_a_socket_directory_of_another_user_is_refused(tmp_path):
    import os

    from infill_engine.service.address import ensure_private_dir

    if os.getuid() != 0:
        pytest.skip("making a directory that belongs to another user needs root")
    planted = tmp_path / "planted"  # what another user could create in /tmp before us
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to another user"):
        ensure_private_dir(planted)

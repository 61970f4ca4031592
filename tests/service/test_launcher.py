"""The language server's launcher of the shared engine: the engine it starts serves the model it asked for, with every
setting of it, so the server connects instead of falling back to a second copy of the model in its own process."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import pytest

from infill_engine.interface import ModelSpec, model_spec_from_args, open_engine
from infill_engine.service.command import add_arguments
from infill_engine.service.launcher import SharedEngine, serve_command
from tests.lsp.conftest import ROOT, spec_with_every_field_set
from tests.service.conftest import FACTORY


def test_the_engine_command_carries_every_field_of_the_model_spec(tmp_path: Path):
    spec = spec_with_every_field_set(tmp_path)  # a new field needs an option in `serve_command` too
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    command = serve_command(spec, tmp_path / "engine.sock", 60)
    assert command[1:4] == ["-m", "diffill", "engine"]
    served = model_spec_from_args(parser.parse_args(command[4:]))
    assert served == spec and served.threads == spec.threads
    assert served.key == spec.key  # the socket's name, and what the handshake checks


def test_a_server_with_the_compiled_layers_on_connects_to_the_engine_it_starts(runtime: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    engine = open_engine(ModelSpec(factory=FACTORY, device="cpu", compiled_layers="auto"), "shared", serving=True)
    pid = int(engine.client.hello["pid"]) if isinstance(engine, SharedEngine) else None
    try:
        assert isinstance(engine, SharedEngine)  # not the in-process fallback beside an engine serving another spec
        assert "shared engine" in engine.describe().device
    finally:
        engine.close()
        if pid is not None:  # the engine it started is detached: stopped here
            os.kill(pid, signal.SIGKILL)

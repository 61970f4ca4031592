"""Settings: nested defaults, one message per bad key, and every setting documented in the README."""

from __future__ import annotations

import re

import pytest

from lsp_server.settings import Settings, concerns_us, documented_settings, parse_settings
from tests.lsp.conftest import ROOT


def test_no_settings_means_every_default():
    assert parse_settings(None) == (Settings(), [])
    assert parse_settings({}) == (Settings(), [])


def test_camel_case_snake_case_and_the_diffill_section_are_all_read():
    settings, problems = parse_settings({"diffill": {"model": {"trustRemoteCode": True, "path": "/m"},
                                                     "completion": {"debounce_ms": 0}, "languages": ["Python"]}})
    assert problems == []
    assert settings.model.trust_remote_code and settings.model.path == "/m"
    assert settings.completion.debounce_ms == 0
    assert settings.enabled_for("python") and not settings.enabled_for("rust")


def test_the_model_shorthand_is_a_path():
    assert parse_settings({"model": "/models/small"})[0].model.path == "/models/small"


def test_each_bad_key_is_named_and_keeps_its_default():
    settings, problems = parse_settings({
        "completion": {"candidates": 0, "maxTokens": "many", "enabled": "yes"},
        "model": {"device": "gpu", "dtype": "int4", "family": "gpt"},
        "engine": {"mode": "cloud"},
        "rewrite": {"keepAbove": 2},
        "context": 5,
        "colour": "blue",
    })
    assert settings == Settings()
    named = " ".join(problems)
    for key in ("completion.candidates", "completion.maxTokens", "completion.enabled", "model.device", "model.dtype",
                "model.family", "engine.mode", "rewrite.keepAbove", "context", "colour"):
        assert f"'{key}'" in named
    assert len(problems) == 10


def test_good_keys_next_to_bad_ones_are_kept():
    settings, problems = parse_settings({"completion": {"candidates": 99, "maxTokens": 32}})
    assert settings.completion.max_tokens == 32 and settings.completion.candidates == 2
    assert len(problems) == 1


def test_settings_that_are_not_an_object_are_refused():
    settings, problems = parse_settings(["model"])
    assert settings == Settings() and "JSON object" in problems[0]


def test_the_engine_modes_of_later_issues_are_accepted():
    for mode in ("inprocess", "shared", "auto", "remote"):
        assert parse_settings({"engine": {"mode": mode}})[0].engine.mode == mode


def test_every_setting_is_in_the_readme_with_its_default():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Language server") :]
    section = section[: section.index("\n## ", 3)]
    rows = dict(re.findall(r"^\| `([A-Za-z.]+)` \| `([^`]*)` \|", section, flags=re.MULTILINE))
    assert rows == dict(documented_settings())


def test_settings_pushed_for_other_servers_are_not_ours():
    assert concerns_us({"diffill": {}}) and concerns_us({"completion": {"candidates": 3}})
    assert not concerns_us({"python": {"analysis": {}}, "rust-analyzer": {}})
    assert concerns_us(["not", "an", "object"])  # reported as malformed rather than ignored
    assert not concerns_us(None) and not concerns_us({})  # nothing pushed: the settings in force stay


def test_the_command_line_model_options_hold_where_the_editor_sends_none():
    from dataclasses import replace

    from lsp_server.settings import ModelSettings

    # `diffill serve --model M --device cpu --dtype bfloat16 --threads 3`: the editor names only the dtype
    base = replace(Settings(), model=ModelSettings(path="/models/m", device="cpu", dtype="bfloat16", threads=3))
    settings, problems = parse_settings({"model": {"dtype": "float32"}}, base)
    assert problems == []
    assert (settings.model.path, settings.model.device, settings.model.threads) == ("/models/m", "cpu", 3)
    assert settings.model.dtype == "float32"
    assert parse_settings({}, base)[0].model == base.model


def test_every_command_line_model_option_of_diffill_serve_reaches_the_engine_it_opens(tmp_path):
    from infill_engine.interface import ModelSpec
    from lsp_server.settings import ModelSettings
    from tests.lsp.conftest import spec_with_every_field_set

    spec = spec_with_every_field_set(tmp_path)
    assert ModelSettings.of_spec(spec).spec(spec.factory) == spec
    assert ModelSettings().spec().compiled_layers == ModelSpec().compiled_layers  # unset: the machine's default


def test_the_canvas_refresh_setting_reaches_the_engine_sampler_and_unset_keeps_the_engines(tokenizer):
    """`sampling.canvasRefresh` 0 gives exact passes over the whole canvas; unset, the engine's default stays."""
    from infill_engine.engine import InfillEngine
    from infill_engine.sampler import SamplerConfig
    from tests.scripted import ScriptedDenoiser

    settings, problems = parse_settings({"sampling": {"canvasRefresh": 0}})
    assert problems == [] and settings.engine_options().canvas_refresh == 0
    _, problems = parse_settings({"sampling": {"canvasRefresh": -2}})
    assert problems and "canvasRefresh" in problems[0]
    engine = InfillEngine(ScriptedDenoiser(tokenizer, ["x"]), sampler=SamplerConfig(canvas_refresh=8))
    engine.configure(settings.engine_options())
    assert engine.sampler.canvas_refresh == 0
    engine.configure(parse_settings({})[0].engine_options())
    assert engine.sampler.canvas_refresh == 8



def test_sampler_overrides_reach_the_engine_over_the_checkpoints_own_and_unset_restores_them(tokenizer):
    """`sampling.overrides` sets any other sampler field (camelCase or snake_case) over the engine's defaults,
    which hold the checkpoint's own settings; sending none brings those back."""
    from infill_engine.engine import InfillEngine
    from infill_engine.sampler import SamplerConfig
    from tests.scripted import ScriptedDenoiser

    settings, problems = parse_settings({"sampling": {"overrides": {"threshold": 0.6, "tail_floor": 0.3}}})
    assert problems == [] and dict(settings.sampling.overrides) == {"tail_floor": 0.3, "threshold": 0.6}
    engine = InfillEngine(ScriptedDenoiser(tokenizer, ["x"]), sampler=SamplerConfig(end_bias=-0.5))
    engine.configure(settings.engine_options())
    assert (engine.sampler.threshold, engine.sampler.tail_floor, engine.sampler.end_bias) == (0.6, 0.3, -0.5)
    engine.configure(parse_settings({"sampling": {"overrides": {"endBias": 0}}})[0].engine_options())
    assert (engine.sampler.threshold, engine.sampler.end_bias) == (SamplerConfig().threshold, 0)
    engine.configure(parse_settings({})[0].engine_options())
    assert engine.sampler == SamplerConfig(end_bias=-0.5)


@pytest.mark.parametrize("overrides, message", [
    ({"thresh": 0.8}, "unknown sampler settings thresh; allowed: blockSize"),
    ({"threshold": "high"}, "threshold must be a number"),
    ({"threshold": 2}, "threshold must be within 0..1"),
    ({"seed": 3}, "cannot set seed: each has a setting of its own"),
    ([0.8], "must be an object of sampler settings"),
])
def test_a_bad_sampler_override_is_reported_and_none_applies(overrides, message):
    settings, problems = parse_settings({"sampling": {"overrides": overrides, "seed": 7}})
    assert len(problems) == 1 and "'sampling.overrides'" in problems[0] and message in problems[0]
    assert settings.sampling.overrides == {} and settings.sampling.seed == 7  # the other keys still apply

"""Fuzzing the settings parser: random JSON values for every documented key, for whole sections and for the root.

Properties: parsing never raises; each key that is kept holds a value its own check accepts; each key that was wrong
is named in one message saying what is allowed, and its default is used; the settings that come out give the engine
its options and model spec without raising.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields, is_dataclass

from hypothesis import example, given, strategies as st

from lsp_server.settings import Settings, _camel, documented_settings, parse_settings
from tests.fuzzing import examples

KEYS = [key for key, _ in documented_settings()]
SECTIONS = sorted({key.split(".")[0] for key in KEYS if "." in key})

# What JSON can carry (Python's json module also reads NaN and Infinity, so a client can send them).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-3, 300) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["auto", "cpu", "cuda:0", "cuda:١", "bfloat16", "diffill", "shared", "python", "", " "]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def raw_settings(draw: st.DrawFn) -> object:
    """A settings object: random values for some documented keys, some sections and some unknown keys."""
    raw: dict[str, object] = {}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=8, unique=True)):
        section, _, name = key.rpartition(".")
        target = raw.setdefault(section, {}) if section else raw
        if isinstance(target, dict):
            target[name] = draw(json_values)
    for section in draw(st.lists(st.sampled_from(SECTIONS), max_size=2)):
        raw[section] = draw(json_values)  # a whole section replaced by anything
    raw.update(draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2)))
    return draw(st.sampled_from([raw, {"diffill": raw}])) if draw(st.booleans()) else draw(json_values)


def checked(settings: object, path: str = "") -> None:
    """Every field of the settings passes its own check unchanged."""
    for spec in fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, spec.name)
        if is_dataclass(value):
            checked(value, f"{path}{_camel(spec.name)}.")
        else:
            assert spec.metadata["check"](value) == value, f"{path}{_camel(spec.name)} = {value!r}"


@examples(100)
@given(raw=raw_settings())
@example(raw={"model": {"device": "cuda:١"}})  # a digit that is not ASCII
@example(raw={"rewrite": {"keepAbove": math.nan}, "completion": {"maxTokens": 10**30}})
@example(raw={"completion": {"lineTokens": 512, "maxTokens": 8}})
def test_any_json_gives_valid_settings_and_a_message_per_wrong_key(raw):
    settings, problems = parse_settings(raw)
    assert isinstance(settings, Settings)
    checked(settings)
    for problem in problems:
        assert isinstance(problem, str) and ("'" in problem or "JSON object" in problem)
    settings.engine_options()
    settings.model.spec()
    assert re.fullmatch(r"auto|cpu|cuda|mps|cuda:[0-9]+", settings.model.device)  # what torch.device accepts
    json.dumps(problems)  # the messages can be sent to the client as they are
    if not isinstance(raw, dict):
        assert raw is None or problems


@examples(100)
@given(key=st.sampled_from(KEYS), value=json_values)
def test_a_wrong_value_is_named_and_its_default_is_kept(key, value):
    section, _, name = key.rpartition(".")
    raw = {section: {name: value}} if section else {name: value}
    settings, problems = parse_settings(raw)
    if problems:
        assert any(f"'{key}'" in problem for problem in problems), problems
        if not key.endswith("lineTokens"):  # lineTokens may be kept and lowered to maxTokens instead
            assert settings == Settings() or any("larger than" in problem for problem in problems)

"""`diffill serve` end to end with a real (tiny, random) checkpoint: protocol shapes and bad input.

A random model writes garbage, so these tests assert what must hold for any output: answers have the right LSP
shape and position, a suggestion never adds a syntax problem (the gate), mid-line suggestions are one line, and
every bad input gets an empty answer or a JSON-RPC error while the server keeps serving. Plain-text documents (no
grammar: only the bracket check applies) get suggestions from such a model often, so the properties are exercised.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.lsp.conftest import (
    CLIENTS,
    SERVER_ENV,
    WAIT,
    apply_text_edits,
    apply_workspace_edit,
    complete,
    debug_info,
    encoding,
    field_of,
    inline,
    offset_of,
    open_document,
    problems,
    send_raw,
    serve_command,
    start_ready,
    status_after,
)

pytestmark = pytest.mark.asyncio

PROSE = "the quick brown fox jumps over the lazy dog and then the dog sleeps again\n" * 4
EMOJI_LINE = "s = '😀😀' + name\n"


@pytest_lsp.fixture(config=ClientServerConfig(serve_command(), server_env=SERVER_ENV), scope="module", params=CLIENTS)
async def client(lsp_client: LanguageClient, request: pytest.FixtureRequest, tiny_checkpoint):
    settings = {
        "model": {"path": str(tiny_checkpoint), "threads": 1},
        # no time budget: on a loaded machine a fill past it skips its repairs and these tests would see no text
        "completion": {"debounceMs": 0, "candidates": 3, "maxTokens": 12, "lineTokens": 8, "budgetMs": None,
                       "askedBudgetMs": None},
        "rewrite": {"maxTokens": 16},
        "diagnostics": {"debounceMs": 0},
    }
    await start_ready(lsp_client, request.param, settings)
    yield
    await lsp_client.shutdown_session()


def items_of(result) -> list:
    if result is None:
        return []
    return list(result.items) if hasattr(result, "items") else list(result)


async def test_capabilities_advertise_every_feature(client: LanguageClient):
    capabilities = client.init_result.capabilities  # type: ignore[attr-defined]
    assert capabilities.inline_completion_provider is not None
    assert capabilities.completion_provider is not None
    assert capabilities.code_action_provider.resolve_provider is True
    assert {"diffill.rewrite", "diffill.refine", "diffill.fill"} <= set(capabilities.execute_command_provider.commands)
    expected = "utf-8" if client.client_name == "neovim" else "utf-16"  # type: ignore[attr-defined]
    assert encoding(client) == expected  # the client's first preference (Neovim 0.11 offers UTF-8 first)


async def test_model_loading_was_reported_as_progress(client: LanguageClient):
    reports = [values for token, values in client.progress_reports.items() if str(token).startswith("diffill-load")]
    assert reports, "no $/progress for loading the model"
    values = [getattr(v, "value", v) for v in reports[0]]
    assert isinstance(values[0], types.WorkDoneProgressBegin)
    assert isinstance(values[-1], types.WorkDoneProgressEnd) and values[-1].message == "Model ready"


async def test_ghost_text_answers_match_their_status_and_never_add_a_syntax_problem(client: LanguageClient):
    uri = "file:///tiny/add.py"
    text = "def add(a, b):\n    return \n\nprint(add(1, 2))\n"
    open_document(client, uri, text)
    seen = len(client.statuses)  # type: ignore[attr-defined]
    items = items_of(await inline(client, uri, 1, 11))
    status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    assert field_of(status, "forward_passes") >= 1  # the model really ran
    assert field_of(status, "items") == len(items)
    assert field_of(status, "outcome") == ("ok" if items else "empty")
    for item in items:
        edited = apply_text_edits(text, [types.TextEdit(range=item.range, new_text=item.insert_text)], encoding(client))
        assert problems(edited) == []


async def test_ghost_text_in_plain_text_at_a_line_end_and_mid_line(client: LanguageClient):
    uri = "file:///tiny/notes.txt"
    open_document(client, uri, PROSE, language="plaintext")
    shown = 0
    for line, character in ((0, 73), (1, 9), (2, 30), (3, 73)):
        result = await inline(client, uri, line, character)
        for item in items_of(result):
            shown += 1
            assert item.range.start == types.Position(line, character) == item.range.end
            if character < 73:
                assert "\n" not in item.insert_text  # mid-line: one line
            edited = apply_text_edits(PROSE, [types.TextEdit(range=item.range, new_text=item.insert_text)],
                                      encoding(client))
            assert problems(edited, "plaintext") == problems(PROSE, "plaintext")  # no unbalanced bracket added
    assert shown > 0, "the tiny model's fills never passed in plain text: the properties went unchecked"


async def test_completion_items_are_labelled_and_insert_at_the_cursor(client: LanguageClient):
    shown = 0
    for index, word in enumerate(("fo", "do", "sle", "ju")):
        uri = f"file:///tiny/words-{index}.txt"
        line = f"the quick brown {word}"
        open_document(client, uri, PROSE + line + "\n", language="plaintext")
        result = await complete(client, uri, 4, len(line))
        assert result is None or isinstance(result, types.CompletionList) and result.is_incomplete
        for item in items_of(result):
            shown += 1
            assert item.label_details.description == "diffill"
            start = types.Position(4, len(line) - len(word))
            assert item.text_edit.range == types.Range(start=start, end=types.Position(4, len(line)))
            assert item.text_edit.new_text.startswith(word)
    assert shown > 0, "no completion item at any of the words: the properties went unchecked"


async def test_rewrite_returns_an_edit_that_keeps_the_file_parseable_or_nothing(client: LanguageClient):
    edits = 0
    for uri, text, language, selection in (
        ("file:///tiny/rewrite.py", "def add(a, b):\n    return a + b\n", "python", ((1, 11), (1, 16))),
        ("file:///tiny/rewrite.txt", PROSE, "plaintext", ((1, 4), (1, 19))),
        ("file:///tiny/rewrite-2.txt", PROSE, "plaintext", ((2, 0), (2, 30))),
    ):
        open_document(client, uri, text, language=language, version=7)
        seen = len(client.statuses)  # type: ignore[attr-defined]
        action = types.CodeAction(title="Rewrite selection (diffill)", data={
            "diffill": "rewrite", "uri": uri, "version": 7, "instruction": None,
            "range": {"start": {"line": selection[0][0], "character": selection[0][1]},
                      "end": {"line": selection[1][0], "character": selection[1][1]}}})
        resolved = await asyncio.wait_for(client.code_action_resolve_async(action), WAIT)
        status = await status_after(client, seen, types.CODE_ACTION_RESOLVE)
        assert field_of(status, "outcome") == ("ok" if resolved.edit is not None else "empty")
        if resolved.edit is not None:
            edits += 1
            edited = apply_workspace_edit(text, uri, resolved.edit, encoding(client))
            assert problems(edited, language) == problems(text, language)
            start = offset_of(text, types.Position(*selection[0]), encoding(client))
            end = offset_of(text, types.Position(*selection[1]), encoding(client))
            assert edited.startswith(text[:start]) and edited.endswith(text[end:])  # only the selection changed
    assert edits > 0, "no rewrite passed: the edit's properties went unchecked"


async def test_unknown_documents_and_positions_outside_the_document_get_nothing(client: LanguageClient):
    assert await inline(client, "file:///tiny/never-opened.py", 0, 0) is None
    assert await complete(client, "file:///tiny/never-opened.py", 0, 0) is None
    uri = "file:///tiny/short.py"
    open_document(client, uri, "x = 1\n")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    assert await inline(client, uri, 40, 0) is None  # past the last line
    assert field_of(await status_after(client, seen), "outcome") == "invalid"
    seen = len(client.statuses)  # type: ignore[attr-defined]
    items = items_of(await inline(client, uri, 0, 400))  # past the end of the line: served at the end of the line
    assert field_of(await status_after(client, seen), "outcome") in ("ok", "empty")  # served, not refused
    assert all(item.range.start == types.Position(0, 5) for item in items)


async def test_positions_inside_a_surrogate_pair_are_moved_to_the_character_start(client: LanguageClient):
    uri = "file:///tiny/emoji.txt"
    open_document(client, uri, EMOJI_LINE, language="plaintext")
    widths = {"utf-8": 4, "utf-16": 2, "utf-32": 1}
    width = widths[encoding(client)]
    boundaries = {5 + k * width for k in range(3)} | set(range(5)) | {5 + 2 * width + k for k in range(9)}
    inside = {5 + k * width + j for k in range(2) for j in range(1, width)}  # positions within an emoji
    moved = 0
    for character in range(5 + 2 * width + 9):
        result = await inline(client, uri, 0, character)
        for item in items_of(result):
            assert item.range.start.character in boundaries
            assert item.range.start.character <= character
            moved += character in inside
    assert moved > 0 or width == 1, "no suggestion at a position inside an emoji: the move went unchecked"
    assert (await debug_info(client)) is not None  # still serving


async def test_a_language_without_a_grammar_is_served_without_diagnostics(client: LanguageClient):
    uri = "file:///tiny/program.cbl"
    open_document(client, uri, "       IDENTIFICATION DIVISION.\n       PROGRAM-ID. HELLO.\n", language="cobol")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    result = await inline(client, uri, 1, 25)
    assert result is None or isinstance(result, types.InlineCompletionList)
    assert field_of(await status_after(client, seen), "outcome") in ("ok", "empty")  # served
    broken = "file:///tiny/broken.py"  # a control: a document with a grammar gets its diagnostics in this time
    open_document(client, broken, "def f(:\n")
    for _ in range(WAIT * 20):
        if client.diagnostics.get(broken):
            break
        await asyncio.sleep(0.05)
    assert client.diagnostics.get(broken)
    assert not client.diagnostics.get(uri)


async def test_a_five_megabyte_document_is_served(client: LanguageClient):
    uri = "file:///tiny/huge.py"
    block = "def add(a, b):\n    return a + b\n\n\n"
    text = block * (5_000_000 // len(block)) + "result = "
    open_document(client, uri, text)
    seen = len(client.statuses)  # type: ignore[attr-defined]
    result = await inline(client, uri, text.count("\n"), 9)
    assert result is None or isinstance(result, types.InlineCompletionList)
    assert field_of(await status_after(client, seen), "outcome") in ("ok", "empty")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    await inline(client, "file:///tiny/add.py", 1, 11)  # and the next request is served
    assert field_of(await status_after(client, seen), "uri") == "file:///tiny/add.py"


async def test_malformed_settings_are_reported_and_defaults_used(client: LanguageClient):
    shown = len(client.messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": {
        "completion": {"candidates": "many", "debounceMs": 0, "maxTokens": 12, "lineTokens": 8},
        "bogus": True, "model": {"path": field_of((await debug_info(client)), "settings")["model"]["path"],
                                  "threads": 1}}}))
    for _ in range(WAIT * 20):
        if len(client.messages) >= shown + 2:
            break
        await asyncio.sleep(0.05)
    text = " ".join(m.message for m in client.messages[shown:])
    assert "'completion.candidates'" in text and "'bogus'" in text
    info = await debug_info(client)
    assert field_of(info, "settings")["completion"]["candidates"] == 2  # the default
    assert field_of(info, "state") == "ready"  # the model did not change, so it was not reloaded


async def test_sampler_overrides_are_applied_and_a_bad_one_is_reported(client: LanguageClient):
    model = field_of((await debug_info(client)), "settings")["model"]
    base = {"completion": {"debounceMs": 0, "maxTokens": 12, "lineTokens": 8, "budgetMs": None},
            "model": {"path": model["path"], "threads": 1}}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": {
        **base, "sampling": {"overrides": {"threshold": 0.5, "endBias": -1}}}}))
    for _ in range(WAIT * 20):
        if field_of(await debug_info(client), "settings")["sampling"]["overrides"]:
            break
        await asyncio.sleep(0.05)
    info = await debug_info(client)
    assert field_of(info, "settings")["sampling"]["overrides"] == {"end_bias": -1, "threshold": 0.5}
    assert field_of(info, "state") == "ready"  # the model did not change, so it was not reloaded
    shown = len(client.messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": {
        **base, "sampling": {"overrides": {"treshold": 0.5}}}}))
    for _ in range(WAIT * 20):
        if len(client.messages) > shown:
            break
        await asyncio.sleep(0.05)
    text = " ".join(m.message for m in client.messages[shown:])
    assert "'sampling.overrides'" in text and "treshold" in text
    assert field_of(await debug_info(client), "settings")["sampling"]["overrides"] == {}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": base}))


async def test_malformed_requests_get_a_json_rpc_error_and_the_server_goes_on(client: LanguageClient):
    with pytest.raises(JsonRpcException):  # the server's JSON-RPC error
        await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="diffill.rewrite", arguments=["file:///tiny/add.py"])), WAIT)
    with pytest.raises(JsonRpcException):
        await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="diffill.refine", arguments=["file:///tiny/add.py", {"start": "nowhere"}])), WAIT)
    with pytest.raises(JsonRpcException):  # params that are not InlineCompletionParams
        await send_raw(client, {"id": "raw-1", "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
                                "params": {"textDocument": {"uri": 5}}})
    with pytest.raises(JsonRpcException):  # a method nobody implements
        await send_raw(client, {"id": "raw-2", "method": "diffill/noSuchMethod", "params": {}})
    assert field_of(await debug_info(client), "state") == "ready"

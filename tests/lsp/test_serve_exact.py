"""`diffill serve` end to end with a deterministic model: exact suggestions, edits, caching and freshness.

The server runs the real engine (canvas, denoising loop, syntax gate, refine) around the rule denoiser of
`tests.lsp.fake_engine`, so every answer here is known in advance. One server per recorded client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.lsp import fake_engine
from tests.lsp.conftest import (
    CLIENTS,
    SERVER_ENV,
    WAIT,
    apply_text_edits,
    apply_workspace_edit,
    change_document,
    complete,
    debug_info,
    encoding,
    field_of,
    inline,
    open_document,
    problems,
    serve_command,
    start_ready,
    status_after,
)

pytestmark = pytest.mark.asyncio

# no time budget: these tests supersede and cancel slow fills, which a budget would end first
SETTINGS = {"completion": {"debounceMs": 0, "budgetMs": None, "askedBudgetMs": None}, "diagnostics": {"debounceMs": 0}, "context": {"otherDocuments": False}}


@pytest_lsp.fixture(
    config=ClientServerConfig(serve_command("--engine-factory", "tests.lsp.fake_engine:build_engine"),
                              server_env=SERVER_ENV),
    scope="module", params=CLIENTS,
)
async def client(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    await start_ready(lsp_client, request.param, SETTINGS)
    yield
    await lsp_client.shutdown_session()


def texts(result: types.InlineCompletionList | None) -> list[str]:
    return [item.insert_text for item in result.items] if result else []  # type: ignore[misc]


async def test_ghost_text_while_typing_is_one_candidate_and_invoked_offers_every_one_that_passes(
    client: LanguageClient,
):
    uri = "file:///exact/add.py"
    open_document(client, uri, "def add(a, b):\n    return \n\nprint(add(1, 2))\n")
    assert texts(await inline(client, uri, 1, 11)) == ["a + b"]  # typing: automaticCandidates (1), the greedy one
    seen = len(client.statuses)  # type: ignore[attr-defined]
    result = await inline(client, uri, 1, 11, invoked=True)  # asked for: completion.candidates (2)
    assert sorted(texts(result)) == ["a + b", "b + a"]
    cursor = types.Range(start=types.Position(1, 11), end=types.Position(1, 11))
    assert all(item.range == cursor for item in result.items)
    status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    assert field_of(status, "forward_passes") >= 1 and not field_of(status, "cache_hit")  # not the 1-candidate answer


async def test_mid_line_ghost_text_is_one_line_without_the_bracket_that_follows(client: LanguageClient):
    uri = "file:///exact/total.py"
    open_document(client, uri, "values = [1, 2]\ntotal = sum()\n")
    assert texts(await inline(client, uri, 1, 12)) == ["values"]  # the model wrote "values)\nprint(total)"


async def test_completion_items_insert_the_fill_after_the_typed_word(client: LanguageClient):
    uri = "file:///exact/scale.py"
    text = "def scale(values, factor):\n    ret\n"
    open_document(client, uri, text)
    result = await complete(client, uri, 1, 7)
    items = result.items if isinstance(result, types.CompletionList) else result
    assert [item.label for item in items] == ["return [v * factor for v in values]"]
    item = items[0]
    assert item.label_details.description == "diffill"
    assert item.text_edit.range == types.Range(start=types.Position(1, 4), end=types.Position(1, 7))
    applied = apply_text_edits(text, [item.text_edit], encoding(client))
    assert applied == "def scale(values, factor):\n    return [v * factor for v in values]\n"
    assert problems(applied) == []


async def test_typing_the_start_of_a_suggestion_is_answered_from_the_cache(client: LanguageClient):
    uri = "file:///exact/typed.py"
    text = "def add(a, b):\n    return \n"
    open_document(client, uri, text)
    assert texts(await inline(client, uri, 1, 11)) == ["a + b"]
    seen = len(client.statuses)  # type: ignore[attr-defined]
    change_document(client, uri, "def add(a, b):\n    return a \n", 2)
    assert texts(await inline(client, uri, 1, 13)) == ["+ b"]
    status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    assert field_of(status, "cache_hit") is True
    assert field_of(status, "forward_passes") == 0
    assert field_of(status, "outcome") == "cache"


async def accept_first_ghost_text(client: LanguageClient, uri: str, text: str, line: int, character: int,
                                  version: int) -> str:
    """Ask for ghost text, apply its first item's edit as the editor does on Tab, and return the new text."""
    result = await inline(client, uri, line, character)
    assert result is not None and result.items
    item = result.items[0]
    edit = types.TextEdit(range=item.range, new_text=item.insert_text)  # type: ignore[arg-type]
    accepted = apply_text_edits(text, [edit], encoding(client))
    change_document(client, uri, accepted, version)
    return accepted


async def prefetched(client: LanguageClient) -> int:
    return field_of(await debug_info(client), "prefetched")


async def test_the_request_after_accepting_ghost_text_is_answered_from_the_cache(client: LanguageClient):
    uri = "file:///exact/accept.py"
    text = "def mul(a, b):\n    product = \n"
    open_document(client, uri, text)
    before = await prefetched(client)
    accepted = await accept_first_ghost_text(client, uri, text, 1, 14, 2)
    assert accepted == "def mul(a, b):\n    product = a * b\n"
    for _ in range(WAIT * 100):  # the fill for the accepted text runs in the background; let it finish
        if await prefetched(client) > before:
            break
        await asyncio.sleep(0.01)
    seen = len(client.statuses)  # type: ignore[attr-defined]
    assert texts(await inline(client, uri, 1, 19)) == ["  # the product"]
    status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    assert field_of(status, "cache_hit") is True and field_of(status, "forward_passes") == 0


async def with_settings(client: LanguageClient, completion: dict[str, Any]) -> None:
    """Send SETTINGS with these completion settings, and let the server take them before the next request."""
    changed = {**SETTINGS, "completion": {**SETTINGS["completion"], **completion}}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": changed}))
    await asyncio.sleep(0.2)


async def test_a_fill_the_user_asks_for_writes_something_where_ghost_text_while_typing_is_blank(
    client: LanguageClient,
):
    """The model would write a space and end; `completion.requireContent` ("asked" by default) holds the end back
    for Invoked ghost text and completion items, so they get its next choice; "always" does so while typing too,
    "never" for neither."""
    uri = "file:///exact/pad.py"
    open_document(client, uri, "def pad(a):\n    return\n")
    assert texts(await inline(client, uri, 1, 10)) == []  # typing: a space alone is no ghost text
    assert texts(await inline(client, uri, 1, 10, invoked=True)) == [" a"]
    result = await complete(client, uri, 1, 10)
    items = result.items if isinstance(result, types.CompletionList) else result
    assert [item.label for item in items] == ["return a"]
    await with_settings(client, {"requireContent": "always"})
    try:
        assert texts(await inline(client, uri, 1, 10)) == [" a"]
        await with_settings(client, {"requireContent": "never"})
        assert texts(await inline(client, uri, 1, 10, invoked=True)) == []
    finally:
        await with_settings(client, {})


async def test_a_key_typed_during_the_prefetch_delay_stops_it_before_it_runs_and_tab_starts_it_at_once(
    client: LanguageClient,
):
    """With a long `prefetchDelayMs`, a key that is not the acceptance stops the prefetch unstarted (no fill is
    kept); after accepting, the request asks for the prefetch, which then runs at once and answers it."""
    await with_settings(client, {"prefetchDelayMs": 5000})
    try:
        uri = "file:///exact/delay.py"
        text = "def mul(a, b):\n    product = \n"
        open_document(client, uri, text)
        before = await prefetched(client)
        assert texts(await inline(client, uri, 1, 14)) == ["a * b"]
        change_document(client, uri, "def mul(a, b):\n    product = b\n", 2)  # typed something else
        await asyncio.sleep(0.5)
        assert await prefetched(client) == before
        change_document(client, uri, text, 3)
        accepted = await accept_first_ghost_text(client, uri, text, 1, 14, 4)
        seen = len(client.statuses)  # type: ignore[attr-defined]
        assert texts(await inline(client, uri, 1, 19)) == ["  # the product"]
        status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
        assert accepted.endswith("a * b\n") and field_of(status, "outcome") == "cache"
        assert await prefetched(client) == before + 1
    finally:
        await with_settings(client, {})


async def test_with_prefetch_off_the_request_after_accepting_runs_the_model(client: LanguageClient):
    uri = "file:///exact/accept_off.py"
    text = "def mul(a, b):\n    product = \n"
    off = {**SETTINGS, "completion": {**SETTINGS["completion"], "prefetchAccepted": False}}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": off}))
    try:
        await asyncio.sleep(0.2)  # the notification is handled before the next request
        open_document(client, uri, text)
        before = await prefetched(client)
        await accept_first_ghost_text(client, uri, text, 1, 14, 2)
        seen = len(client.statuses)  # type: ignore[attr-defined]
        assert texts(await inline(client, uri, 1, 19)) == ["  # the product"]
        status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
        assert field_of(status, "cache_hit") is False and field_of(status, "forward_passes") >= 1
        assert await prefetched(client) == before
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": SETTINGS}))
        await asyncio.sleep(0.2)


async def test_a_fill_that_breaks_the_syntax_is_never_shown(client: LanguageClient):
    uri = "file:///exact/broken.py"
    open_document(client, uri, "broken = \nprint(broken)\n")
    assert await inline(client, uri, 0, 9) is None  # the model wrote "foo(": the gate drops it


async def test_a_newer_request_supersedes_a_running_one(client: LanguageClient):
    uri = "file:///exact/slow.py"
    open_document(client, uri, "slow = \nfast = \n")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    first = asyncio.ensure_future(inline(client, uri, 0, 7))
    await asyncio.sleep(fake_engine.SLOW_STEP_SECONDS * 3)  # the slow fill is running
    second = await inline(client, uri, 1, 7)
    assert texts(second) == ["42"]
    assert await first is None
    statuses = [s for s in client.statuses[seen:]]  # type: ignore[attr-defined]
    outcomes = sorted(field_of(s, "outcome") for s in statuses)
    assert outcomes == ["ok", "superseded"]
    superseded = next(s for s in statuses if field_of(s, "outcome") == "superseded")
    assert field_of(superseded, "steps_done") < 24  # it stopped at a step, not at the end
    # both reached the model, the superseded one's work thrown away (what `diffill bench lsp` counts)
    assert [field_of(s, "model_started") for s in statuses] == [True, True]


async def type_during_slow_fill(client: LanguageClient, uri: str, typed: str) -> tuple[Any, list[Any]]:
    """Ask for ghost text after "through = ", then, while the slow fill runs, type `typed` at the cursor key by key
    as VS Code does (didChange, $/cancelRequest of the request still waiting, a new request); the last key's answer
    and the statuses of every request."""
    tail = f"\n# {uri}\n"  # a document of its own: the suggestion cache is keyed on the text, not the uri
    open_document(client, uri, f"through = {tail}")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    waiting = send_inline(client, uri, 0, 10, f"{uri}#0")
    await asyncio.sleep(fake_engine.SLOW_STEP_SECONDS * 2)  # the slow fill is running
    for count in range(1, len(typed) + 1):
        change_document(client, uri, f"through = {typed[:count]}{tail}", count + 1)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=f"{uri}#{count - 1}"))
        try:  # answered with nothing (outdated), or with pygls's error for a cancelled request
            assert await asyncio.wait_for(asyncio.wrap_future(waiting), WAIT) is None
        except asyncio.TimeoutError:
            raise
        except Exception:  # noqa: BLE001, S110 - the RequestCancelled error
            pass
        waiting = send_inline(client, uri, 0, 10 + count, f"{uri}#{count}")
    last = await asyncio.wait_for(asyncio.wrap_future(waiting), WAIT)
    for _ in range(len(typed) + 1):
        await status_after(client, seen + _, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    return last, client.statuses[seen : seen + len(typed) + 1]  # type: ignore[attr-defined]


def send_inline(client: LanguageClient, uri: str, line: int, character: int, msg_id: str) -> Any:
    params = types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character))
    return client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)


async def test_keys_typed_through_a_running_fill_get_the_rest_of_its_suggestion(client: LanguageClient):
    last, statuses = await type_during_slow_fill(client, "file:///exact/through.py", "10")
    assert texts(last) == [" + 20"]  # the fill made for "through = " went on; what was typed since is cut off
    outcomes = [field_of(s, "outcome") for s in statuses]
    assert sorted(outcomes) == ["cancelled", "cancelled", "through"]
    through = statuses[outcomes.index("through")]
    assert field_of(through, "cache_hit") is True and field_of(through, "steps_done") > 2  # the fill ran on
    # no request's work was thrown away: the cancelled ones stopped nothing
    assert all(field_of(s, "steps_done") == 0 for s in statuses if field_of(s, "outcome") == "cancelled")


async def test_keys_typed_through_that_do_not_start_the_suggestion_get_their_own_fill(client: LanguageClient):
    _, statuses = await type_during_slow_fill(client, "file:///exact/through_other.py", "9")
    cancelled, own = sorted(statuses, key=lambda s: field_of(s, "outcome") != "cancelled")
    assert field_of(cancelled, "outcome") == "cancelled" and field_of(cancelled, "steps_done") == 0  # it went on
    assert field_of(own, "outcome") != "through"  # "10 + 20" does not start with "9"
    assert field_of(own, "cache_hit") is False and field_of(own, "forward_passes") >= 1  # the model filled anew


async def test_keys_typed_in_the_debounce_do_not_restart_it(client: LanguageClient):
    slow_debounce = {**SETTINGS, "completion": {**SETTINGS["completion"], "debounceMs": 1000}}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": slow_debounce}))
    try:
        await asyncio.sleep(0.2)  # the notification is handled before the next request
        # the keys come 0.3 s after the first request, well inside its debounce: they join it
        last, statuses = await type_during_slow_fill(client, "file:///exact/through_debounce.py", "10")
        assert texts(last) == [" + 20"]
        assert sorted(field_of(s, "outcome") for s in statuses) == ["cancelled", "cancelled", "through"]
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": SETTINGS}))
        await asyncio.sleep(0.2)


async def test_with_type_through_off_a_key_stops_the_running_fill(client: LanguageClient):
    off = {**SETTINGS, "completion": {**SETTINGS["completion"], "typeThrough": False}}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": off}))
    try:
        await asyncio.sleep(0.2)  # the notification is handled before the next request
        _, statuses = await type_during_slow_fill(client, "file:///exact/through_off.py", "10")
        stopped = next(s for s in statuses if field_of(s, "outcome") in ("changed", "cancelled", "superseded")
                       and field_of(s, "steps_done") > 0)
        assert field_of(stopped, "steps_done") < 6  # stopped at a step, long before the end
        assert "through" not in [field_of(s, "outcome") for s in statuses]
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"diffill": SETTINGS}))
        await asyncio.sleep(0.2)


async def test_cancel_request_stops_the_fill_at_its_next_step(client: LanguageClient):
    uri = "file:///exact/cancelled.py"
    open_document(client, uri, "slow = \n")
    seen = len(client.statuses)  # type: ignore[attr-defined]
    params = types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=0, character=7))
    future = client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="cancel-me")
    await asyncio.sleep(fake_engine.SLOW_STEP_SECONDS * 3)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="cancel-me"))
    with pytest.raises(Exception):  # noqa: B017 - pygls answers with a RequestCancelled error
        await asyncio.wait_for(asyncio.wrap_future(future), WAIT)
    status = await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION)
    assert field_of(status, "outcome") == "cancelled"
    assert field_of(status, "steps_done") < 24
    assert texts(await inline(client, "file:///exact/add.py", 1, 11)) == ["a + b"]  # still serving


async def test_rewrite_of_a_selection_is_a_versioned_edit_that_keeps_the_file_parseable(client: LanguageClient):
    uri = "file:///exact/rewrite.py"
    text = "def sub(a, b):\n    return a + b\n"
    open_document(client, uri, text, version=3)
    selection = types.Range(start=types.Position(1, 11), end=types.Position(1, 16))
    actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=selection,
        context=types.CodeActionContext(diagnostics=[]))), WAIT)
    rewrite = next(a for a in actions if a.title.startswith("Rewrite selection"))
    assert rewrite.kind == types.CodeActionKind.RefactorRewrite
    resolved = await asyncio.wait_for(client.code_action_resolve_async(rewrite), WAIT)
    new_text = apply_workspace_edit(text, uri, resolved.edit, encoding(client))
    assert new_text == "def sub(a, b):\n    return a - b\n"
    assert problems(new_text) == []
    if resolved.edit.document_changes:
        assert resolved.edit.document_changes[0].text_document.version == 3


async def test_rewrite_command_with_an_instruction_applies_its_edit(client: LanguageClient):
    uri = "file:///exact/instruction.py"
    text = "def add(a, b):\n    return a - b\n"
    open_document(client, uri, text)
    selection = {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 16}}
    edit = await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="diffill.rewrite", arguments=[uri, selection, "make it a product"])), WAIT)
    assert edit is not None
    for _ in range(100):
        if client.applied_edits:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.05)
    applied = apply_workspace_edit(text, uri, client.applied_edits[-1], encoding(client))  # type: ignore[attr-defined]
    assert applied == "def add(a, b):\n    return a * b\n"


async def test_refine_keeps_the_tokens_the_model_is_sure_of(client: LanguageClient):
    uri = "file:///exact/refine.py"
    text = "def sub(a, b):\n    return a * b\n"
    open_document(client, uri, text)
    selection = {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 16}}
    edit = await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="diffill.refine", arguments=[uri, selection])), WAIT)
    edit = edit if isinstance(edit, types.WorkspaceEdit) else None
    if edit is None:  # the command's result comes back as plain JSON: look at what the server applied
        edit = client.applied_edits[-1]  # type: ignore[attr-defined]
    assert apply_workspace_edit(text, uri, edit, encoding(client)) == "def sub(a, b):\n    return a - b\n"


async def test_quick_fix_adds_the_missing_closing_bracket(client: LanguageClient):
    uri = "file:///exact/bracket.py"
    text = "x = foo(1, 2\ny = 3\n"
    open_document(client, uri, text)
    for _ in range(WAIT * 20):
        if client.diagnostics.get(uri):
            break
        await asyncio.sleep(0.05)
    diagnostics = client.diagnostics[uri]
    bracket = next(d for d in diagnostics if d.message == "unclosed '('")
    actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=bracket.range,
        context=types.CodeActionContext(diagnostics=[bracket]))), WAIT)
    fixes = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert len(fixes) == 1
    fixed = apply_workspace_edit(text, uri, fixes[0].edit, encoding(client))
    assert fixed == "x = foo(1, 2)\ny = 3\n"
    assert problems(fixed) == []


async def test_no_quick_fix_is_offered_when_the_model_cannot_repair(client: LanguageClient):
    uri = "file:///exact/unfixable.py"
    text = "z = bar(1, 2\nw = 4\n"  # no rule: the model writes nothing useful here
    open_document(client, uri, text)
    for _ in range(WAIT * 20):
        if client.diagnostics.get(uri):
            break
        await asyncio.sleep(0.05)
    diagnostics = list(client.diagnostics[uri])
    actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diagnostics[0].range,
        context=types.CodeActionContext(diagnostics=diagnostics))), WAIT)
    assert not [a for a in actions or [] if a.kind == types.CodeActionKind.QuickFix]


async def test_fill_here_replaces_a_placeholder_body(client: LanguageClient):
    uri = "file:///exact/placeholder.py"
    text = "def mean(values):\n    pass\n"
    open_document(client, uri, text)
    actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=types.Position(1, 5), end=types.Position(1, 5)),
        context=types.CodeActionContext(diagnostics=[]))), WAIT)
    fill = next(a for a in actions if a.title.startswith("Fill here"))
    resolved = await asyncio.wait_for(client.code_action_resolve_async(fill), WAIT)
    assert apply_workspace_edit(text, uri, resolved.edit, encoding(client)) == (
        "def mean(values):\n    return sum(values) / len(values)\n")


async def test_an_edit_for_an_old_version_is_refused(client: LanguageClient):
    uri = "file:///exact/outdated.py"
    text = "def slow_rewrite():\n    return None\n"
    open_document(client, uri, text, version=1)
    seen = len(client.statuses)  # type: ignore[attr-defined]
    selection = {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 15}}
    running = asyncio.ensure_future(client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="diffill.rewrite", arguments=[uri, selection])))
    await asyncio.sleep(fake_engine.SLOW_STEP_SECONDS * 3)
    change_document(client, uri, "def slow_rewrite():\n    return None  # edited\n", 2)
    assert await asyncio.wait_for(running, WAIT) is None
    status = await status_after(client, seen, types.WORKSPACE_EXECUTE_COMMAND)
    assert field_of(status, "outcome") == "changed"
    # an action offered for version 1, resolved now that the document is at version 2: no edit
    stale = types.CodeAction(title="Rewrite selection (diffill)", kind=types.CodeActionKind.RefactorRewrite, data={
        "diffill": "rewrite", "uri": uri, "version": 1, "instruction": None,
        "range": {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 15}}})
    resolved = await asyncio.wait_for(client.code_action_resolve_async(stale), WAIT)
    assert resolved.edit is None


async def test_debug_info_says_torch_was_not_loaded_at_initialize(client: LanguageClient):
    info = await debug_info(client)
    assert field_of(info, "torch_loaded_at_initialize") is False
    assert field_of(info, "torch_loaded") is True  # the model has loaded since

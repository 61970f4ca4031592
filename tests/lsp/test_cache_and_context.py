"""The suggestion cache (typed-ahead, LRU), the cursor windows and the extra context from other documents."""

from __future__ import annotations

from lsprotocol import types

from lsp_server.actions import REWRITE, Editor, EditRequest, placeholder_at
from lsp_server.cache import CacheKey, SuggestionCache
from lsp_server.context import as_comments, cursor_at, similar_chunks, typed_at
from lsp_server.scheduler import CHANGED, FILL, SUPERSEDED, Scheduler


def key(document: str, flavour: str = "python") -> CacheKey:
    return CacheKey.of(cursor_at(document.replace("|", ""), document.index("|")), flavour)


def test_typing_the_start_of_a_suggestion_finds_the_rest():
    cache = SuggestionCache()
    cache.store(key("def f(a, b):\n    return |\n"), ["a + b", "b + a"])
    assert cache.lookup(key("def f(a, b):\n    return |\n")) == ["a + b", "b + a"]
    assert cache.lookup(key("def f(a, b):\n    return a |\n")) == ["+ b"]
    assert cache.lookup(key("def f(a, b):\n    return a + b|\n")) is None  # nothing left to suggest
    assert cache.lookup(key("def f(a, b):\n    return c|\n")) is None  # typed something else


def test_typed_at_finds_only_text_typed_at_the_cursor_on_its_line():
    before = "x = \ny = 2\n"
    assert typed_at(before, 4, "x = 1 +\ny = 2\n", 64) == "1 +"
    assert typed_at(before, 4, before, 64) == ""  # nothing typed yet
    assert typed_at(before, 4, "x = 1\n\ny = 2\n", 64) is None  # a line break: the fill's line is over
    assert typed_at(before, 4, "x = 1\ny = 3\n", 64) is None  # a change after the cursor
    assert typed_at(before, 4, "z = 1\ny = 2\n", 64) is None  # a change before it
    assert typed_at(before, 4, "x =\ny = 2\n", 64) is None  # a deletion
    assert typed_at(before, 4, "x = 12345\ny = 2\n", 4) is None  # more than the limit


def test_a_change_elsewhere_or_another_language_misses():
    cache = SuggestionCache()
    cache.store(key("def f(a, b):\n    return |\n"), ["a + b"])
    assert cache.lookup(key("def g(a, b):\n    return |\n")) is None
    assert cache.lookup(key("def f(a, b):\n    return |\n# end\n")) is None
    assert cache.lookup(key("def f(a, b):\n    return |\n", flavour="ruby")) is None


def test_the_least_recently_used_entry_goes_first():
    cache = SuggestionCache(entries=2)
    for name in "abc":
        cache.store(key(f"{name} = |\n"), [name])
    assert len(cache) == 2
    assert cache.lookup(key("a = |\n")) is None and cache.lookup(key("c = |\n")) == ["c"]


def test_large_documents_are_cut_to_windows_of_whole_lines_that_typing_does_not_move():
    document = "x = 1\n" * 50_000
    cursor = cursor_at(document, 150_000, window=1000)
    assert cursor.prefix.startswith("x = 1\n") and len(cursor.prefix) <= 1000
    assert cursor.suffix.endswith("\n") and len(cursor.suffix) <= 1000
    typed = document[:150_003] + "abc" + document[150_003:]
    before, after = cursor_at(document, 150_003, 1000), cursor_at(typed, 150_006, 1000)
    assert CacheKey.of(before, "").digest == CacheKey.of(after, "").digest


def test_multi_line_only_at_a_line_end():
    assert cursor_at("x = foo(\n", 8).around.multiline
    assert cursor_at("x = foo(  \n", 8).around.multiline
    assert not cursor_at("x = foo()\n", 8).around.multiline


def test_similar_chunks_of_other_documents_become_comments():
    cursor = cursor_at("from geometry import area_of_circle\nradius = 2\nresult = area_of_circle(", 71)
    others = [("file:///geometry.py", "import math\n\ndef area_of_circle(radius):\n    return math.pi * radius ** 2\n"),
              ("file:///unrelated.py", "print('hello')\n")]
    chunks = similar_chunks(others, cursor, chunk_lines=8, limit=3)
    assert [c.uri for c in chunks] == ["file:///geometry.py"]
    assert as_comments(chunks, "python").startswith("# from geometry.py:\n# import math\n")
    assert as_comments(chunks, None) == ""  # no comment syntax known: no extra context


def test_a_comment_never_continues_onto_the_code():
    chunks = similar_chunks([("file:///m.h", "#define AREA(r) \\\n  (r * r)\n")], cursor_at("int a = AREA(", 13), 8, 1)
    assert chunks
    assert all(not line.endswith("\\") for line in as_comments(chunks, "c").split("\n"))


def test_a_newer_ticket_supersedes_and_a_change_cancels():
    scheduler = Scheduler()
    first = scheduler.issue("file:///a.py", FILL, 1)
    second = scheduler.issue("file:///a.py", FILL, 1)
    other = scheduler.issue("file:///b.py", FILL, 1)
    assert first.reason == SUPERSEDED and not second.cancelled and not other.cancelled
    assert first.on_step(None) is False and second.on_step(None) is True
    scheduler.cancel_document("file:///a.py", CHANGED)
    assert second.reason == CHANGED and not other.cancelled


def test_placeholders_inside_functions_only():
    assert placeholder_at("def f(a):\n    pass\n", 1) == (14, 18)
    assert placeholder_at("class A:\n    pass\n", 1) is None
    assert placeholder_at("def f(a):\n    x = 1\n    # TODO: the rest\n", 2) is not None
    assert placeholder_at("fn main() {\n    todo!()\n}\n", 1) is not None
    assert placeholder_at("int f(int a)\n{\n    // TODO\n}\n", 2) is not None
    assert placeholder_at("x = 1\n", 5) is None


def test_clients_without_lazy_edits_get_a_command_whose_arguments_name_the_range():
    class NoResolve:
        def client_supports_resolve(self, prop: str) -> bool:
            return False

    selection = types.Range(start=types.Position(1, 4), end=types.Position(1, 9))
    action = Editor(NoResolve())._lazy(EditRequest(REWRITE, "file:///a.py", selection, 3))  # type: ignore[arg-type]
    assert action.edit is None and action.data is None
    assert action.command.command == "diffill.rewrite"
    request = EditRequest.from_arguments(REWRITE, action.command.arguments)
    assert request == EditRequest(REWRITE, "file:///a.py", selection)

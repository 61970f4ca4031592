"""Suggestions at the cursor, for ghost text and completion items: from the cache, or from the model.

A request goes through these steps, and stops at the first that answers:

1. the position must be inside the document, the language enabled, and the model loaded (else nothing: a request
   that arrives while the model loads gets an empty answer at once, never an error or a wait);
2. the cache: the same context, or the user has typed the start of a suggestion (no model call);
3. a computation already running for the same document, version and position (VS Code asks for ghost text and
   completion items at once) is joined rather than started again;
4. otherwise the model: a ticket for the document (superseding the previous request's), a short debounce, then a
   fill on the model thread, tidied (`postprocess`) and gated again against the real document.

The answer is dropped when the document changed while the model worked; the suggestions stay in the cache, where
the next request (typically typed-ahead) finds them.

Typing through (`completion.typeThrough`): keys typed at the cursor of a fill (characters inserted there, no line
break) neither supersede nor outdate it, in its debounce or on the model. It runs to its end and keeps its
suggestions in the cache, and the request of the latest key waits for it and answers with the rest of each
suggestion that starts with what was typed since (outcome `through`); when none does, that request starts its own
fill. Without it a user typing faster than a fill takes stops every fill before it ends (and one typing faster than
the debounce never starts one), and sees ghost text only after a pause. The debounce so counts from the first key of
a burst typed at one cursor; any other change still restarts it.

Once ghost text is shown, the user's next request is likely to come right after accepting it (Tab, then the editor
asks again at the end of the inserted text). With `completion.prefetchAccepted` that fill is started in the
background `completion.prefetchDelayMs` after the ghost text is shown (a key in the meantime stops it before it holds
the model thread, where the next key's fill would wait for its step; the request after Tab starts it at once), on
the "prefetch" lane of the scheduler: the document as it will be with the first suggestion
inserted, at the cursor after it. Its suggestions go into the cache, where that request finds them; a request for
the same context that arrives while it still runs waits for it. Any other model work supersedes it, and a change of
the document that is not that acceptance cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from infill_engine import syntax
from infill_engine.request import Candidate, InfillRequest
from lsp_server import conversion, postprocess, status
from lsp_server.cache import CacheKey, typed_ahead
from lsp_server.context import Cursor, Snapshot, as_comments, cursor_at, similar_chunks, typed_at
from lsp_server.scheduler import CANCELLED, CHANGED, FILL, PREFETCH, Ticket
from lsp_server.settings import Settings

if TYPE_CHECKING:
    from infill_engine.interface import Engine
    from lsp_server.server import DiffillServer

logger = logging.getLogger(__name__)
_WORD = re.compile(r"[A-Za-z0-9_]*$")
TYPE_THROUGH_CHARS = 64  # characters typed at a running fill's cursor, at most, for it to go on (typing through)


@dataclass(frozen=True)
class Suggestions:
    """What to show at a cursor."""

    texts: list[str]  # the fills, best first, each passing the syntax gate
    cursor: Cursor
    position: types.Position  # the cursor as an LSP position (clamped into its line)
    word_range: types.Range  # the identifier before the cursor, which completion items replace
    word: str


@dataclass
class FillOutcome:
    """What a fill job returns from the model thread."""

    texts: list[str]
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FillKind:
    """How a request's fill is made: its canvases, whether it must write more than whitespace, its time budget."""

    candidates: int
    require_content: bool
    budget_ms: int | None = None

    @classmethod
    def of(cls, settings: Settings, asked: bool) -> FillKind:
        """The kind of fill a request gets: `asked` when the user asked for suggestions (completion items, or ghost
        text invoked by a key), else ghost text while typing."""
        completion = settings.completion
        content = completion.require_content == "always" or (completion.require_content == "asked" and asked)
        if asked:
            return cls(completion.candidates, content, completion.asked_budget_ms)
        return cls(completion.automatic_candidates, content, completion.budget_ms)

    def cache_key(self, cursor: Cursor, language: str | None) -> CacheKey:
        """Where this kind's suggestions at `cursor` are kept: the context, the language and the kind."""
        return CacheKey.of(cursor, f"{language or ''}:{self.candidates}{'+content' if self.require_content else ''}")


@dataclass
class _Computation:
    """A fill running for a document, version and position, which a second identical request can join, and a
    request for the same document with text typed at its cursor since can wait for (typing through)."""

    key: tuple[str, int | None, int, FillKind]  # uri, version, cursor offset, kind of fill
    text: str  # the document it fills
    settings: Settings
    ticket: Ticket
    task: asyncio.Task[FillOutcome | None]
    waiters: int = 0
    _typed: tuple[int | None, str | None] | None = None  # the last answer of `typed_since`: (version, typed)

    def typed_since(self, document: Snapshot) -> str | None:
        """What was typed at the fill's cursor to make `document`; None when it changed otherwise, or when typing
        through is off. Compared once per version (a key asks from its change, its cancel and its request)."""
        if not self.settings.completion.type_through:
            return None
        if self._typed is None or self._typed[0] != document.version or document.version is None:
            self._typed = (document.version, typed_at(self.text, self.key[2], document.text, TYPE_THROUGH_CHARS))
        return self._typed[1]


def gated_variants(fills: list[str | Candidate], cursor: Cursor, language: str | None) -> list[str]:
    """For each fill, its first tidied variant that adds no syntax problem to the document window; no repeats.

    A fill given as the engine's `Candidate` of this very document whose gate passed it, with the checker this
    process has for the language, passes as it is without a second check (a shared engine gated it in its own
    process, where its parse of the document is cached; here it would cost a parse of the new version)."""
    document = cursor.prefix + cursor.suffix
    at = len(cursor.prefix)
    kept: list[str] = []
    for fill in fills:
        text = fill if isinstance(fill, str) else fill.text
        passed = not isinstance(fill, str) and fill.gate is not None and fill.gate.ok and (
            fill.gate.checker == syntax.checker_for(language))
        for variant in postprocess.variants(text, cursor.around):
            if (passed and variant == text) or syntax.check_fill(document, at, at, variant, language).ok:
                if variant not in kept:
                    kept.append(variant)
                break
    return kept


def fill_job(
    engine: Engine,
    cursor: Cursor,
    language: str | None,
    settings: Settings,
    others: list[tuple[str, str]],
    ticket: Ticket,
    kind: FillKind = FillKind(1, False, None),
) -> FillOutcome:
    """On the model thread: fill at the cursor as `kind` says and keep the tidied fills that pass."""
    around = cursor.around
    max_tokens = settings.completion.max_tokens if around.multiline else settings.completion.line_tokens
    extra = ""
    if others and len(cursor.prefix) < 2 * settings.context.prefix_tokens:  # the model has room for more context
        chunks = similar_chunks(others, cursor, settings.context.chunk_lines, settings.context.max_chunks)
        extra = as_comments(chunks, language, around.newline)
    request = InfillRequest(
        prefix=extra + cursor.prefix, suffix=cursor.suffix, language=language, max_tokens=max_tokens,
        candidates=kind.candidates, single_line=not around.multiline, budget_ms=kind.budget_ms,
        require_content=kind.require_content,
    )
    try:
        result = engine.fill(request, on_step=ticket.on_step, document=ticket.key)
    except ValueError as error:  # a request this model cannot take (max_tokens too large for it)
        logger.warning("no fill: %s", error)
        return FillOutcome([])
    # Rejected fills too: the gate judged the raw span, and tidying (one line mid-line, no repeated bracket) may
    # be what it needed. The engine's verdicts hold for this document only where nothing went before the prefix.
    fills = [*(result.candidates if not extra else [c.text for c in result.candidates]),
             *(c.text for c in result.rejected)]
    return FillOutcome(gated_variants(fills, cursor, language), result.stats.as_dict())


@dataclass
class _Prefetch:
    """A fill running in the background for the document as it will be once the ghost text shown is accepted."""

    text: str  # the document with the first suggestion inserted
    key: CacheKey  # the context of the cursor after the suggestion, where its suggestions are stored
    ticket: Ticket
    task: asyncio.Task[None]
    wanted: asyncio.Event  # set when a request waits for it: its delay ends at once


class Completer:
    """Answers ghost-text and completion requests."""

    def __init__(self, ls: DiffillServer) -> None:
        self.ls = ls
        self._running: dict[str, _Computation] = {}  # by uri
        self._prefetches: dict[str, _Prefetch] = {}  # by uri
        self.prefetched = 0  # prefetch fills whose suggestions went into the cache

    async def suggest(
        self, document: Snapshot, position: types.Position, method: str, asked: bool = True
    ) -> Suggestions | None:
        """Suggestions at `position`, or None (the `diffill/status` notification says why).

        `asked`: the user asked for suggestions (completion items, or ghost text invoked by a key), which get
        `completion.candidates` canvases; ghost text while typing gets `completion.automaticCandidates`; see
        `FillKind.of`.
        """
        ls, settings = self.ls, self.ls.settings
        report = status.Report(method, document.uri)
        index = conversion.line_index(document.text)
        offset = index.offset_at(position, ls.encoding)
        if offset is None:
            return self._done(report, "invalid")
        if not settings.completion.enabled or not settings.enabled_for(document.language_id):
            return self._done(report, "disabled")
        cursor = cursor_at(document.text, offset)
        word = _WORD.search(cursor.around.line_before).group()  # type: ignore[union-attr]
        word_range = index.range_of(offset - len(word), offset, ls.encoding)
        found = _Found(cursor, index.position_at(offset, ls.encoding), word_range, word)
        kind = FillKind.of(settings, asked)
        key = kind.cache_key(cursor, document.language)
        try:
            cached = ls.cache.lookup(key) or await self._prefetched(document.uri, key)
        except asyncio.CancelledError:  # $/cancelRequest while it waited for the prefetch
            self._done(report, CANCELLED)
            raise
        if cached:
            report.cache_hit = True
            self._prefetch_accepted(document, cursor, cached[0], method, settings)
            return self._done(report, "cache", found.suggestions(cached))
        if not ls.host.ready:
            return self._done(report, "not_ready")
        if ls.document_version(document.uri) != document.version:  # changed while it waited for a prefetch that
            return self._done(report, CHANGED)  # was then superseded: the newer request's fill must not be
        computation, typed = self._join_or_start(document, cursor, settings, kind, key)
        outcome = await self._wait(computation, report)
        if typed is not None:
            # typed through: the fill was for the cursor before the keys typed since; the rest of what starts with
            # them is the answer, else this request's own fill
            if ls.document_version(document.uri) != document.version:  # a newer key's request takes it from here:
                return self._done(report, CHANGED)  # none of the fill's work was this request's, or lost
            texts = typed_ahead(outcome.texts, typed) if outcome is not None else []
            if texts:
                report.cache_hit = True
                self._prefetch_accepted(document, cursor, texts[0], method, settings)
                return self._done(report, "through", found.suggestions(texts), ticket=computation.ticket)
            computation, _ = self._join_or_start(document, cursor, settings, kind, key)
            outcome = await self._wait(computation, report)
        if outcome is None:
            return self._done(report, computation.ticket.reason or CANCELLED, ticket=computation.ticket)
        report.stats = outcome.stats
        if ls.document_version(document.uri) != document.version:
            return self._done(report, CHANGED, ticket=computation.ticket)
        if not outcome.texts:
            return self._done(report, "empty", ticket=computation.ticket)
        self._prefetch_accepted(document, cursor, outcome.texts[0], method, settings)
        return self._done(report, "ok", found.suggestions(outcome.texts), ticket=computation.ticket)

    async def _wait(self, computation: _Computation, report: status.Report) -> FillOutcome | None:
        """The computation's outcome. When the request is cancelled (`$/cancelRequest`) and nobody else waits, the
        fill stops (the report goes out when the model thread lets go), unless the user typed through it."""
        computation.waiters += 1
        try:
            return await asyncio.shield(computation.task)
        except asyncio.CancelledError:
            if computation.waiters == 1 and not self._typed_through(computation):
                computation.ticket.cancel(CANCELLED)
                computation.task.add_done_callback(lambda _: self._done(report, CANCELLED, ticket=computation.ticket))
            else:  # the fill goes on for another request, or for the next key's: none of its work is this one's
                self._done(report, CANCELLED)
            raise
        finally:
            computation.waiters -= 1

    def types_through(self, uri: str) -> bool:
        """Whether the document is now the running fill's with text typed at its cursor, by a user typing on while
        the model works: the fill goes on (see `completion.typeThrough`)."""
        computation = self._running.get(uri)
        return computation is not None and self._typed_through(computation)

    def _typed_through(self, computation: _Computation) -> bool:
        """Whether the fill is still wanted and the document has since changed only by text typed at its cursor."""
        if computation.task.done() or computation.ticket.cancelled:
            return False
        document = self.ls.snapshot(computation.ticket.uri)
        if document is None or document.version == computation.key[1]:
            return False
        return computation.typed_since(document) is not None

    def is_accepted_state(self, uri: str) -> bool:
        """Whether the document is now as a running prefetch expects it: the ghost text shown was accepted."""
        prefetch = self._prefetches.get(uri)
        if prefetch is None or prefetch.task.done():
            return False
        document = self.ls.snapshot(uri)
        return document is not None and document.text == prefetch.text

    async def _prefetched(self, uri: str, key: CacheKey) -> list[str] | None:
        """The suggestions of a running prefetch for exactly this context, once it is done; None when there is none."""
        prefetch = self._prefetches.get(uri)
        if prefetch is None or prefetch.key != key or prefetch.task.done() or prefetch.ticket.cancelled:
            return None
        prefetch.wanted.set()
        await asyncio.shield(prefetch.task)
        return self.ls.cache.lookup(key)

    def _prefetch_accepted(
        self, document: Snapshot, cursor: Cursor, shown: str, method: str, settings: Settings
    ) -> None:
        """Start filling, in the background, where the cursor will be once the ghost text `shown` is accepted."""
        if method != types.TEXT_DOCUMENT_INLINE_COMPLETION or not settings.completion.prefetch_accepted:
            return
        if not self.ls.host.ready or self.ls.settings is not settings or not shown:
            return
        accepted = document.text[: cursor.offset] + shown + document.text[cursor.offset :]
        after = cursor_at(accepted, cursor.offset + len(shown))
        kind = FillKind.of(settings, asked=False)  # the request after Tab is one while typing
        key = kind.cache_key(after, document.language)
        running = self._prefetches.get(document.uri)
        if running is not None and running.key == key and not running.task.done() and not running.ticket.cancelled:
            return
        if self.ls.cache.lookup(key) is not None:
            return
        ticket = self.ls.scheduler.issue(document.uri, PREFETCH, None)
        others = self.ls.other_documents(document.uri) if settings.context.other_documents else []
        wanted = asyncio.Event()
        task = asyncio.ensure_future(
            self._prefetch(ticket, key, after, document.language, settings, others, wanted, kind))
        prefetch = _Prefetch(accepted, key, ticket, task, wanted)
        self._prefetches[document.uri] = prefetch
        task.add_done_callback(lambda _: self._forget_prefetch(document.uri, prefetch))

    async def _prefetch(
        self, ticket: Ticket, key: CacheKey, cursor: Cursor, language: str | None, settings: Settings,
        others: list[tuple[str, str]], wanted: asyncio.Event, kind: FillKind,
    ) -> None:
        """The prefetch itself, after `completion.prefetchDelayMs` unless a request wants it sooner: a fill like a
        request's, kept in the cache."""
        delay = settings.completion.prefetch_delay_ms / 1000
        if delay:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wanted.wait(), delay)
        outcome = await self._compute(ticket, cursor, language, settings, others, kind)
        if outcome is not None and outcome.texts and self.ls.settings is settings:
            self.ls.cache.store(key, outcome.texts)
            self.prefetched += 1
            logger.debug("prefetched %d suggestion(s) after the ghost text of %s", len(outcome.texts), ticket.uri)

    def _forget_prefetch(self, uri: str, prefetch: _Prefetch) -> None:
        if self._prefetches.get(uri) is prefetch:
            del self._prefetches[uri]
        self.ls.scheduler.finish(prefetch.ticket)

    def _join_or_start(
        self, document: Snapshot, cursor: Cursor, settings: Settings, kind: FillKind, cache_key: CacheKey
    ) -> tuple[_Computation, str | None]:
        """The running computation for this exact request; or the one this request's keys were typed through, with
        the text typed since; or a new one that supersedes the document's last."""
        key = (document.uri, document.version, cursor.offset, kind)
        running = self._running.get(document.uri)
        if running is not None and not running.task.done() and not running.ticket.cancelled:
            if running.key == key:
                return running, None
            if running.key[3] == kind:
                typed = running.typed_since(document)
                if typed is not None and running.key[2] + len(typed) == cursor.offset:
                    return running, typed
        ticket = self.ls.scheduler.issue(document.uri, FILL, document.version)
        others = self.ls.other_documents(document.uri) if settings.context.other_documents else []
        task = asyncio.ensure_future(
            self._fill_and_keep(ticket, cache_key, cursor, document.language, settings, others, kind))
        computation = _Computation(key, document.text, settings, ticket, task)
        self._running[document.uri] = computation
        task.add_done_callback(lambda _: self._forget(computation))
        return computation, None

    async def _fill_and_keep(
        self, ticket: Ticket, cache_key: CacheKey, cursor: Cursor, language: str | None, settings: Settings,
        others: list[tuple[str, str]], kind: FillKind,
    ) -> FillOutcome | None:
        """A request's fill, its suggestions kept in the cache (also when nobody waits for them any more)."""
        outcome = await self._compute(ticket, cursor, language, settings, others, kind)
        if outcome is not None and self.ls.settings is settings:  # a change of settings empties the cache
            self.ls.cache.store(cache_key, outcome.texts)
        return outcome

    def _forget(self, computation: _Computation) -> None:
        if self._running.get(computation.ticket.uri) is computation:
            del self._running[computation.ticket.uri]
        self.ls.scheduler.finish(computation.ticket)

    async def _compute(
        self, ticket: Ticket, cursor: Cursor, language: str | None, settings: Settings, others: list[tuple[str, str]],
        kind: FillKind,
    ) -> FillOutcome | None:
        """Debounce, then fill on the model thread; None when superseded or cancelled first."""
        if settings.completion.debounce_ms:
            await asyncio.sleep(settings.completion.debounce_ms / 1000)
        if ticket.cancelled:
            return None
        job = partial(fill_job, cursor=cursor, language=language, settings=settings, others=others, ticket=ticket,
                      kind=kind)
        return await self.ls.host.run(job, ticket)

    def _done(
        self, report: status.Report, outcome: str, suggestions: Suggestions | None = None, ticket: Ticket | None = None
    ) -> Suggestions | None:
        """Send the request's status and return its answer."""
        report.outcome = outcome
        report.items = len(suggestions.texts) if suggestions else 0
        if ticket is not None:
            report.steps_done = ticket.steps
            report.model_started = ticket.started
        status.send(self.ls, report)
        return suggestions


@dataclass(frozen=True)
class _Found:
    """Where suggestions go, computed before the answer is known."""

    cursor: Cursor
    position: types.Position
    word_range: types.Range
    word: str

    def suggestions(self, texts: list[str]) -> Suggestions:
        return Suggestions(list(texts), self.cursor, self.position, self.word_range, self.word)

"""Tickets: which model work is still wanted.

Every request that needs the model takes a ticket for its document and lane ("fill" for ghost text and completion
items, "edit" for code actions). Taking a ticket cancels the previous ticket of the same document and lane: the
newer request supersedes the older one, which stops at its next denoising step (the step callback asks the ticket)
and answers with nothing. A change to the document cancels all of its tickets, since what they compute would be an
edit of a version that no longer exists; `$/cancelRequest` cancels the request's own ticket.

A third lane, "prefetch", is work for a state the user may reach next (the ghost text shown, accepted: see
`completion.Completer`). It comes last: a ticket of any other lane, for any document, cancels every prefetch, and a
change to the document spares it only when the change is the one it was made for (`cancel_document`'s `spare`).
A change also spares the running fill when it only typed text at the fill's cursor (typing through, see
`completion.Completer`).

Local servers in other tools pile up stale work because nothing like this exists between the editor and the model
(Neovim's built-in inline completion cancels only on leaving insert mode); here the server does it itself.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

FILL = "fill"  # inline completion and completion items
EDIT = "edit"  # rewrite, refine, fill here, quick fixes
PREFETCH = "prefetch"  # the fill after the ghost text shown is accepted, made before it is

SUPERSEDED = "superseded"
CANCELLED = "cancelled"
CHANGED = "changed"
CLOSED = "closed"
SHUTDOWN = "shutdown"
RELOAD = "reload"  # the model is being replaced


@dataclass(eq=False)
class Ticket:
    """One request's claim on the model, which the server can withdraw."""

    uri: str
    lane: str
    version: int | None  # the document version the work is for
    reason: str | None = None  # why it was cancelled; None while it is wanted
    steps: int = 0  # denoising steps run so far
    started: bool = False  # the model thread took the work up (its context encoded, whatever happens next)

    @property
    def key(self) -> str:
        """The document and lane: a shared engine lets a newer request with the same key supersede this one."""
        return f"{self.uri}#{self.lane}"

    @property
    def cancelled(self) -> bool:
        """Whether the work is no longer wanted."""
        return self.reason is not None

    def cancel(self, reason: str) -> None:
        """Withdraw the ticket (the first reason sticks)."""
        if self.reason is None:
            self.reason = reason

    def on_step(self, view: Any) -> bool:
        """The engine's per-step callback (on the model thread): False stops the fill."""
        self.steps += 1
        return self.reason is None


class Scheduler:
    """The current ticket of every document and lane."""

    def __init__(self) -> None:
        self._current: dict[tuple[str, str], Ticket] = {}

    def issue(self, uri: str, lane: str, version: int | None) -> Ticket:
        """A ticket for new work; the previous one of the same document and lane is superseded, and so is every
        prefetch when the new work is not one."""
        previous = self._current.get((uri, lane))
        if previous is not None:
            previous.cancel(SUPERSEDED)
        if lane != PREFETCH:
            for key in [key for key in self._current if key[1] == PREFETCH]:
                self._current.pop(key).cancel(SUPERSEDED)
        ticket = Ticket(uri, lane, version)
        self._current[(uri, lane)] = ticket
        return ticket

    def finish(self, ticket: Ticket) -> None:
        """Forget a ticket whose work is done."""
        if self._current.get((ticket.uri, ticket.lane)) is ticket:
            del self._current[(ticket.uri, ticket.lane)]

    def cancel_document(self, uri: str, reason: str, spare: Collection[str] = ()) -> None:
        """Cancel every ticket of a document (it changed or closed), except those of the lanes `spare`."""
        for key in [key for key in self._current if key[0] == uri and key[1] not in spare]:
            self._current.pop(key).cancel(reason)

    def cancel_all(self, reason: str) -> None:
        """Cancel everything (shutdown)."""
        for ticket in self._current.values():
            ticket.cancel(reason)
        self._current.clear()

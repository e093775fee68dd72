"""Responses sent off the thread that makes them, each row's in order, merged while they wait.

A Python-backend stub's `send` is a round trip to the server process (the response is copied into shared
memory, then the stub waits for the server to take it): about a fifth of a millisecond. The threads that make
responses serve many rows at once (the engine's thread steps every row; the BLS's stream reader detokenizes
every request's tokens), so a send on them holds up every row. Each row hands its output to its `Outbox`
instead, and a few `Senders` threads send it:

- a row's sends never overlap and keep their order, its last step last: one sender at a time holds a row,
  and a row is in the senders' queue at most once;
- what a row gets while its send waits in the queue or is in flight goes out with its next send: a server
  slower than the producer gets fewer, longer responses instead of a backlog that delays every token behind
  it, and an idle one gets each piece as it comes (vLLM's output collector merges a request's outputs the
  same way);
- with an `interval`, a row's first piece goes at once and later ones once `interval` units of them wait
  (the engine's `stream_interval`); the pieces still under it at the end go to the row's last step;
- a send that fails, or a response that cannot be built, marks the row `failed`: nothing more of it is sent,
  and its last step ends it with an error, never a stream with a gap;
- the queue holds at most `depth` rows; past it the producer waits, so a server slower than the engine slows
  the engine (as a send on its own thread did) instead of queueing without bound;
- `Senders(0, ...)` has no threads: every send runs on the thread that asks for it. So does one after `close`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Piece = TypeVar("Piece")


class Senders:
    """A few threads that give the queued rows their turns, oldest first; a row that wants another turn goes to
    the back, behind the rows that waited (no row keeps a sender while others wait)."""

    def __init__(self, threads: int, depth: int, name: str):
        if threads < 0 or depth < 1:
            raise ValueError(f"senders need threads >= 0 and depth >= 1, got {threads} and {depth}")
        self._depth = depth
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # a row was queued, or the senders close
        self._room = threading.Condition(lock)  # a row left the queue, or the senders close
        self._queue: collections.deque[Outbox] = collections.deque()
        self._closed = threads == 0  # closed: turns run on the caller's thread
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=True)
                         for index in range(threads)]
        for thread in self._threads:
            thread.start()

    def schedule(self, outbox: Outbox) -> None:
        """Queue a row that is neither queued nor held, waiting while the queue is full; with no thread to take
        it, its turns run here."""
        with self._room:
            while len(self._queue) >= self._depth and not self._closed:
                self._room.wait()
            if not self._closed:
                self._queue.append(outbox)
                self._work.notify()
                return
        while outbox.take_turn():
            pass

    def close(self, timeout_s: float) -> None:
        """Give the queued rows their turns, then end the threads (waiting up to `timeout_s` in all); rows
        scheduled later take their turns on the caller's thread."""
        with self._work:
            self._closed = True
            self._work.notify_all()
            self._room.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))

    def _serve(self) -> None:
        while (outbox := self._next()) is not None:
            if outbox.take_turn():
                with self._work:  # never waits for room: a sender waiting for itself to make room
                    self._queue.append(outbox)
                    self._work.notify()

    def _next(self) -> Outbox | None:
        """The oldest queued row; None once the senders are closed and the queue is empty."""
        with self._work:
            while not self._queue and not self._closed:
                self._work.wait()
            if not self._queue:
                return None
            self._room.notify()
            return self._queue.popleft()


class Outbox(Generic[Piece]):
    """One row's pieces on their way out, and whether a sender holds the row.

    `add` and `end` run on the thread that makes the row's output; `take_turn` on the one sender that holds the
    row (a queued row counts as held). Every field is guarded by `_lock`; `send` and the last step run outside
    it, one at a time, in order. `failed` is set once, by the sender that saw a send fail: the producer may
    read it without the lock to stop making output for the row.
    """

    def __init__(self, senders: Senders, send: Callable[[list[Piece]], bool], *, interval: int = 1):
        """`send(pieces)`: one response (or a few) made of every piece that waited; False when it was not sent."""
        if interval < 1:
            raise ValueError(f"an outbox's interval must be >= 1, got {interval}")
        self._senders, self._send, self._interval = senders, send, interval
        self._lock = threading.Lock()
        self._pending: list[Piece] = []
        self._pending_size = 0
        self._sent_any = False  # after the first send, pieces wait for `interval`
        self._held = False  # queued for, or held by, a sender
        self._last: Callable[[list[Piece]], None] | None = None
        self.failed = False

    def add(self, piece: Piece, size: int = 1) -> None:
        """A piece of output, `size` units of the interval (a response's tokens, say)."""
        with self._lock:
            if self.failed:  # nothing follows a lost response
                return
            self._pending.append(piece)
            self._pending_size += size
            if self._held or not self._due():
                return  # the sender holding the row takes it on its next turn
            self._held = True
        self._senders.schedule(self)

    def end(self, last: Callable[[list[Piece]], None]) -> None:
        """The row's end: `last(rest)` runs on a sender once every send due before it is done, with the pieces
        no send was due for (none after a failure); it sends the row's last response. No piece follows it."""
        with self._lock:
            self._last = last
            if self._held:
                return
            self._held = True
        self._senders.schedule(self)

    def take_turn(self) -> bool:
        """Called by the sender holding the row: one send of everything due, or the last step. True when the row
        has more to do: another turn, behind the rows that wait."""
        with self._lock:
            if self._due():
                pieces, self._pending, self._pending_size, self._sent_any = self._pending, [], 0, True
                last = None
            elif self._last is not None:  # the row stays held for good: nothing is sent after its end
                last, self._last = self._last, None
                pieces, self._pending, self._pending_size = self._pending, [], 0
            else:
                self._held = False
                return False
        if last is not None:
            self._run_last(last, pieces)
            return False
        self._send_pieces(pieces)
        with self._lock:
            self._held = self._due() or self._last is not None
            return self._held

    def _due(self) -> bool:
        return bool(self._pending) and (not self._sent_any or self._pending_size >= self._interval)

    def _run_last(self, last: Callable[[list[Piece]], None], rest: list[Piece]) -> None:
        try:
            last(rest)
        except Exception:  # noqa: BLE001 - a sender serves other rows too
            logger.exception("could not end a row")

    def _send_pieces(self, pieces: list[Piece]) -> None:
        try:
            sent = self._send(pieces)
        except Exception:  # noqa: BLE001 - a response that could not be built: the row ends with an error
            logger.exception("could not build a row's response")
            sent = False
        if not sent:
            with self._lock:
                self.failed = True
                self._pending, self._pending_size = [], 0

"""Responses built and sent off the engine's thread, in order per row.

A Python-backend stub's `send` is a round trip to the server process (the response is copied into shared
memory, then the stub waits for the server to take it): about a fifth of a millisecond. Sent from the
engine's thread, 128 rows a step cost the engine more time than the step itself. Lanes take the sends off
that thread and overlap them: each row keeps one lane (so its responses stay in order, its last one last),
rows are dealt to lanes in turn, and a lane holds at most `depth` sends, so a server that takes responses
slower than the engine makes them slows the engine (as the synchronous send did) instead of queueing without
bound.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

Post = Callable[[Callable[[], None]], None]  # hands a lane one send to run


class ResponseLanes:
    def __init__(self, lanes: int, depth: int):
        if lanes < 1 or depth < 1:
            raise ValueError(f"response lanes need lanes >= 1 and depth >= 1, got {lanes} and {depth}")
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(lanes)]
        self._turn = itertools.count()
        self._threads = [threading.Thread(target=self._run, args=(work,), name=f"response-lane-{index}",
                                          daemon=True) for index, work in enumerate(self._queues)]
        for thread in self._threads:
            thread.start()

    def lane(self) -> Post:
        """A lane for one row: every send it is given runs after the ones given before it."""
        return self._queues[next(self._turn) % len(self._queues)].put

    def close(self, timeout_s: float) -> None:
        """Run what the lanes hold, then end their threads (waiting up to `timeout_s` for each)."""
        for work in self._queues:
            work.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    @staticmethod
    def _run(work: queue.Queue) -> None:
        while (send := work.get()) is not None:
            try:
                send()
            except Exception:  # noqa: BLE001 - one failed send must not stop the lane serving other rows
                logger.exception("a response lane's send failed")


def run_here(send: Callable[[], None]) -> None:
    """No lane: the send runs on the caller's thread."""
    send()

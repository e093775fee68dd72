"""What the engine tests hand the engine for each request: a sink that records what the engine sends it."""

from __future__ import annotations

import threading


class Sink:
    """Records the streamed tokens, the result and the error; `cancel_after`: asks the engine to cancel once that
    many tokens streamed."""

    def __init__(self, cancel_after: int | None = None):
        self.done, self.streamed, self.result, self.error = threading.Event(), [], None, None
        self.started = threading.Event()  # a first token streamed, or the end
        self.cancel_after = cancel_after

    def scheduled(self):
        pass

    def tokens(self, ids, log_probs, top=None):
        self.streamed += ids
        self.started.set()

    def finish(self, result, error):
        self.result, self.error = result, error
        # The step that ends a stream comes only with finish, so that its response can be flagged final.
        self.final_tokens = result.token_ids[len(self.streamed):] if result else []
        self.started.set()
        self.done.set()

    def cancelled(self):
        return self.cancel_after is not None and len(self.streamed) >= self.cancel_after

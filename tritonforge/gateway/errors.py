"""The gateway's refusal: an error answered as OpenAI's error object, with its HTTP status (its own module: the
request readers of every endpoint raise it)."""

from __future__ import annotations

from ..facts.errors import ERROR_CODES, ErrorKind


class OpenAIError(Exception):
    """An error answered as OpenAI's error object, with its HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = ERROR_CODES[ErrorKind.CLIENT].openai, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

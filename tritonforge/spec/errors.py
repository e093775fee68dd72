"""The errors a request can cause, each naming the field at fault.

`RequestError` is the client's mistake (Triton's INVALID_ARG: HTTP 400, gRPC INVALID_ARGUMENT);
`UnsupportedError` is a valid request this engine cannot serve (UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED);
`ResponseSendError` is the server's side failing to deliver a response (INTERNAL), which ends that request.
`ServerStopping` ends a request that was still running when the stopping server's grace ran out (UNAVAILABLE).
`EngineCallError` is the engine's own error answer to the BLS, passed on verbatim (gRPC carries no code: its
kind is read from the message, `answered_error_kind`); `EngineStreamError`, the BLS's stream to the engine
failing (UNAVAILABLE).
The model.py adapters map them to per-request `TritonError`s; nothing else reaches the client's eyes.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A bad request. The message always starts with the name of the field."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


class UnsupportedError(RequestError):
    """A request the engine understands but does not implement (for example beam search)."""


class ResponseSendError(RuntimeError):
    """A streamed response could not be sent to the caller (Triton's INTERNAL): the request ends with this
    error rather than a stream with a gap."""

    def __init__(self):
        super().__init__("a streamed response could not be sent; the generation was stopped")


class ServerStopping(RuntimeError):
    """The server is stopping and the request did not end within the time it gave open requests
    (UNAVAILABLE): the caller may retry on another server."""

    def __init__(self):
        super().__init__("unavailable: the server is shutting down; the generation was stopped")


class EngineCallError(RuntimeError):
    """The engine answered the BLS's request with this error."""


class EngineStreamError(EngineCallError):
    """The stream that carried the BLS's engine request failed: the server is going away or unreachable."""


# What kind of error another model answered, for a caller that gets only its message (a gRPC stream carries
# no status code): the models answer a bad request with "<field>: <reason>", a full queue or a missing server
# as unavailable, anything else without internals as "internal error".
INVALID, UNAVAILABLE, INTERNAL = "invalid", "unavailable", "internal"
_INTERNAL_SIGNS = ("internal error", "stub process")
_UNAVAILABLE_SIGNS = ("unavailable", "is full", "not ready", "failed to connect", "socket closed")


def answered_error_kind(message: str) -> str:
    lowered = message.lower()
    if any(sign in lowered for sign in _INTERNAL_SIGNS):
        return INTERNAL
    if any(sign in lowered for sign in _UNAVAILABLE_SIGNS):
        return UNAVAILABLE
    return INVALID

"""The errors a request can meet, one kind each, and the one table of what each kind is on every wire.

A `TritonforgeError` carries its `kind` (`ErrorKind`): the client's mistake (`RequestError`, whose message
names the field at fault), a valid request this engine does not serve (`UnsupportedError`), the server unable
to serve it now, so that a retry may succeed (`UnavailableError`: a full queue, a stopping server, the BLS's
stream to the engine gone), or the server failing (`InternalError`: a response it could not send).
`ERROR_CODES` gives each kind its Triton code, gRPC status, HTTP status, OpenAI error type and the CLI's exit
status; the model adapters (`runtime/triton_adapter.to_triton_error`), the OpenAI gateway and the CLI read it,
and nothing else maps an error to a code.

Where only a message comes back (an error inside a gRPC stream carries no status code: the engine's answer to
the BLS, any model's answer to our clients), `answered_kind` reads the kind from it, and `AnsweredError` is such
an answer: our own answers are recognised exactly, Triton's own checks of a request by their wording, and any
other message is the server's failure (INTERNAL), never the client's.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass


class ErrorKind(enum.Enum):
    CLIENT = "client"  # the request is wrong: the client must change it
    UNSUPPORTED = "unsupported"  # a valid request this engine does not serve (beam search, say)
    UNAVAILABLE = "unavailable"  # the server cannot serve it now: the same request may succeed later or elsewhere
    INTERNAL = "internal"  # the server failed: nothing the client sent is at fault


@dataclass(frozen=True)
class ErrorCodes:
    """What one kind of error is called on each wire."""

    triton: str  # pb_utils.TritonError's code (the name of its attribute)
    grpc: str  # the gRPC status Triton answers for that code (grpc.StatusCode's name)
    http: int  # the HTTP status: Triton's, and the OpenAI gateway's
    openai: str  # the OpenAI error object's `type`, as the gateway answers it
    exit_status: int  # the `tritonforge` command's: 2 for what the command line must change, 1 for the rest


ERROR_CODES = {
    ErrorKind.CLIENT: ErrorCodes("INVALID_ARG", "INVALID_ARGUMENT", 400, "invalid_request_error", 2),
    ErrorKind.UNSUPPORTED: ErrorCodes("UNSUPPORTED", "UNIMPLEMENTED", 501, "invalid_request_error", 2),
    ErrorKind.UNAVAILABLE: ErrorCodes("UNAVAILABLE", "UNAVAILABLE", 503, "server_error", 1),
    ErrorKind.INTERNAL: ErrorCodes("INTERNAL", "INTERNAL", 500, "server_error", 1),
}


def grpc_status_kind(status: str) -> ErrorKind | None:
    """The kind of a gRPC status, by its name ("INVALID_ARGUMENT"); None for one outside the table."""
    return next((kind for kind, codes in ERROR_CODES.items() if codes.grpc == status), None)


class TritonforgeError(Exception):
    """An error of a request, of one kind."""

    kind: ErrorKind = ErrorKind.INTERNAL

    @property
    def codes(self) -> ErrorCodes:
        return ERROR_CODES[self.kind]


class RequestError(TritonforgeError, ValueError):
    """A bad request. The message always starts with the name of the field: "<field>: <problem>"."""

    kind = ErrorKind.CLIENT

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


class UnsupportedError(RequestError):
    """A request the engine understands but does not implement (for example beam search)."""

    kind = ErrorKind.UNSUPPORTED


UNAVAILABLE_PREFIX = "unavailable: "


class UnavailableError(TritonforgeError, RuntimeError):
    """The server cannot serve the request now; the same request may succeed later, or on another server.
    The message starts with "unavailable: ", which is how a caller that gets only the message knows it."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, reason: str):
        super().__init__(f"{UNAVAILABLE_PREFIX}{reason}")


class QueueFullError(UnavailableError):
    """The engine's queue is full: the client may retry later."""

    def __init__(self, waiting: int):
        super().__init__(f"the engine queue is full ({waiting} waiting)")


class ServerStopping(UnavailableError):
    """The server is stopping and the request did not end within the time it gave open requests: the caller
    may retry on another server."""

    def __init__(self):
        super().__init__("the server is shutting down; the generation was stopped")


class EngineShuttingDown(UnavailableError):
    """The engine stopped (its model is unloading) with the request still open: another server may serve it."""

    def __init__(self):
        super().__init__("the engine is shutting down")


class EngineStreamError(UnavailableError):
    """The stream that carried the BLS's engine request failed: the server is going away or unreachable."""


# How the model adapters answer an exception that is none of ours: the type's name alone, no internals.
INTERNAL_PREFIX = "internal error: "


class InternalError(TritonforgeError, RuntimeError):
    """The server's side failed; nothing in the request is at fault."""

    kind = ErrorKind.INTERNAL


class ResponseSendError(InternalError):
    """A streamed response could not be sent to the caller: the request ends with this error rather than a
    stream with a gap."""

    def __init__(self):
        super().__init__("a streamed response could not be sent; the generation was stopped")


class AnsweredError(TritonforgeError, RuntimeError):
    """An error another model or server answered, passed on with its message unchanged. Its kind is the one the
    transport carried, where it carried one (a gRPC call's status), else the one its message reads as."""

    def __init__(self, message: str, kind: ErrorKind | None = None):
        super().__init__(message)
        self.kind = kind or answered_kind(message)


class EngineCallError(AnsweredError):
    """The engine answered the BLS's request with this error (over a gRPC stream: the message alone)."""


# --- reading an answered message -------------------------------------------------------------------------------
# Triton's own checks of a request, which name the input at fault (Triton 2.51's core, `infer_request.cc`): a
# wrong data type, shape or input name, a missing input, a batch too large. Triton opens most with the request's
# id in brackets ("[request id: <id_unknown>] "), and a step's error in an ensemble with "in ensemble 'NAME', ".
_TRITON_PREFIXES = re.compile(r"(?:\[request id: [^\]]*\] |in ensemble '[^']*', )*")
_TRITON_REQUEST_CHECKS = re.compile(
    r"inference input '[^']+' data-type is '"
    r"|unexpected shape for input '[^']+' for model '"
    r"|unexpected inference input '[^']+' for model '"
    r"|expected \d+ inputs but got \d+ inputs for model '"
    r"|expected number of inputs between \d+ and \d+ but got \d+ inputs for model '"
    r"|inference request batch-size must be <= \d+ for '")
# Our client errors: "<field>: <reason>", the field an input of one of the models (a row's index may follow it,
# "text_input[1]"), as `RequestError` writes them.
_FIELD = re.compile(r"(?P<field>[A-Za-z_][A-Za-z0-9_]*)(?:\[\d+\])*: ")
# Our own unavailable answers ("unavailable: <reason>", `UnavailableError`), and what Triton and gRPC say of a
# server that cannot serve now (a model not ready, a connection lost).
# "exceeds maximum queue size": Triton's own scheduler refusing a request beyond a model's max_queue_size.
# "has no available versions": Triton's answer for a model it has unloaded, as all of them at a stop.
_UNAVAILABLE_SIGNS = ("unavailable", "is full", "exceeds maximum queue size", "not ready", "failed to connect",
                      "socket closed", "has no available versions")


@functools.cache
def request_fields() -> frozenset[str]:
    """Every name a client error of ours can start with: each model's inputs, as the contract names them, and
    the client's name of each (`CLIENT_NAME`), plus `outputs` (the engine's check of the requested outputs)."""
    from . import contract

    tensors = [*contract.ensemble_inputs(messages=True), *contract.bls_inputs(messages=True),
               *contract.preprocessing_inputs(messages=True), *contract.engine_inputs(messages=True),
               *contract.postprocessing_inputs(messages=True)]
    return frozenset({tensor.name for tensor in tensors} | set(contract.PREPROCESSING_FROM_CLIENT)
                     | set(contract.CLIENT_NAME) | set(contract.CLIENT_NAME.values()) | {"outputs"})


def answered_kind(message: str) -> ErrorKind:
    """The kind of an error known by its message alone. CLIENT: "<field>: <reason>" with a field of the
    contract (`request_fields`), or one of Triton's own checks of a request; UNAVAILABLE: our
    "unavailable: <reason>", or what Triton and gRPC say of a server that cannot serve now; anything else,
    "internal error: ..." and a crashed stub among it, is INTERNAL."""
    text = message.strip()
    text = text[_TRITON_PREFIXES.match(text).end():]
    if text.startswith(INTERNAL_PREFIX):
        return ErrorKind.INTERNAL
    field = _FIELD.match(text)
    if (field and field["field"] in request_fields()) or _TRITON_REQUEST_CHECKS.match(text):
        return ErrorKind.CLIENT
    if any(sign in text.lower() for sign in _UNAVAILABLE_SIGNS):
        return ErrorKind.UNAVAILABLE
    return ErrorKind.INTERNAL

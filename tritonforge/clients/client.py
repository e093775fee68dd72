"""Clients for a served repository: gRPC streaming (sync and asyncio) and HTTP `generate` / `generate_stream`.

Every chunk the repository's models send is valid UTF-8; these clients still feed the bytes through an
incremental UTF-8 decoder, so that a server of another build that splits a character never yields half of one.
A decoupled model only answers on a gRPC stream, so non-streaming gRPC calls use the stream too.

Every request carries a unique request id. A gRPC stream abandoned before its final response (the caller
stopped reading, an error, a timeout, a disconnected gateway client) also sends the engine model a `stop`
request with that id: Triton does not pass a client's cancel on to an ensemble step already running (2.51, and
Triton's core to date), so without it the engine would generate the abandoned request to its end. Not when the
client calls the BLS or the engine itself: those see the cancel and stop the engine's request themselves (the
BLS's engine requests have ids of its own, which a client's stop could not name anyway); nor after an answer
that the server cannot serve the request (UNAVAILABLE: a full queue, a stopping server), since only the engine
answers so in our repositories, and it then runs nothing of the request.

A stream the server ends after it began to answer, without its final response (the server stopped, was killed
or restarted), is `StreamCut`: a server was there, so it is not `ServerUnavailable`.
"""

from __future__ import annotations

import asyncio
import codecs
import http.client
import json
import logging
import queue
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..facts.contract import (
    BLS_LOG_PROB_INPUTS,
    BLS_MODEL,
    DEFAULT_MAX_TOKENS,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    FINAL_RESPONSE_PARAMETER,
    MAX_TOKENS,
    MESSAGES,
    STREAM,
    STREAM_INTERVAL,
    STREAM_INTERVAL_INPUT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    client_inputs,
    stop_request_inputs,
)
from ..facts.errors import AnsweredError, ErrorKind, grpc_status_kind
from ..facts.ports import GRPC_PORT, HTTP_PORT

logger = logging.getLogger(__name__)

# The ensemble's (and the BLS's) inputs, from the one contract module, as tritonclient names their dtypes.
_TRITON_DTYPE = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64", "TYPE_UINT64": "UINT64",
                 "TYPE_FP32": "FP32", "TYPE_FP16": "FP16", "TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8"}
INPUT_DTYPES = {tensor.name: _TRITON_DTYPE[mc.DataType.Name(tensor.dtype)]
                for tensor in [*client_inputs(messages=True), STREAM_INTERVAL_INPUT, *BLS_LOG_PROB_INPUTS]}
NUMPY_DTYPES = {"BYTES": np.object_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "FP16": np.float16,
                "UINT64": np.uint64, "UINT8": np.uint8, "BOOL": np.bool_}


class GenerationError(AnsweredError):
    """The server answered with an error, or could not be reached. Its kind: the one given where the call
    carried a status or the client knows the cause, else the one its message reads as (`answered_kind`)."""


class ServerUnavailable(GenerationError):
    """No server answers at the client's address: nothing listens there (`listening` False), or what listens
    is no Triton, or speaks another protocol."""

    def __init__(self, url: str, protocol: str, detail: str, *, listening: bool = False):
        self.url, self.listening = url, listening
        super().__init__(f"no Triton server answers at {url} ({protocol}): {detail}", ErrorKind.UNAVAILABLE)


class StreamCut(GenerationError):
    """The server ended a stream it had begun to answer, without its final response: it stopped (or was
    stopped, or restarted) meanwhile. A retry may succeed, here once it serves again or on another server."""

    def __init__(self, url: str, detail: str):
        super().__init__(f"the server at {url} stopped the stream before its end (it is stopping or restarting): "
                         f"{detail}", ErrorKind.UNAVAILABLE)


class ModelUnloaded(GenerationError):
    """The server has no loaded version of the model asked for: it is stopping (Triton unloads every model before
    it exits, and answers new requests so meanwhile). A retry may succeed once it serves again, or elsewhere."""

    def __init__(self, url: str, model: str, answer: str):
        super().__init__(f"the server at {url} is stopping: it has unloaded {model!r} already; retry once it serves "
                         f"again, or on another server (Triton: {answer})", ErrorKind.UNAVAILABLE)


# Triton's answer to a request for a model that has no loaded version, as every model at a stop.
_NO_LOADED_VERSION = re.compile(r"Request for unknown model: '(?P<model>[^']*)' has no available versions")


def _unloaded(url: str, answer: str) -> ModelUnloaded | None:
    found = _NO_LOADED_VERSION.search(answer)
    return ModelUnloaded(url, found["model"], answer.strip()) if found else None


# What gRPC says of a server that answers its HTTP/2 preface in HTTP/1 (a web server); Triton's HTTP port
# closes the connection without a word ("Socket closed"), which only asking it in HTTP/1.1 tells apart.
_HTTP1_ANSWERS = ("Failed parsing HTTP/2", "http1.x server")
HTTP_PROBE_TIMEOUT_S = 2.0


def _http2_frame(error: Exception) -> bool:
    """Whether an HTTP/1.1 answer that did not parse is an HTTP/2 server's first frame (SETTINGS: a 3-byte length,
    then type 4), as a gRPC port sends to any client: http.client reads it as a bad status line."""
    line = error.args[0] if isinstance(error, http.client.BadStatusLine) and error.args else ""
    return isinstance(line, str) and len(line) >= 4 and line[3] == "\x04"


def answers_http(url: str, timeout_s: float = HTTP_PROBE_TIMEOUT_S) -> bool:
    """Whether what listens at host:port answers an HTTP/1.1 request."""
    import socket

    host, _, port = url.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as connection:
            connection.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {url}\r\nConnection: close\r\n\r\n".encode())
            return connection.recv(5) == b"HTTP/"
    except (OSError, ValueError):
        return False


def _rpc_failure(url: str, code, details: str | None, *, probe_http: bool = False,
                 began: bool = False) -> GenerationError:
    """The error for a gRPC call that failed as a call (not an error the server answered): UNAVAILABLE is a
    stream the server cut, where it had `began` to answer, else a server that cannot be reached; with
    `probe_http` (a blocking check, so not on an event loop) one that turns out to answer HTTP is named as
    such."""
    import grpc

    name = code.name if isinstance(code, grpc.StatusCode) else str(code).removeprefix("StatusCode.")
    detail = (details or "").strip() or name
    if unloaded := _unloaded(url, detail):
        return unloaded
    if name == "UNAVAILABLE" and began:
        return StreamCut(url, detail)
    if name == "UNAVAILABLE" and (any(words in detail for words in _HTTP1_ANSWERS)
                                  or probe_http and "Connection refused" not in detail and answers_http(url)):
        return ServerUnavailable(url, "gRPC", f"it answers HTTP, not gRPC: is it the HTTP port? (Triton's gRPC "
                                              f"port is {GRPC_PORT} unless set otherwise)", listening=True)
    if name == "UNAVAILABLE":  # gRPC's detail nests the cause last: "failed to connect ...: Connection refused"
        return ServerUnavailable(url, "gRPC", detail.rsplit(": ", 1)[-1].rstrip("] "))
    return GenerationError(f"{name}: {detail}", grpc_status_kind(name))


def stream_error(url: str, error, *, probe_http: bool = False, began: bool = False) -> GenerationError:
    """A tritonclient stream callback's error: an RPC failure carries its status, an answered error none."""
    if not _answered(error):
        return _rpc_failure(url, error.status(), error.message() if hasattr(error, "message") else str(error),
                            probe_http=probe_http, began=began)
    return _unloaded(url, str(error)) or GenerationError(str(error))


def _answered(error) -> bool:
    """Whether a tritonclient error is the server's answer (inside the stream) rather than the call's failure."""
    return not (error.status() if hasattr(error, "status") else None)


def runs_nothing(error, failure: GenerationError) -> bool:
    """Whether an error a stream ended with says the engine runs nothing of the request: an answer that the
    server cannot serve it (only the engine answers UNAVAILABLE in our repositories: a full queue, a stopping
    server), where a stop could find nothing to stop."""
    return _answered(error) and failure.kind is ErrorKind.UNAVAILABLE


# A stream that gets nothing from the server for this long ends with `ResponseTimeout` instead of waiting for
# ever on a frozen server; far above any wait for a first token in the engine's queue. How a server freezes:
# docs/design/faults.md#a-deadlock-in-tritons-python-backend-and-why-the-bls-calls-the-engine-over-grpc.
RESPONSE_TIMEOUT_S = 300.0


class ResponseTimeout(GenerationError):
    """The server sent nothing on a stream for `RESPONSE_TIMEOUT_S` (or the client's own limit)."""

    def __init__(self, model: str, timeout_s: float):
        super().__init__(f"no response from {model} in {timeout_s:g} s: the server may be stalled",
                         ErrorKind.UNAVAILABLE)


@dataclass
class GenerateRequest:
    """One prompt (or chat) and its parameters, with the ensemble's input names. `stream_interval` (the BLS's
    alone): engine responses per streamed response after the first, for fewer, larger chunks."""

    text_input: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    # Chat messages, or a chat object {"messages", "tools", "chat_template_kwargs"} (preprocessing's `parse_chat`).
    messages: list[dict] | dict | None = None
    parameters: dict[str, object] = field(default_factory=dict)
    stream_interval: int | None = None

    def values(self, stream: bool) -> dict[str, object]:
        values: dict[str, object] = {MAX_TOKENS: self.max_tokens, STREAM: stream, **self.parameters}
        if self.stream_interval is not None:
            values[STREAM_INTERVAL] = self.stream_interval
        if self.text_input is not None:
            values[TEXT_INPUT] = self.text_input
        if self.messages is not None:
            values[MESSAGES] = json.dumps(self.messages)
        unknown = sorted(set(values) - set(INPUT_DTYPES))
        if unknown:
            raise ValueError(f"unknown inputs {unknown}; known: {sorted(INPUT_DTYPES)}")
        return values

    def tensors(self, stream: bool) -> dict[str, np.ndarray]:
        """The request as [1, n] arrays named like the ensemble's inputs."""
        out = {}
        for name, value in self.values(stream).items():
            dtype = NUMPY_DTYPES[INPUT_DTYPES[name]]
            items = value if isinstance(value, (list, tuple)) else [value]
            if dtype is np.object_:
                items = [item.encode("utf-8") if isinstance(item, str) else item for item in items]
            out[name] = np.array([items], dtype=dtype)
        return out


SERVING_CHECK_TIMEOUT_S = 10.0


def check_serving(url: str, models: dict[str, str]) -> None:
    """Fail at once unless the server at `url` (gRPC) is ready and serves every model (name → what asked for it,
    e.g. a flag): a load against a server that is not there fails every request, as fast as it can send them."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        try:
            ready = client.is_server_ready(client_timeout=SERVING_CHECK_TIMEOUT_S)
        except InferenceServerException as error:
            raise stream_error(url, error, probe_http=True) from None
        if not ready:
            raise ServerUnavailable(url, "gRPC", "the server is not ready (still loading, or stopping)")
        for model, asked_by in models.items():
            if not client.is_model_ready(model, client_timeout=SERVING_CHECK_TIMEOUT_S):
                raise GenerationError(f"{asked_by}: the server at {url} does not serve {model!r} (a repository "
                                      f"built without it?)", ErrorKind.CLIENT)  # the caller named it
    finally:
        client.close()


class TextAssembler:
    """Byte chunks in, complete UTF-8 text out (the ensemble's chunks may split a character)."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, chunk: bytes) -> str:
        return self._decoder.decode(chunk)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


def _grpc_inputs(request: GenerateRequest, stream: bool) -> list:
    import tritonclient.grpc as grpcclient

    return grpc_tensors(grpcclient, request.tensors(stream))


STOP_TIMEOUT_S = 5.0
# After a stream's final response the server ends the call; a client waits this long for that end instead of
# dropping the call, which cancels it (GrpcClient.stream_bytes says why that matters).
STREAM_END_S = 5.0
_TRITON_DTYPE_OF = {np.dtype(numpy_dtype): triton for triton, numpy_dtype in NUMPY_DTYPES.items()}


def grpc_tensors(module, arrays: dict[str, np.ndarray]) -> list:
    """tritonclient inputs (`module`: tritonclient.grpc or its aio) from named arrays, typed by their dtype."""
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), _TRITON_DTYPE_OF[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def needs_engine_stop(model: str, engine_model: str = ENGINE_MODEL) -> bool:
    """Whether a stream of `model` abandoned early must be followed by a `stop` to the engine: every model but
    the BLS and the engine itself, which act on the cancel (the ensemble, under whatever name it is served)."""
    return model not in (BLS_MODEL, engine_model)


def one_streamed_answer(client, model: str, inputs: list, request_id: str, timeout_s: float):
    """Send one request whose one answer is its final response on a new stream of `client` (a tritonclient
    gRPC client) and wait up to `timeout_s` for it: returns the error it carries (None for a good answer),
    raises queue.Empty when none came. An answered stream is closed, an unanswered one cancelled (a close would
    wait for it): Triton 2.51 can lose track of a stream cancelled just after its final response, and then
    never unloads its models at a stop (GrpcClient.stream_bytes)."""
    from tritonclient.utils import InferenceServerException

    answered: queue.Queue = queue.Queue()
    got_answer = False
    client.start_stream(callback=lambda result, error: answered.put(error))
    try:
        try:
            client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        except InferenceServerException:  # the stream failed at once (no server there): the callback has why
            pass
        error = answered.get(timeout=timeout_s)
        got_answer = True
        return error
    finally:
        client.stop_stream(cancel_requests=not got_answer)


def _read_to_final(responses: queue.Queue, timeout_s: float) -> bool:
    """Read a stream's responses (tritonclient callback pairs) until its final one: True; an error, or nothing
    more within `timeout_s`: False."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            result, error = responses.get(timeout=left)
        except queue.Empty:
            return False
        if error is not None:
            return False
        if is_final(result):
            return True
    return False


def stop_engine_request(url: str, request_id: str, engine_model: str = ENGINE_MODEL) -> None:
    """End the engine's running request with this id (nothing happens when none runs); waits for the engine's
    answer so that the stop is not cancelled in the queue, but no longer than STOP_TIMEOUT_S: an engine that
    answers nothing (frozen) must not hold the caller."""
    import tritonclient.grpc as grpcclient

    try:
        client = grpcclient.InferenceServerClient(url)
        try:
            error = one_streamed_answer(client, engine_model, grpc_tensors(grpcclient, stop_request_inputs()),
                                        request_id, STOP_TIMEOUT_S)
            if error is not None and isinstance(stream_error(url, error), ServerUnavailable):
                # no server there now (it stopped, or is restarting): no generation of it runs to stop
                logger.debug("stopping request %s on %s: %s", request_id, engine_model, error)
            elif error is not None:
                logger.warning("stopping request %s on %s failed: %s", request_id, engine_model, error)
        finally:
            client.close()
    except queue.Empty:
        logger.warning("stopping request %s on %s: no answer in %.0f s", request_id, engine_model, STOP_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - a stop that fails (server gone) must not hide the caller's error
        logger.warning("stopping request %s on %s failed: %r", request_id, engine_model, error)


def _texts(chunks: Iterator[bytes]) -> Iterator[str]:
    """Byte chunks as non-empty pieces of complete characters."""
    assembler = TextAssembler()
    for chunk in chunks:
        if text := assembler.push(chunk):
            yield text
    if tail := assembler.finish():
        yield tail


def is_final(result) -> bool:
    final = result.get_response().parameters.get(FINAL_RESPONSE_PARAMETER)
    return final is not None and final.bool_param


def response_outputs(result, names: Collection[str]) -> dict[str, bytes]:
    """The raw contents of the named outputs of one gRPC response, for a per-chunk path: Triton's gRPC frontend
    sends every output as raw bytes, and tritonclient's `as_numpy` searches the outputs and builds an array for
    each call."""
    response = result.get_response()
    raw = response.raw_output_contents
    return {output.name: raw[index] for index, output in enumerate(response.outputs) if output.name in names}


def first_string(raw: bytes) -> bytes:
    """The first element of a raw STRING tensor (each element: a 4-byte little-endian length, then the bytes);
    empty for an empty tensor."""
    length = int.from_bytes(raw[:4], "little")
    return raw[4:4 + length]


def first_int32(raw: bytes) -> int:
    """The first element of a raw INT32 tensor; 0 for an empty tensor."""
    return int.from_bytes(raw[:4], "little", signed=True)


def _chunk_bytes(value) -> bytes:
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size else b""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


class GrpcClient:
    """Synchronous gRPC client of the ensemble or the BLS (both decoupled)."""

    def __init__(self, url: str, model: str = ENSEMBLE_MODEL, engine_model: str = ENGINE_MODEL):
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.url = url
        self.model = model
        self.engine_model = engine_model

    def stream_bytes(self, request: GenerateRequest, *, stream: bool = True,
                     request_id: str | None = None, timeout_s: float = RESPONSE_TIMEOUT_S) -> Iterator[bytes]:
        """The raw text_output bytes of each response, until the final one."""
        from tritonclient.utils import InferenceServerException

        responses: queue.Queue = queue.Queue()
        request_id = request_id or uuid.uuid4().hex
        finished = abandoned = began = False
        self.client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            try:
                self.client.async_stream_infer(self.model, _grpc_inputs(request, stream), request_id=request_id,
                                               enable_empty_final_response=True)
            except InferenceServerException:
                # The stream already failed (a server that cannot be reached fails it at once, in tritonclient's
                # own thread): the callback has the cause, or will have it in a moment.
                try:
                    _, error = responses.get(timeout=STOP_TIMEOUT_S)
                except queue.Empty:
                    raise GenerationError(f"the gRPC stream to {self.url} failed before the request was sent") from None
                raise stream_error(self.url, error, probe_http=True) from None
            while True:
                try:
                    result, error = responses.get(timeout=timeout_s)
                except queue.Empty:
                    raise ResponseTimeout(self.model, timeout_s) from None
                if error is not None:
                    failure = stream_error(self.url, error, probe_http=not began, began=began)
                    finished = runs_nothing(error, failure)
                    raise failure
                began = True
                if result.as_numpy(TEXT_OUTPUT) is not None:
                    yield _chunk_bytes(result.as_numpy(TEXT_OUTPUT))
                if is_final(result):
                    finished = True
                    return
        except ServerUnavailable:
            finished = True  # nothing reached a server: there is no generation to stop
            raise
        except GeneratorExit:  # the caller stopped reading midway
            abandoned = True
            raise
        finally:
            if not finished and needs_engine_stop(self.model, self.engine_model):
                stop_engine_request(self.url, request_id, self.engine_model)
                if abandoned:  # the stopped generation ends the stream with a final response
                    finished = _read_to_final(responses, STOP_TIMEOUT_S)
            # A finished stream is closed, not cancelled: Triton 2.51 can lose track of a stream cancelled just
            # after its final response, and then never unloads its models at a stop (the stop ends in a kill);
            # its gRPC frontend also races a cancel against the responses still in flight.
            self.client.stop_stream(cancel_requests=not finished)

    def stream(self, prompt: str | GenerateRequest, **parameters) -> Iterator[str]:
        """Text as it is generated: each piece holds complete characters."""
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        yield from _texts(self.stream_bytes(request, stream=True))

    def generate(self, prompt: str | GenerateRequest, **parameters) -> str:
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        data = b"".join(self.stream_bytes(request, stream=False))
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        """Closes the channel: one left to the interpreter's exit can hold the process there (gRPC's reconnecting
        channel is torn down by garbage collection during finalisation)."""
        self.client.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SilenceWatch:
    """Calls `expire` when a wait for the server's next response has lasted `timeout_s`. One timer per stream,
    re-armed only when it comes due, so a response costs two clock reads instead of a timer of its own (the
    OpenAI gateway reads one response per token)."""

    def __init__(self, timeout_s: float, expire: Callable[[], object]):
        self.loop = asyncio.get_running_loop()
        self.timeout_s, self.expire = timeout_s, expire
        self.waiting_since: float | None = None  # None while the caller handles a response
        self.expired = False
        self._timer = self.loop.call_later(timeout_s, self._check)

    def wait_begins(self) -> None:
        self.waiting_since = self.loop.time()

    def heard(self) -> None:
        self.waiting_since = None

    def _check(self) -> None:
        now = self.loop.time()
        if self.waiting_since is not None and now >= self.waiting_since + self.timeout_s:
            self.expired = True
            self.expire()
            return
        start = now if self.waiting_since is None else self.waiting_since
        self._timer = self.loop.call_at(start + self.timeout_s, self._check)

    def stop(self) -> None:
        self._timer.cancel()


async def wait_call_ended(stream) -> None:
    """Wait (up to STREAM_END_S) for the server to end a call whose final response came, rather than drop it."""
    try:
        async with asyncio.timeout(STREAM_END_S):
            async for _ in stream:
                pass
    except Exception:  # noqa: BLE001 - the answer is complete: how its call ends (or a timeout) is not its error
        pass


class AsyncGrpcClient:
    """asyncio gRPC client: many concurrent streams on one connection."""

    def __init__(self, url: str, model: str = ENSEMBLE_MODEL, engine_model: str = ENGINE_MODEL,
                 response_timeout_s: float = RESPONSE_TIMEOUT_S):
        import tritonclient.grpc.aio as aioclient

        self.client = aioclient.InferenceServerClient(url)
        self.url = url
        self.model = model
        self.engine_model = engine_model
        self.response_timeout_s = response_timeout_s
        self._stopping: set[asyncio.Task] = set()

    async def responses(self, request: GenerateRequest, *, stream: bool = True, request_id: str | None = None,
                        outputs: Collection[str] | None = None) -> AsyncIterator:
        """Every response of one request (tritonclient results), up to the one flagged final; with `outputs`,
        responses carry only those."""
        import grpc
        import tritonclient.grpc.aio as aioclient
        from tritonclient.utils import InferenceServerException

        inputs = _grpc_inputs(request, stream)
        request_id = request_id or uuid.uuid4().hex
        requested = None if outputs is None else [aioclient.InferRequestedOutput(name) for name in outputs]
        finished = False

        async def requests():
            yield {"model_name": self.model, "inputs": inputs, "outputs": requested, "request_id": request_id,
                   "enable_empty_final_response": True}

        stream = self.client.stream_infer(requests())
        began = False
        silence = _SilenceWatch(self.response_timeout_s, stream.cancel)
        try:
            while True:
                silence.wait_begins()
                try:
                    result, error = await anext(stream)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:  # the watch cancelled the call, or the caller's task is cancelled
                    if silence.expired:
                        raise ResponseTimeout(self.model, self.response_timeout_s) from None
                    raise
                silence.heard()
                if error is not None:
                    failure = stream_error(self.url, error, began=began)
                    finished = runs_nothing(error, failure)
                    raise failure
                began = True
                yield result
                if is_final(result):
                    finished = True
                    await wait_call_ended(stream)
                    return
        except InferenceServerException as error:
            raise stream_error(self.url, error, began=began) from None
        except grpc.RpcError as error:  # the call itself failed: tritonclient's aio stream passes these on
            failure = _rpc_failure(self.url, error.code(), error.details(), began=began)
            finished = finished or isinstance(failure, ServerUnavailable)  # nothing to stop on no server
            raise failure from None
        finally:
            silence.stop()
            if not finished and needs_engine_stop(self.model, self.engine_model):
                # in a task of its own: the caller may be a task being cancelled
                task = asyncio.get_running_loop().create_task(self._stop_engine_request(request_id))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def _stop_engine_request(self, request_id: str) -> None:
        """`stop_engine_request` on this client's connection."""
        import tritonclient.grpc.aio as aioclient

        async def stop():
            yield {"model_name": self.engine_model, "inputs": grpc_tensors(aioclient, stop_request_inputs()),
                   "request_id": request_id, "enable_empty_final_response": True}

        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                async for _, error in self.client.stream_infer(stop()):
                    if error is not None:
                        logger.warning("stopping request %s on %s failed: %s", request_id, self.engine_model, error)
                    break
        except Exception as error:  # noqa: BLE001 - a stop that fails must not fail the caller
            logger.warning("stopping request %s on %s failed: %r", request_id, self.engine_model, error)

    async def stream_bytes(self, request: GenerateRequest, *, stream: bool = True,
                           request_id: str | None = None) -> AsyncIterator[bytes]:
        async for result in self.responses(request, stream=stream, request_id=request_id):
            if result.as_numpy(TEXT_OUTPUT) is not None:
                yield _chunk_bytes(result.as_numpy(TEXT_OUTPUT))

    async def stream(self, prompt: str | GenerateRequest, **parameters) -> AsyncIterator[str]:
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        assembler = TextAssembler()
        async for chunk in self.stream_bytes(request):  # as _texts, which an async stream cannot reuse
            if text := assembler.push(chunk):
                yield text
        if tail := assembler.finish():
            yield tail

    async def generate(self, prompt: str | GenerateRequest, **parameters) -> str:
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        chunks = [chunk async for chunk in self.stream_bytes(request, stream=False)]
        return b"".join(chunks).decode("utf-8", errors="replace")

    async def close(self) -> None:
        if self._stopping:
            await asyncio.wait(set(self._stopping), timeout=STOP_TIMEOUT_S)
        await self.client.close()


class HttpClient:
    """HTTP client of Triton's generate extension (`/generate`, and `/generate_stream` as server-sent events).

    An HTTP client that goes away cancels its request, which, as a gRPC cancel, does not reach an ensemble's
    running engine step: a stream abandoned before its end sends the engine a `stop` with the stream's
    request id (`id`), as the gRPC clients do."""

    def __init__(self, url: str, model: str = ENSEMBLE_MODEL, timeout_s: float = RESPONSE_TIMEOUT_S,
                 engine_model: str = ENGINE_MODEL):
        host, _, port = url.replace("http://", "").partition(":")
        if not host or not (port or str(HTTP_PORT)).isdigit():
            raise ValueError(f"url {url!r}: expected HOST:PORT, e.g. 127.0.0.1:{HTTP_PORT}")
        self.host, self.port = host, int(port or HTTP_PORT)
        self.model = model
        self.engine_model = engine_model
        self.timeout_s = timeout_s

    def _post(self, path: str, body: dict, model: str | None = None) -> http.client.HTTPResponse:
        address = f"{self.host}:{self.port}"
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.connect()
        except OSError as error:
            raise ServerUnavailable(address, "HTTP", error.strerror or str(error)) from None
        try:
            connection.request("POST", f"/v2/models/{model or self.model}/{path}", body=json.dumps(body),
                               headers={"Content-Type": "application/json"})
            return connection.getresponse()
        except TimeoutError:
            raise ResponseTimeout(model or self.model, self.timeout_s) from None
        except (http.client.HTTPException, ConnectionError) as error:
            if _http2_frame(error):
                raise ServerUnavailable(address, "HTTP", f"it answers HTTP/2, as a gRPC port does: is it the gRPC "
                                                         f"port? Ask it over gRPC (--protocol grpc), or use the HTTP "
                                                         f"port ({HTTP_PORT} unless set otherwise)",
                                        listening=True) from None
            raise ServerUnavailable(address, "HTTP", f"what answers there speaks no HTTP/1.1 ({error!r}): is it "
                                                     f"Triton's HTTP port?", listening=True) from None

    def _answered_error(self, message: str) -> GenerationError:
        return _unloaded(f"{self.host}:{self.port}", message) or GenerationError(message)

    def _stop_engine_request(self, request_id: str) -> None:
        scalars = {name: value.reshape(-1)[0].item() for name, value in stop_request_inputs().items()}
        body = {"id": request_id, **scalars}
        try:
            response = self._post("generate_stream", body, model=self.engine_model)
            response.read()
            response.close()
        except (OSError, GenerationError) as error:  # a stop that fails (server gone) must not hide the caller's
            logger.warning("stopping request %s on %s failed: %r", request_id, self.engine_model, error)

    def generate(self, prompt: str | GenerateRequest, **parameters) -> str:
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        response = self._post("generate", request.values(stream=False))
        payload = _answer(response, f"{self.host}:{self.port}")
        if response.status != 200 or "error" in payload:
            raise self._answered_error(payload.get("error", f"HTTP {response.status}"))
        return _event_bytes(payload).decode("utf-8", errors="replace")

    def stream_bytes(self, request: GenerateRequest) -> Iterator[bytes]:
        request_id = uuid.uuid4().hex
        response = self._post("generate_stream", {"id": request_id, **request.values(stream=True)})
        finished = False
        try:
            if response.status != 200:
                payload = _answer(response, f"{self.host}:{self.port}")
                raise self._answered_error(payload.get("error", f"HTTP {response.status}"))
            try:
                for line in response:
                    if not line.startswith(b"data:"):
                        continue
                    payload = _json_event(line[5:].strip())
                    if "error" in payload:
                        raise self._answered_error(payload["error"])
                    yield _event_bytes(payload)
            except (http.client.HTTPException, ConnectionError) as error:  # the answer cut short
                raise StreamCut(f"{self.host}:{self.port}", type(error).__name__) from None
            finished = True  # the server ended the stream after its final response
        finally:
            response.close()
            if not finished and needs_engine_stop(self.model, self.engine_model):
                self._stop_engine_request(request_id)

    def stream(self, prompt: str | GenerateRequest, **parameters) -> Iterator[str]:
        request = prompt if isinstance(prompt, GenerateRequest) else _request(prompt, parameters)
        yield from _texts(self.stream_bytes(request))

    def close(self) -> None:
        """Nothing held between requests: each request is its own connection, closed with its answer."""

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _answer(response: http.client.HTTPResponse, address: str) -> dict:
    """The JSON object of a whole HTTP answer; a body that is none is not Triton's generate endpoint."""
    body = response.read()
    try:
        payload = _json_event(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise ServerUnavailable(address, "HTTP", f"what answers is not Triton's generate endpoint (HTTP "
                                                 f"{response.status}, {body[:60]!r})", listening=True)
    return payload


def _json_event(data: bytes) -> dict:
    # A server that streams part of a UTF-8 character writes it into its JSON as raw bytes; surrogateescape
    # keeps them so that `_event_bytes` gets the exact bytes back.
    return json.loads(data.decode("utf-8", errors="surrogateescape"))


def _event_bytes(payload: dict) -> bytes:
    text = payload.get(TEXT_OUTPUT, "")
    if isinstance(text, list):
        text = "".join(text)
    return text.encode("utf-8", errors="surrogateescape")


def _request(prompt: str, parameters: dict) -> GenerateRequest:
    max_tokens = parameters.pop(MAX_TOKENS, DEFAULT_MAX_TOKENS)
    return GenerateRequest(text_input=prompt, max_tokens=max_tokens, parameters=parameters)

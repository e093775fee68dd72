"""The BLS's calls to the engine model, over the server's own gRPC streaming API.

One bidirectional `ModelStreamInfer` stream per BLS instance carries all of its engine requests, told apart
by request id (as NVIDIA's streaming clients send a request and its `stop` on one stream); one reader thread
hands each response to its request's handler.

Why not the Python backend's BLS (`InferenceRequest.exec(decoupled=True)`): Triton 2.51's stub (python_backend
r24.10, unchanged since) deadlocks when many requests of one instance stream from the engine at once. A
thread returning from `exec` holds the GIL and waits for the stub's response-iterator map; the stub's
response thread holds that map and waits for one iterator's lock; that iterator's reader, woken in
`__next__`, holds its lock and waits for the GIL. The engine then stops for every path, since the server
waits on the stub to take each response
(docs/design/faults.md#a-deadlock-in-tritons-python-backend-and-why-the-bls-calls-the-engine-over-grpc). A gRPC
stream takes no lock of the stub's, and an engine call no longer holds one of the backend's 32 threads until its
first token.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from ...facts.contract import FINAL_RESPONSE_PARAMETER, stop_request_inputs
from ...facts.environment import ENGINE_GRPC_URL_ENV
from ...facts.errors import EngineCallError, EngineStreamError

logger = logging.getLogger(__name__)

_UNLIMITED = -1
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", _UNLIMITED), ("grpc.max_send_message_length", _UNLIMITED)]
_CLOSE = object()  # ends the request iterator, which closes the stream


class EngineCall:
    """One engine request. The stream's reader hands each response with outputs to `on_response`, in order and
    in the reader's thread (no hand-off per token); the caller waits for the end with `wait`."""

    def __init__(self, on_response: Callable[[dict[str, np.ndarray]], None]):
        self._on_response = on_response
        self._done = threading.Event()
        self._failure: Exception | None = None
        # Held through a delivery and an end: once `end` returns, `on_response` neither runs nor will (an end
        # from another thread than the reader's, at a server's stop, hands the text state over safely).
        self._lock = threading.RLock()

    def deliver(self, outputs: dict[str, np.ndarray], final: bool) -> bool:
        """Called by the reader; True once the call is over (its final response, or `on_response` failed)."""
        with self._lock:
            if self._done.is_set():
                return True
            if outputs:
                try:
                    self._on_response(outputs)
                except Exception as error:  # noqa: BLE001 - it ends this call, which `wait` raises
                    self.end(error)
                    return True
            if final:
                self.end()
            return final

    def end(self, failure: Exception | None = None) -> None:
        with self._lock:
            if not self._done.is_set():
                self._failure = failure
                self._done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True when the call is over, False on timeout; raises what ended it, if anything did."""
        if not self._done.wait(timeout_s):
            return False
        if self._failure is not None:
            raise self._failure
        return True


class EngineStream:
    """The stream to `model` at `url`, opened at the first request and again after it fails."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self._lock = threading.Lock()
        self._calls: dict[str, EngineCall] = {}  # open requests by id
        self._requests: queue.SimpleQueue | None = None  # what the open stream sends; None: no stream
        self._channel: grpc.Channel | None = None

    def call(self, request_id: str, inputs: dict[str, np.ndarray], outputs: list[str],
             on_response: Callable[[dict[str, np.ndarray]], None]) -> EngineCall:
        engine_call = EngineCall(on_response)
        message = _request(self.model, request_id, inputs, outputs)
        with self._lock:
            self._calls[request_id] = engine_call
            self._open_locked().put(message)
        return engine_call

    def stop(self, request_id: str) -> None:
        """Stop the engine's request `request_id` (the engine's `stop` input, sent with the same id). Its
        answer and whatever the stopped request still sends go to the request's call, if still open: the
        first final response of the two ends it."""
        message = _request(self.model, request_id, stop_request_inputs(), [])
        with self._lock:
            self._open_locked().put(message)

    def end(self, request_id: str, failure: Exception) -> None:
        """End the open call of `request_id` with `failure` now, whatever the engine still sends for it."""
        with self._lock:
            engine_call = self._calls.pop(request_id, None)
        if engine_call is not None:
            engine_call.end(failure)

    def close(self) -> None:
        with self._lock:
            if self._requests is not None:
                self._requests.put(_CLOSE)
            self._requests = None
            if self._channel is not None:
                self._channel.close()
            self._channel = None

    def _open_locked(self) -> queue.SimpleQueue:
        if self._requests is None:
            if self._channel is not None:  # the failed stream's
                self._channel.close()
            self._channel = grpc.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
            requests: queue.SimpleQueue = queue.SimpleQueue()
            responses = service_pb2_grpc.GRPCInferenceServiceStub(self._channel).ModelStreamInfer(
                iter(requests.get, _CLOSE))
            threading.Thread(target=self._read, args=(responses, requests), name="bls-engine-stream",
                             daemon=True).start()
            self._requests = requests
        return self._requests

    def _read(self, responses, requests: queue.SimpleQueue) -> None:
        try:
            for message in responses:
                self._route(message)
            failure = EngineStreamError(f"the stream to the engine model {self.model!r} at {self.url} closed")
        except grpc.RpcError as error:
            failure = EngineStreamError(
                f"the stream to the engine model {self.model!r} at {self.url} failed: {error.code().name}: "
                f"{error.details()} (the BLS reaches the engine through the server's gRPC endpoint: its "
                f"`engine_grpc_url` parameter or ${ENGINE_GRPC_URL_ENV})")
        except Exception as error:  # noqa: BLE001 - a response it could not read: no open request may wait on
            logger.exception("reading the stream to the engine model %r failed", self.model)
            responses.cancel()  # the stream is given up; the next request opens a new one
            failure = EngineStreamError(f"reading the stream to the engine model {self.model!r} failed: "
                                        f"{type(error).__name__}")
        with self._lock:
            if self._requests is requests:  # not already replaced by a newer stream
                self._requests = None
            failed, self._calls = self._calls, {}
        if failed:
            logger.error("%s; failing %d engine requests", failure, len(failed))
        for engine_call in failed.values():
            engine_call.end(failure)

    def _route(self, message) -> None:
        reply = message.infer_response
        with self._lock:
            engine_call = self._calls.get(reply.id)
        if engine_call is None:  # a stop's answer, or a stopped request's last words
            return
        if message.error_message:  # errors end a request (not every one carries the final flag)
            engine_call.end(EngineCallError(message.error_message))
            over = True
        else:
            parameters = reply.parameters
            final = FINAL_RESPONSE_PARAMETER in parameters and parameters[FINAL_RESPONSE_PARAMETER].bool_param
            over = engine_call.deliver(_outputs(reply), final)
        if over:
            with self._lock:
                self._calls.pop(reply.id, None)


def _request(model: str, request_id: str, inputs: dict[str, np.ndarray], outputs: list[str]):
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for name, value in inputs.items():
        datatype = np_to_triton_dtype(value.dtype)
        request.inputs.add(name=name, datatype=datatype, shape=value.shape)
        if datatype == "BYTES":
            request.raw_input_contents.append(serialize_byte_tensor(value).item() if value.size else b"")
        else:
            request.raw_input_contents.append(np.ascontiguousarray(value).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def _outputs(reply) -> dict[str, np.ndarray]:
    outputs = {}
    for tensor, raw in zip(reply.outputs, reply.raw_output_contents):
        if tensor.datatype == "BYTES":
            value = deserialize_bytes_tensor(raw)
        else:
            value = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
        outputs[tensor.name] = value.reshape(tuple(tensor.shape))
    return outputs

"""A stream that got its final response is closed, never cancelled: Triton 2.51 can lose track of a stream
cancelled just after its final response, and then never unloads its models when it stops (the stop of
`tritonforge serve` under streams ended in a kill about one time in five). The server here is a test double of
Triton's streaming endpoint that answers each request with a final response and records how the client ended
the stream. An ensemble stream given up midway is stopped through the engine and read to the final response
the stop brings, then closed (a BLS stream is cancelled: the BLS acts on the cancel). And a call that breaks
midway still stops its generation: the client sends the engine a `stop` with the request's id."""

import asyncio
import queue
import struct
import threading

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.clients.client import (
    AsyncGrpcClient,
    GenerateRequest,
    GenerationError,
    GrpcClient,
    needs_engine_stop,
    stop_engine_request,
)
from tritonforge.facts.contract import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL, FINAL_RESPONSE_PARAMETER, TEXT_OUTPUT

WAIT_S = 30


class AnsweringTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each streamed request with one final response; `ends` gets "closed" when the client half-closed
    the stream, "cancelled" when it cancelled it."""

    def __init__(self):
        self.ends: queue.Queue = queue.Queue()

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        ended = threading.Event()
        context.add_callback(lambda: (self.ends.put("cancelled"), ended.set()) if not ended.is_set() else None)
        try:
            for request in request_iterator:
                response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=response)
            if context.is_active():  # the client's side ended by a half-close: the call ends well
                ended.set()
                self.ends.put("closed")
        except Exception:  # noqa: BLE001 - a cancelled call's iterator raises: the callback records it
            pass


@pytest.fixture()
def answering():
    servicer = AnsweringTriton()
    with serving_grpc(servicer) as url:
        yield servicer, url


def test_a_stream_that_got_its_final_response_is_closed_not_cancelled(answering):
    servicer, url = answering
    client = GrpcClient(url)
    try:
        assert list(client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=1))) == []
    finally:
        client.client.close()
    assert servicer.ends.get(timeout=WAIT_S) == "closed"


def test_an_answered_stop_is_closed_not_cancelled(answering):
    servicer, url = answering
    stop_engine_request(url, "a-request")
    assert servicer.ends.get(timeout=WAIT_S) == "closed"


def test_an_asyncio_stream_that_got_its_final_response_is_closed_not_cancelled(answering):
    """The asyncio client waits for the server to end the call after the final response: dropping the call
    there cancelled it about one time in six."""
    servicer, url = answering

    async def run():
        client = AsyncGrpcClient(url)
        try:
            return [chunk async for chunk in client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=1))]
        finally:
            await client.close()

    assert asyncio.run(run()) == []
    assert servicer.ends.get(timeout=WAIT_S) == "closed"


def test_a_benchmark_stream_that_got_its_final_response_is_closed_not_cancelled(answering):
    """A benchmark point's asyncio requests end their calls as the clients do: a dropped call is cancelled."""
    import tritonclient.grpc.aio as aioclient

    from tritonforge.tools.benchmark import _one_request, request_arrays

    servicer, url = answering

    async def run():
        client = aioclient.InferenceServerClient(url)
        try:
            return await _one_request(client, "ensemble", request_arrays("ensemble", ("hi", [1]), 1), 1, aioclient)
        finally:
            await client.close()

    assert asyncio.run(run()).error is None
    assert servicer.ends.get(timeout=WAIT_S) == "closed"


class StoppableTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Streams one chunk of text for an ensemble request, then its final response once the engine got a `stop`
    (answered at once); `ends` gets how each ensemble stream ended, as AnsweringTriton's."""

    def __init__(self):
        self.ends: queue.Queue = queue.Queue()
        self.stopped = threading.Event()

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        ended = threading.Event()
        context.add_callback(lambda: (self.ends.put("cancelled"), ended.set()) if not ended.is_set() else None)
        try:
            for request in request_iterator:
                if request.model_name == ENGINE_MODEL:
                    self.stopped.set()
                else:
                    text = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                    text.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1])
                    text.raw_output_contents.append(struct.pack("<I", 2) + b"hi")  # BYTES: length, then bytes
                    yield service_pb2.ModelStreamInferResponse(infer_response=text)
                    self.stopped.wait(WAIT_S)
                final = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                final.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=final)
            if context.is_active():
                ended.set()
                if request.model_name != ENGINE_MODEL:
                    self.ends.put("closed")
        except Exception:  # noqa: BLE001 - a cancelled call's iterator raises: the callback records it
            pass


def test_an_abandoned_ensemble_stream_is_stopped_and_then_closed_not_cancelled():
    """The engine's stop ends the generation, and with it the stream: the client reads it to its final response
    instead of cancelling it (Triton 2.51's gRPC frontend races a cancel against responses in flight)."""
    servicer = StoppableTriton()
    with serving_grpc(servicer) as url:
        client = GrpcClient(url)
        stream = client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=100))
        assert next(stream) == b"hi"
        stream.close()  # the caller stops reading
        client.close()
        assert servicer.stopped.is_set() and servicer.ends.get(timeout=WAIT_S) == "closed"


class RefusingTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers an ensemble request with an error response and then nothing, its stream left open (as a server
    whose request failed sends no final response after the error); answers the engine's stop at once."""

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for request in request_iterator:
            if request.model_name == ENGINE_MODEL:
                response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=response)
            else:
                yield service_pb2.ModelStreamInferResponse(error_message="the request was refused")


def test_an_error_answer_ends_the_stream_at_once_with_no_wait_for_a_final_response(monkeypatch):
    """Only a stream the caller abandons is read on after its stop: after an error no final response comes."""
    monkeypatch.setattr("tritonforge.clients.client.STOP_TIMEOUT_S", 3600.0)  # a wait for one would hang
    outcome: queue.Queue = queue.Queue()

    def read(url):
        client = GrpcClient(url)
        try:
            list(client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=4)))
        except GenerationError as error:
            outcome.put(str(error))
        finally:
            client.client.close()

    with serving_grpc(RefusingTriton()) as url:
        reader = threading.Thread(target=read, args=(url,), daemon=True)
        reader.start()
        assert "the request was refused" in outcome.get(timeout=WAIT_S)


class BreakingTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Records (model, request id) of each streamed request; answers the engine's stop, and breaks every other
    call with a gRPC error (a status that is no unreachable server's)."""

    def __init__(self):
        self.requests: queue.Queue = queue.Queue()

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for request in request_iterator:
            self.requests.put((request.model_name, request.id))
            if request.model_name != ENGINE_MODEL:
                context.abort(grpc.StatusCode.INTERNAL, "the call broke")
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=response)


def test_an_asyncio_call_that_breaks_midway_stops_its_engine_request():
    servicer = BreakingTriton()

    async def run(url):
        client = AsyncGrpcClient(url, ENSEMBLE_MODEL)
        try:
            with pytest.raises(GenerationError, match="the call broke"):
                async for _ in client.responses(GenerateRequest(text_input="hi", max_tokens=4), request_id="r-7"):
                    pass
        finally:
            await client.close()  # waits for the stops it sent

    with serving_grpc(servicer) as url:
        asyncio.run(run(url))
    received = [servicer.requests.get_nowait() for _ in range(servicer.requests.qsize())]
    assert received == [(ENSEMBLE_MODEL, "r-7"), (ENGINE_MODEL, "r-7")]


@pytest.mark.parametrize(("model", "stop"), [(ENSEMBLE_MODEL, True), ("my_ensemble", True), (BLS_MODEL, False),
                                             (ENGINE_MODEL, False)])
def test_only_an_abandoned_stream_of_an_ensemble_needs_a_stop_since_the_bls_and_the_engine_see_the_cancel(
        model, stop):
    assert needs_engine_stop(model) is stop

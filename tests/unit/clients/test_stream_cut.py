"""What a client says of a stream the server ended: one it had begun to answer and then cut (the server stopped,
was killed or restarted) is `StreamCut`, "stopped the stream", never "no Triton server answers"; and an answer
that the server cannot serve the request (a stopping server, UNAVAILABLE) needs no `stop` to the engine, which
runs nothing of it, so the client sends none (at a stop, that `stop` failed with a warning on each client). The
server is a test double of Triton's streaming endpoint that records the requests it gets."""

import asyncio
import queue
import struct

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.clients.client import (
    AsyncGrpcClient,
    GenerateRequest,
    GenerationError,
    GrpcClient,
    ServerUnavailable,
    StreamCut,
)
from tritonforge.facts.contract import ENGINE_MODEL, ENSEMBLE_MODEL, FINAL_RESPONSE_PARAMETER, TEXT_OUTPUT
from tritonforge.facts.errors import ErrorKind, ServerStopping

STOPPING = f"in ensemble 'ensemble', {ServerStopping()}"  # the engine's answer at a stop, through the ensemble


class EndingTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers an ensemble request with one chunk of text, then ends its stream as `ending` says: "cut" (the
    call fails UNAVAILABLE, as when the server goes away) or "stopping" (an error answer, as the engine's when
    the server stops); answers an engine `stop` at once. Records (model, request id) of each request."""

    def __init__(self, ending: str):
        self.ending = ending
        self.requests: queue.Queue = queue.Queue()

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for request in request_iterator:
            self.requests.put((request.model_name, request.id))
            if request.model_name == ENGINE_MODEL:
                final = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                final.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=final)
                continue
            text = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            text.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1])
            text.raw_output_contents.append(struct.pack("<I", 2) + b"hi")  # BYTES: length, then bytes
            yield service_pb2.ModelStreamInferResponse(infer_response=text)
            if self.ending == "cut":
                context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            yield service_pb2.ModelStreamInferResponse(error_message=STOPPING)

    def received(self) -> list[tuple[str, str]]:
        return [self.requests.get_nowait() for _ in range(self.requests.qsize())]


def read_sync(url: str) -> GenerationError:
    client = GrpcClient(url, model=ENSEMBLE_MODEL)
    try:
        with pytest.raises(GenerationError) as failed:
            list(client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=100), request_id="r-1"))
        return failed.value
    finally:
        client.close()


def read_async(url: str) -> GenerationError:
    async def run():
        client = AsyncGrpcClient(url, ENSEMBLE_MODEL)
        try:
            with pytest.raises(GenerationError) as failed:
                async for _ in client.stream_bytes(GenerateRequest(text_input="hi", max_tokens=100), request_id="r-1"):
                    pass
            return failed.value
        finally:
            await client.close()  # waits for the stops it sent

    return asyncio.run(run())


@pytest.mark.parametrize("read", [read_sync, read_async], ids=["sync", "asyncio"])
def test_a_stream_the_server_cut_after_it_began_says_the_server_stopped_it_not_that_none_answers(read):
    servicer = EndingTriton("cut")
    with serving_grpc(servicer) as url:
        error = read(url)
    assert isinstance(error, StreamCut) and not isinstance(error, ServerUnavailable)
    assert str(error).startswith(f"the server at {url} stopped the stream before its end") and "Socket closed" in \
        str(error)
    assert error.kind is ErrorKind.UNAVAILABLE


@pytest.mark.parametrize("read", [read_sync, read_async], ids=["sync", "asyncio"])
def test_a_stream_the_stopping_server_ended_says_so_and_sends_the_engine_no_stop(read):
    servicer = EndingTriton("stopping")
    with serving_grpc(servicer) as url:
        error = read(url)
    assert str(error) == STOPPING and error.kind is ErrorKind.UNAVAILABLE
    assert servicer.received() == [(ENSEMBLE_MODEL, "r-1")]  # no stop followed


UNLOADED = "Request for unknown model: 'ensemble' has no available versions"  # Triton's answer once a stop unloaded it


class UnloadedTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers every request as Triton does at a stop, once it has unloaded the model."""

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for _ in request_iterator:
            yield service_pb2.ModelStreamInferResponse(error_message=UNLOADED)


@pytest.mark.parametrize("read", [read_sync, read_async], ids=["sync", "asyncio"])
def test_a_request_to_a_server_that_unloaded_its_model_says_the_server_is_stopping(read):
    with serving_grpc(UnloadedTriton()) as url:
        error = read(url)
    assert str(error).startswith(f"the server at {url} is stopping: it has unloaded 'ensemble' already")
    assert UNLOADED in str(error) and error.kind is ErrorKind.UNAVAILABLE

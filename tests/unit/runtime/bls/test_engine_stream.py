"""The BLS's stream to the engine (tritonforge/runtime/bls/engine_stream.py): responses reach their own request
among many on one stream, an error ends only its request, and a stream that fails, cannot open or brings a response that
cannot be read ends every open request with an error instead of leaving it waiting. The far end is a test
double of Triton's gRPC streaming endpoint that answers from a script; the BLS over a real tritonserver is
tested in tests/integration/test_bls.py."""


import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.facts.errors import EngineCallError, EngineStreamError
from tritonforge.runtime.bls.engine_stream import EngineStream
from tritonforge.serve.ports import free_port

GIVE_UP_S = 30  # far beyond any answer here: past it the call hung


def reply(request_id: str, tokens: list[int] | None = None, final: bool = False, error: str = ""):
    message = service_pb2.ModelStreamInferResponse(error_message=error)
    response = message.infer_response
    response.id = request_id
    if tokens is not None:
        ids = np.array([tokens], dtype=np.int32)
        response.outputs.add(name="output_ids", datatype="INT32", shape=ids.shape)
        response.raw_output_contents.append(ids.tobytes())
    response.parameters["triton_final_response"].bool_param = final
    return message


class ScriptedEngine(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Once a stream has brought `wait_for` requests, answers with `script(context)`; keeps every request."""

    def __init__(self):
        self.received: list = []
        self.wait_for = 1
        self.script = lambda context: []

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        count = 0
        for request in request_iterator:
            self.received.append(request)
            count += 1
            if count == self.wait_for:
                yield from self.script(context)


@pytest.fixture()
def engine():
    scripted = ScriptedEngine()
    with serving_grpc(scripted) as url:
        stream = EngineStream(url, "tensorrt_llm")
        yield scripted, stream
        stream.close()


class Call:
    """An engine call whose responses are collected as their token lists."""

    def __init__(self, stream: EngineStream, request_id: str, length: int = 1):
        self.received: list = []
        self.call = stream.call(request_id, inputs(length), ["output_ids"],
                                lambda outputs: self.received.append(outputs["output_ids"].tolist()))

    def outcome(self) -> list:
        """Every response, then the error that ended the call if one did."""
        try:
            assert self.call.wait(GIVE_UP_S), "the call never ended"
        except (EngineCallError, EngineStreamError) as error:  # the engine's answer, or the stream failing
            return [*self.received, error]
        return self.received


def inputs(length: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.arange(length, dtype=np.int32).reshape(1, -1),
            "input_lengths": np.array([[length]], dtype=np.int32), "streaming": np.array([[True]]),
            "guided_decoding_guide_type": np.array([[b"json"]], dtype=object)}


def test_interleaved_responses_reach_their_own_request_in_order(engine):
    scripted, stream = engine
    scripted.wait_for = 2
    scripted.script = lambda context: [reply("a", [1]), reply("b", [7]), reply("a", [2]), reply("b", [8, 9]),
                                       reply("a", final=True), reply("b", [10], final=True)]
    first, second = Call(stream, "a", length=3), Call(stream, "b", length=2)
    assert first.outcome() == [[[1]], [[2]]]
    assert second.outcome() == [[[7]], [[8, 9]], [[10]]]
    request = scripted.received[0]  # what the engine was sent: the inputs as they were, and the final flag asked for
    assert (request.model_name, request.id, [tensor.name for tensor in request.outputs]) == (
        "tensorrt_llm", "a", ["output_ids"])
    assert [(tensor.name, tensor.datatype, list(tensor.shape)) for tensor in request.inputs] == [
        ("input_ids", "INT32", [1, 3]), ("input_lengths", "INT32", [1, 1]), ("streaming", "BOOL", [1, 1]),
        ("guided_decoding_guide_type", "BYTES", [1, 1])]
    assert np.frombuffer(request.raw_input_contents[0], dtype=np.int32).tolist() == [0, 1, 2]
    assert request.raw_input_contents[3] == b"\x04\x00\x00\x00json"  # Triton's BYTES: length, then the bytes
    assert request.parameters["triton_enable_empty_final_response"].bool_param


def test_an_engine_error_ends_its_own_request_only(engine):
    scripted, stream = engine
    scripted.wait_for = 2
    scripted.script = lambda context: [reply("a", [1]), reply("b", error="request_output_len: too long"),
                                       reply("a", [2], final=True)]
    first, second = Call(stream, "a"), Call(stream, "b")
    [error] = second.outcome()
    assert type(error) is EngineCallError and str(error) == "request_output_len: too long"
    assert first.outcome() == [[[1]], [[2]]]


def test_a_stop_goes_to_the_engine_with_the_requests_id(engine):
    scripted, stream = engine
    scripted.wait_for = 2
    scripted.script = lambda context: [reply("a", final=True)]  # the stop's empty final answer
    call = Call(stream, "a")
    stream.stop("a")
    assert call.outcome() == []
    stop = scripted.received[1]
    assert stop.id == "a" and "stop" in [tensor.name for tensor in stop.inputs]


def test_a_failed_stream_ends_every_open_request_with_an_error_and_the_next_request_opens_a_new_one(engine):
    scripted, stream = engine
    scripted.wait_for = 2

    def fail(context):
        yield reply("a", [1])
        context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

    scripted.script = fail
    first, second = Call(stream, "a"), Call(stream, "b")
    *delivered, error = first.outcome()
    assert delivered == [[[1]]] and isinstance(error, EngineStreamError)
    assert "UNAVAILABLE" in str(error) and "the server is shutting down" in str(error)
    assert isinstance(second.outcome()[0], EngineStreamError)
    scripted.wait_for = 1
    scripted.script = lambda context: [reply("c", [5], final=True)]
    assert Call(stream, "c").outcome() == [[[5]]]


def test_an_unreachable_server_ends_the_request_with_an_error_naming_the_setting():
    stream = EngineStream(f"127.0.0.1:{free_port()}", "tensorrt_llm")
    try:
        [error] = Call(stream, "a").outcome()
    finally:
        stream.close()
    assert isinstance(error, EngineStreamError) and "engine_grpc_url" in str(error)


def test_a_handler_that_fails_ends_its_own_call_with_that_error_and_gets_nothing_more(engine):
    scripted, stream = engine
    scripted.wait_for = 2
    scripted.script = lambda context: [reply("a", [1]), reply("b", [7]), reply("a", [2]), reply("b", [8], final=True),
                                       reply("a", [3], final=True)]
    handled = []

    def fail_once(outputs):
        handled.append(outputs["output_ids"].tolist())
        raise RuntimeError("the client went away")

    failing = stream.call("a", inputs(1), ["output_ids"], fail_once)
    other = Call(stream, "b")
    with pytest.raises(RuntimeError, match="the client went away"):
        failing.wait(GIVE_UP_S)
    assert other.outcome() == [[[7]], [[8]]]
    assert handled == [[[1]]]


def test_a_response_that_cannot_be_read_ends_every_open_request_and_the_next_request_opens_a_new_stream(engine):
    scripted, stream = engine
    scripted.wait_for = 2

    def malformed(context):
        bad = reply("a", [1])
        bad.infer_response.outputs[0].shape[:] = [1, 3]  # 3 tokens announced, 4 bytes sent
        yield bad

    scripted.script = malformed
    first, second = Call(stream, "a"), Call(stream, "b")
    assert isinstance(first.outcome()[-1], EngineStreamError)
    assert isinstance(second.outcome()[-1], EngineStreamError)
    scripted.wait_for = 1
    scripted.script = lambda context: [reply("c", [5], final=True)]
    assert Call(stream, "c").outcome() == [[[5]]]

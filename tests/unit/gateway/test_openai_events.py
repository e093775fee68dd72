"""The gateway's per-chunk pieces: the streamed text events, written from a template once per request, equal
the events built from the chunk's dict (same JSON, same escaping, for both endpoints); the outputs it asks
for are the contract's; an error from the repository gets its HTTP status. And what a real gateway (uvicorn)
streams and counts in front of a test double of Triton's gRPC service that answers every request alike."""

import json
import logging
import threading
import urllib.error
import urllib.request

import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.clients.client import GenerationError, ResponseTimeout, ServerUnavailable
from tritonforge.facts.contract import CLIENT_OUTPUTS, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS, TEXT_OUTPUT
from tritonforge.gateway.options import GatewayThread
from tritonforge.gateway.protocol import TextEvents as _TextEvents
from tritonforge.gateway.protocol import sse_event as _sse
from tritonforge.gateway.protocol import stream_chunk as _chunk
from tritonforge.gateway.serving import GATEWAY_OUTPUTS
from tritonforge.gateway.serving import to_openai_error as _triton_error
from tritonforge.serve.ports import free_port


@pytest.mark.parametrize("kind", ["completions", "chat"])
@pytest.mark.parametrize("text", ["plain", 'quote " and \\ backslash', "line\nbreak\ttab", "é 中文 😀", "\x00"])
def test_text_event_is_the_chunk_as_json(kind, text):
    model = 'served "name"'
    event = _TextEvents(kind, "cmpl-abc", 1700000000, model)(text)
    assert event == _sse(_chunk(kind, "cmpl-abc", 1700000000, model, text, None))
    payload = json.loads(event.removeprefix("data: "))
    choice = payload["choices"][0]
    assert (choice["text"] if kind == "completions" else choice["delta"]["content"]) == text


def test_the_outputs_the_gateway_requests_are_the_ensembles_and_the_bls():
    assert set(GATEWAY_OUTPUTS) <= {tensor.name for tensor in CLIENT_OUTPUTS}


@pytest.mark.parametrize("error, status", [
    (ResponseTimeout("tensorrt_llm_bls", 300), 504),  # the server went silent
    (GenerationError("max_tokens: must be >= 1"), 400),  # the request is at fault
    (GenerationError("Stub process is not healthy"), 500),
    (GenerationError("the engine queue is full (8 waiting)"), 503),
    (GenerationError("in ensemble 'ensemble', text_input: has 602 tokens, more than the maximum input length 64"),
     400),
    (GenerationError("unavailable: the engine queue is full (8 waiting)"), 503),
    (GenerationError("CUDA error: an illegal memory access was encountered"), 500),  # the engine crashed
    (GenerationError("note: an answer of no kind we know"), 500)])  # the server's failure, not the client's
def test_an_error_from_the_repository_gets_its_http_status(error, status):
    answer = _triton_error(error)
    assert answer.status == status
    assert answer.kind == ("invalid_request_error" if status == 400 else "server_error")
    assert answer.message == str(error)  # a bad request's names its field


@pytest.mark.parametrize("endpoint, answered, says, param", [
    ("/v1/completions", "text_input: has 100000 characters", "prompt: has 100000 characters", "prompt"),
    ("/v1/completions", "in ensemble 'ensemble', text_input: has 602 tokens", "prompt: has 602 tokens", "prompt"),
    ("/v1/chat/completions", "messages: renders to 2000 tokens", "messages: renders to 2000 tokens", "messages"),
    ("/v1/responses", "messages: renders to 2000 tokens", "input: renders to 2000 tokens", "input"),
    ("/v1/chat/completions", "max_tokens: must be in [1, 960], got 4000", "max_tokens: must be in [1, 960], got 4000",
     "max_tokens")])
def test_a_refusal_of_the_repository_names_the_field_the_client_sent(endpoint, answered, says, param):
    answer = _triton_error(GenerationError(answered), endpoint)
    assert (answer.status, answer.message, answer.param) == (400, says, param)


def test_a_server_that_cannot_be_reached_is_503():
    assert _triton_error(ServerUnavailable("127.0.0.1:1", "gRPC", "Connection refused")).status == 503


@pytest.mark.parametrize(("kind", "obj"), [("completions", "text_completion"), ("chat", "chat.completion")])
def test_a_whole_answer_is_openais_object_with_its_usage(kind, obj):
    from tritonforge.gateway.protocol import Generation
    from tritonforge.gateway.protocol import whole_response as _whole

    generation = Generation(max_tokens=4, prompt_tokens=3, completion_tokens=2, chunks=["Hel", "lo"])
    whole = _whole(kind, "id-1", 1700000000, "tiny", [generation])
    assert (whole["object"], whole["model"], whole["id"]) == (obj, "tiny", "id-1")
    (choice,) = whole["choices"]
    assert (choice["text"] if kind == "completions" else choice["message"]) == (
        "Hello" if kind == "completions" else {"role": "assistant", "content": "Hello"})
    assert choice["finish_reason"] == "stop"  # 2 of 4 tokens
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_a_streamed_chats_first_chunk_says_who_speaks_and_the_others_only_what():
    first = _chunk("chat", "id-1", 1700000000, "tiny", "Hel", None, role=True)
    later = _chunk("chat", "id-1", 1700000000, "tiny", "lo", None)
    assert first["object"] == later["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert later["choices"][0]["delta"] == {"content": "lo"}


def test_the_gateways_latency_histograms_time_the_first_chunk_and_each_gap(monkeypatch):
    """A stream received at 1.0 s with chunks at 1.5, 1.7 and 2.2 s (a scripted clock): time to first chunk
    0.5 s, then gaps of 0.2 and 0.5 s, each from the chunk before."""
    from tritonforge.gateway import metrics as gateway_metrics
    from tritonforge.gateway.metrics import ITL_METRIC, TTFT_METRIC, GatewayMetrics

    clock = iter([1.0, 1.5, 1.7, 2.2])
    monkeypatch.setattr(gateway_metrics.time, "perf_counter", lambda: next(clock))
    metrics = GatewayMetrics("m")
    timer = metrics.timer()
    for _ in range(3):
        timer.chunk()

    def sample(name, suffix):
        return metrics.registry.get_sample_value(f"{name}_{suffix}")

    assert (sample(TTFT_METRIC, "count"), sample(TTFT_METRIC, "sum")) == (1, 0.5)
    assert sample(ITL_METRIC, "count") == 2 and abs(sample(ITL_METRIC, "sum") - 0.7) < 1e-9


def _answer_chunk(text: str, final: bool) -> service_pb2.ModelStreamInferResponse:
    """One streamed response of the BLS: a chunk of text, its one token, and the prompt's 3 tokens."""
    message = service_pb2.ModelStreamInferResponse()
    response = message.infer_response
    data = text.encode("utf-8")
    response.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1])
    response.raw_output_contents.append(len(data).to_bytes(4, "little") + data)
    for name, value in ((NUM_INPUT_TOKENS, 3), (NUM_OUTPUT_TOKENS, 1)):
        response.outputs.add(name=name, datatype="INT32", shape=[1, 1])
        response.raw_output_contents.append(value.to_bytes(4, "little"))
    response.parameters["triton_final_response"].bool_param = final
    return message


class AnsweringHello(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers every request "Hel", "lo": two tokens of a 3-token prompt, the second response final."""

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for _ in request_iterator:
            yield _answer_chunk("Hel", final=False)
            yield _answer_chunk("lo", final=True)


@pytest.fixture()
def gateway():
    with serving_grpc(AnsweringHello()) as url:
        gateway = GatewayThread(url, port=free_port(), served_model_name="tiny").start()
        try:
            yield gateway
        finally:
            gateway.stop()


def _post(gateway, path: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(f"{gateway.base_url}{path}", method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def test_a_streamed_chat_ends_with_an_empty_delta_then_a_usage_chunk_without_choices(gateway):
    """OpenAI's shape: the finishing chunk's delta is {}, and the usage chunk has `choices: []` (the `openai`
    client reads `chunk.choices` of every chunk)."""
    status, body = _post(gateway, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    *events, done = [event.removeprefix("data: ") for event in body.split("\n\n") if event]
    assert done == "[DONE]"
    *text, finish, usage = [json.loads(event) for event in events]
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in text) == "Hello"
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2,
                                                         "total_tokens": 5}


def test_the_metrics_count_requests_by_status_and_tokens_and_a_refused_request_is_never_in_flight(gateway):
    from prometheus_client.parser import text_string_to_metric_families

    assert _post(gateway, "/v1/completions", {"model": "tiny", "prompt": "Hi", "temperature": 5})[0] == 400
    assert _post(gateway, "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 8})[0] == 200
    with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=30) as answer:
        families = text_string_to_metric_families(answer.read().decode("utf-8"))
        samples = {(sample.name, sample.labels.get("status")): sample.value
                   for family in families for sample in family.samples}
    assert samples[("tritonforge_requests_total", "400")] == samples[("tritonforge_requests_total", "200")] == 1
    assert samples[("tritonforge_requests_in_flight", None)] == 0
    assert samples[("tritonforge_prompt_tokens_total", None)] == 3
    assert samples[("tritonforge_completion_tokens_total", None)] == 2


class AnsweringWithThoughts(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers every request with a thought, then its answer, in pieces that cut both tags."""

    PIECES = ("<thi", "nk>plan</th", "ink>\n\nThe ", "answer.")

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for _ in request_iterator:
            for number, piece in enumerate(self.PIECES):
                yield _answer_chunk(piece, final=number == len(self.PIECES) - 1)


def test_with_a_reasoning_parser_a_chats_thinking_is_its_reasoning_content_whole_and_streamed():
    with serving_grpc(AnsweringWithThoughts()) as url:
        gateway = GatewayThread(url, port=free_port(), served_model_name="tiny", reasoning_parser="qwen3").start()
        try:
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}
            status, body = _post(gateway, "/v1/chat/completions", chat)
            message = json.loads(body)["choices"][0]["message"]
            status, streamed = _post(gateway, "/v1/chat/completions", {**chat, "stream": True})
            completion = _post(gateway, "/v1/completions", {"model": "tiny", "prompt": "Hi"})[1]
        finally:
            gateway.stop()
    assert status == 200 and (message["reasoning_content"], message["content"]) == ("plan", "The answer.")
    deltas = [json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
              for line in streamed.splitlines() if line.startswith("data: {")]
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == "plan"
    assert "".join(delta.get("content") or "" for delta in deltas) == "The answer."
    assert json.loads(completion)["choices"][0]["text"] == "<think>plan</think>\n\nThe answer."  # chat's alone


class AnsweringForEver(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each request one chunk, then holds its stream open until the client cancels it; counts the
    cancels it sees."""

    def __init__(self):
        self.cancelled = threading.Semaphore(0)

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        ended = threading.Event()
        context.add_callback(lambda: (ended.set(), self.cancelled.release()))
        for _ in request_iterator:
            yield _answer_chunk("Hel", final=False)
            ended.wait(30)
            return


def test_a_client_that_leaves_a_stream_of_several_choices_cancels_each_choices_request(caplog):
    servicer = AnsweringForEver()
    with serving_grpc(servicer) as url:
        gateway = GatewayThread(url, port=free_port(), served_model_name="tiny").start()
        try:
            body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "n": 2,
                               "stream": True}).encode()
            request = urllib.request.Request(f"{gateway.base_url}/v1/chat/completions", method="POST", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.readline().startswith(b"data: ")  # the stream is under way; then the client leaves
            assert servicer.cancelled.acquire(timeout=30) and servicer.cancelled.acquire(timeout=30)
        finally:
            gateway.stop()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR
                and not _grpc_poller_of_a_closed_loop(record)], caplog.text


def _grpc_poller_of_a_closed_loop(record: logging.LogRecord) -> bool:
    """grpc.aio's poller, shared by the process, still bound to the closed event loop of an earlier module's
    gateway (grpcio keeps it while any channel of that loop lives): not this gateway's doing."""
    return (record.name == "asyncio" and "PollerCompletionQueue" in record.getMessage()
            and "Event loop is closed" in (record.exc_text or "") + str(record.exc_info and record.exc_info[1]))

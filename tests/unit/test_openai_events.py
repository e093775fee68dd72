"""The gateway's per-chunk pieces: the streamed text events, written from a template once per request, equal
the events built from the chunk's dict (same JSON, same escaping, for both endpoints); the outputs it asks
for are the contract's; an error from the repository gets its HTTP status."""

import json

import pytest

from tritonforge.clients.client import GenerationError, ResponseTimeout, ServerUnavailable
from tritonforge.clients.openai_gateway import GATEWAY_OUTPUTS, _chunk, _sse, _TextEvents, _triton_error
from tritonforge.spec.contract import CLIENT_OUTPUTS


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


def test_a_server_that_cannot_be_reached_is_503():
    assert _triton_error(ServerUnavailable("127.0.0.1:1", "gRPC", "Connection refused")).status == 503


@pytest.mark.parametrize(("kind", "obj"), [("completions", "text_completion"), ("chat", "chat.completion")])
def test_a_whole_answer_is_openais_object_with_its_usage(kind, obj):
    from tritonforge.clients.openai_gateway import Generation, _whole

    generation = Generation(max_tokens=4, prompt_tokens=3, completion_tokens=2, chunks=["Hel", "lo"])
    whole = _whole(kind, "id-1", 1700000000, "tiny", generation)
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
    from tritonforge.clients import gateway_metrics
    from tritonforge.clients.gateway_metrics import ITL_METRIC, TTFT_METRIC, GatewayMetrics

    clock = iter([1.0, 1.5, 1.7, 2.2])
    monkeypatch.setattr(gateway_metrics.time, "perf_counter", lambda: next(clock))
    metrics = GatewayMetrics()
    timer = metrics.timer()
    for _ in range(3):
        timer.chunk()

    def sample(name, suffix):
        return metrics.registry.get_sample_value(f"{name}_{suffix}")

    assert (sample(TTFT_METRIC, "count"), sample(TTFT_METRIC, "sum")) == (1, 0.5)
    assert sample(ITL_METRIC, "count") == 2 and abs(sample(ITL_METRIC, "sum") - 0.7) < 1e-9

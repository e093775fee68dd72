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

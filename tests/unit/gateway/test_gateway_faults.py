"""The OpenAI gateway when the repository fails it: a stream whose engine fails midway keeps the text it had
and ends with OpenAI's error event (which the real `openai` client raises), then `[DONE]`; `/health` is 503
until the model, not only the server, is ready. The gateway runs for real (uvicorn, the real `openai` client
over HTTP); the far end is a test double of Triton's gRPC service that answers from a script."""

import json
import sys
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.facts.contract import NUM_OUTPUT_TOKENS, TEXT_OUTPUT
from tritonforge.gateway.options import GatewayThread
from tritonforge.serve.ports import free_port

ENGINE_FAILURE = "CUDA error: an illegal memory access was encountered"


def text_response(text: str) -> service_pb2.ModelStreamInferResponse:
    """One streamed response of the ensemble: a chunk of text and its one token."""
    message = service_pb2.ModelStreamInferResponse()
    response = message.infer_response
    data = text.encode("utf-8")
    response.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(len(data).to_bytes(4, "little") + data)
    response.outputs.add(name=NUM_OUTPUT_TOKENS, datatype="INT32", shape=[1, 1])
    response.raw_output_contents.append(np.array([1], dtype=np.int32).tobytes())
    response.parameters["triton_final_response"].bool_param = False
    return message


class FailingMidway(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Streams two chunks of every request, then the engine's error; ready as its `model_ready` says."""

    model_ready = True

    def ServerReady(self, request, context):  # noqa: N802 - the gRPC method's name
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):  # noqa: N802
        return service_pb2.ModelReadyResponse(ready=self.model_ready)

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        for _ in request_iterator:
            yield text_response("Hel")
            yield text_response("lo")
            yield service_pb2.ModelStreamInferResponse(error_message=ENGINE_FAILURE)


@pytest.fixture(scope="module")
def repository():
    triton = FailingMidway()
    with serving_grpc(triton) as url:
        gateway = GatewayThread(url, port=free_port(), model="ensemble", served_model_name="tiny").start()
        try:
            yield triton, gateway
        finally:
            gateway.stop()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_an_engine_failing_midway_ends_the_stream_with_an_error_after_its_text(repository, endpoint):
    _, gateway = repository
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    if endpoint == "completions":
        stream = client.completions.create(model="tiny", prompt="Say hello", max_tokens=8, stream=True)
        text_of = lambda chunk: chunk.choices[0].text  # noqa: E731
    else:
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Say hello"}],
                                                max_tokens=8, stream=True)
        text_of = lambda chunk: chunk.choices[0].delta.content or ""  # noqa: E731
    texts = []
    with pytest.raises(openai.APIError, match="illegal memory access") as raised:
        for chunk in stream:
            assert chunk.choices[0].finish_reason is None, "a failed stream said it finished"
            texts.append(text_of(chunk))
    assert "".join(texts) == "Hello"
    assert raised.value.type == "server_error"


def test_a_raw_stream_that_fails_still_ends_with_done(repository):
    _, gateway = repository
    request = urllib.request.Request(f"{gateway.base_url}/v1/completions", method="POST",
                                     data=b'{"model": "tiny", "prompt": "Say hello", "stream": true}',
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        events = [line for line in answer.read().decode("utf-8").split("\n\n") if line]
    assert '"error"' in events[-2] and ENGINE_FAILURE in events[-2]
    assert events[-1] == "data: [DONE]"


@pytest.mark.parametrize("model_ready, status", [(True, 200), (False, 503)])
def test_health_needs_the_model_ready_not_only_the_server(repository, model_ready, status):
    triton, gateway = repository
    triton.model_ready = model_ready
    try:
        with urllib.request.urlopen(f"{gateway.base_url}/health", timeout=30) as answer:
            answered = answer.status
    except urllib.error.HTTPError as error:
        answered = error.code
    finally:
        triton.model_ready = True
    assert answered == status


def test_a_failure_of_the_gateway_itself_is_a_500_with_openais_error_object_naming_it(repository, monkeypatch):
    """What once failed every grammar-guided request of a `serve CHECKPOINT` that had just built (xgrammar could not
    import torch): whatever the gateway fails on, the client reads OpenAI's error object, not plain text."""
    _, gateway = repository
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` fails, as it did without torch
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}}
    request = urllib.request.Request(f"{gateway.base_url}/v1/chat/completions", method="POST",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(request, timeout=30)
    assert failed.value.code == 500
    error = json.loads(failed.value.read())["error"]
    assert error["type"] == "server_error" and "ModuleNotFoundError" in error["message"], error
    with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=30) as answer:
        assert 'status="500"' in answer.read().decode()

"""The gateway asks the BLS for fewer, larger streamed chunks (its stream interval), and only where it can:
a streamed request to the BLS, never the ensemble (which has no such input) or a whole answer."""

import asyncio
import json

import pytest

from tritonforge.clients.client import GenerateRequest
from tritonforge.facts.contract import BLS_MODEL, ENSEMBLE_MODEL, STREAM_INTERVAL
from tritonforge.gateway.metrics import GatewayMetrics
from tritonforge.gateway.serving import DEFAULT_STREAM_INTERVAL, OpenAIServing


class RecordingBackendDouble:
    """A test double of the gateway's Triton backend: records each request and answers one chunk."""

    def __init__(self):
        self.requests: list[GenerateRequest] = []

    async def generate(self, request, generation):
        self.requests.append(request)
        generation.output_tokens = 1
        yield "x"


def asked(model: str, stream: bool, stream_interval: int = DEFAULT_STREAM_INTERVAL) -> GenerateRequest:
    serving = OpenAIServing("localhost:1", model=model, served_model_name="m", metrics=GatewayMetrics("m"),
                            stream_interval=stream_interval)
    serving._backend = backend = RecordingBackendDouble()
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4, "stream": stream}).encode()

    async def answer():
        result = await serving.answer("completions", body)
        if stream:
            return [event async for event in result]
        return result

    asyncio.run(answer())
    return backend.requests[0]


def test_a_streamed_request_to_the_bls_carries_the_gateways_stream_interval():
    request = asked(BLS_MODEL, stream=True)
    assert request.stream_interval == DEFAULT_STREAM_INTERVAL > 1
    assert request.values(stream=True)[STREAM_INTERVAL] == DEFAULT_STREAM_INTERVAL


@pytest.mark.parametrize("model, stream, interval", [(ENSEMBLE_MODEL, True, 4), (BLS_MODEL, False, 4),
                                                     (BLS_MODEL, True, 1)])
def test_no_stream_interval_goes_where_it_means_nothing(model, stream, interval):
    request = asked(model, stream, interval)
    assert request.stream_interval is None and STREAM_INTERVAL not in request.values(stream)

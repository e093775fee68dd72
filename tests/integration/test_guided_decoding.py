"""Guided decoding on a real tritonserver: guided requests through the ensemble (gRPC and HTTP) and the BLS, to
the transformers engine, on a random-weight model whose answers follow only because the grammar holds them."""

from __future__ import annotations

import json
import re

import pytest

from tritonforge.clients.client import GenerationError, GrpcClient, HttpClient
from tritonforge.facts.errors import ErrorKind

from .conftest import serve_tiny

COLOURS = ["red", "green", "blue"]


def is_colour(text: str) -> bool:
    try:
        return json.loads(text) in COLOURS
    except ValueError:
        return False


# Grammars every answer ends within: no whitespace a random model could repeat for ever.
REGEX = r"[ab]{3}-\d{2}"
EBNF = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
GUIDES = {
    "regex": ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": REGEX},
              lambda text: re.fullmatch(REGEX, text)),
    "ebnf_grammar": ({"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": EBNF},
                     lambda text: re.fullmatch(r"(yes|no) \d\d?", text)),
    "json_schema": ({"guided_decoding_guide_type": "json_schema",
                     "guided_decoding_guide": json.dumps({"enum": COLOURS})}, is_colour),
}
MAX_TOKENS = 48  # more than any answer above takes: each ends with its grammar, not at max_tokens
PROMPT = "The engine"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    server = serve_tiny(tiny_models["bpe"], tmp_path_factory.mktemp("guided") / "repo", preprocessing_instances=1,
                        postprocessing_instances=1)
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["ensemble", "tensorrt_llm_bls"])
def client(server, request):
    client = GrpcClient(server.grpc_url, request.param)
    yield client
    client.close()


@pytest.mark.parametrize("guide", GUIDES)
def test_a_guided_answer_follows_its_grammar_whole_and_streamed(client, guide):
    inputs, matches = GUIDES[guide]
    text = client.generate(PROMPT, max_tokens=MAX_TOKENS, **inputs)
    assert matches(text), text
    assert "".join(client.stream(PROMPT, max_tokens=MAX_TOKENS, **inputs)) == text
    # Unguided, the same prompt is the random model's text: the grammar made the difference.
    assert not matches(client.generate(PROMPT, max_tokens=MAX_TOKENS))


def test_the_http_generate_endpoint_takes_the_guide_as_json_strings(server):
    inputs, matches = GUIDES["regex"]
    text = HttpClient(server.http_url).generate(PROMPT, max_tokens=MAX_TOKENS, **inputs)
    assert matches(text), text


@pytest.mark.parametrize(("inputs", "field"), [
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "([a-"}, "guided_decoding_guide"),
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{not json"}, "guided_decoding_guide"),
    ({"guided_decoding_guide_type": "ebnf", "guided_decoding_guide": 'root ::= "a"'}, "guided_decoding_guide_type"),
])
def test_a_guide_that_does_not_compile_is_the_requests_error_and_the_next_request_is_served(client, inputs, field):
    with pytest.raises(GenerationError, match=f"{field}: ") as raised:
        client.generate(PROMPT, max_tokens=MAX_TOKENS, **inputs)
    assert raised.value.kind is ErrorKind.CLIENT
    guided, matches = GUIDES["regex"]
    assert matches(client.generate(PROMPT, max_tokens=MAX_TOKENS, **guided))

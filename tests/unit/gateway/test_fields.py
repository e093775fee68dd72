"""The table of request fields (`gateway/fields.py`, which docs/reference/openai.md is generated from) holds to the
code: every example, sent to every endpoint its entry names, is served or refused (400 naming the field) as the
table says; no field the readers check or refuse is missing from it; its options are `tritonforge openai`'s."""

import pytest

from tritonforge.gateway import protocol, responses_api
from tritonforge.gateway.errors import OpenAIError
from tritonforge.gateway.fields import CHAT, COMPLETIONS, ENDPOINTS, FIELDS, OPTIONS, RESPONSES, merged
from tritonforge.gateway.serving import SERVED_MODEL_NAME

BASE = {COMPLETIONS: {"prompt": "Hello"}, CHAT: {"messages": [{"role": "user", "content": "Hello"}]},
        RESPONSES: {"input": "Hello"}}
CASES = [pytest.param(entry, endpoint, id=f"{endpoint}:{entry.name}")
         for entry in FIELDS for endpoint in entry.endpoints]


def read(endpoint: str, body: dict) -> protocol.OpenAIRequest:
    """The request `body` makes at `endpoint`, as the gateway reads it (a response as the chat it amounts to)."""
    if endpoint == RESPONSES:
        return protocol.read_request(responses_api.chat_body_from_responses(body), CHAT, SERVED_MODEL_NAME)
    return protocol.read_request(body, endpoint, SERVED_MODEL_NAME)


@pytest.mark.parametrize(("entry", "endpoint"), CASES)
def test_each_example_is_served_or_refused_naming_its_field_as_the_table_says(entry, endpoint):
    body = merged(BASE[endpoint], entry.fragment())
    if entry.served:
        read(endpoint, body)
        return
    with pytest.raises(OpenAIError) as refusal:
        read(endpoint, body)
    assert (refusal.value.status, refusal.value.param) == (400, entry.refusal_param), refusal.value.message
    assert entry.refusal_param.startswith(entry.name) or entry.name.startswith(entry.refusal_param + ".")


def test_every_field_the_readers_check_or_refuse_is_in_the_table():
    named = {(entry.name, endpoint) for entry in FIELDS for endpoint in entry.endpoints}
    for name in protocol.SAMPLING_RANGES:
        assert (name, COMPLETIONS) in named and (name, CHAT) in named, name
    for name in protocol.UNSUPPORTED_FIELDS:
        assert {(name, COMPLETIONS), (name, CHAT)} & named, name
    for name in responses_api.STATEFUL_FIELDS:
        assert (name, RESPONSES) in named, name


def test_each_field_is_stated_once_per_endpoint_and_only_a_refusal_names_a_param():
    pairs = [(entry.name, endpoint) for entry in FIELDS for endpoint in entry.endpoints]
    assert len(pairs) == len(set(pairs))
    for entry in FIELDS:
        assert entry.endpoints and set(entry.endpoints) <= set(ENDPOINTS), entry.name
        assert not (entry.served and entry.param), entry.name
        assert entry.does.endswith("."), entry.name


def test_the_options_stated_are_flags_of_tritonforge_openai():
    from tritonforge.cli import make_parser
    from tritonforge.cli.reference_docs import subcommands

    commands, _ = subcommands(make_parser())
    flags = {flag for action in commands["openai"]._actions for flag in action.option_strings}
    assert {option.flag for option in OPTIONS} <= flags

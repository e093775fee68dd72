"""How the OpenAI gateway reads a request body: OpenAI's defaults and ranges, what it refuses, and what it asks
the repository for; and how it counts a streamed answer's tokens."""

import asyncio
from types import SimpleNamespace

import pytest

from tritonforge.facts.contract import (
    BLS_MODEL,
    FREQUENCY_PENALTY,
    GUIDED_DECODING_GUIDE,
    GUIDED_DECODING_GUIDE_TYPE,
    LORA_TASK_ID,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    PRESENCE_PENALTY,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    SEED,
    STOP_WORDS,
    TEMPERATURE,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
)
from tritonforge.gateway.protocol import Generation, OpenAIError, read_request
from tritonforge.gateway.serving import WHOLE_DISTRIBUTION_TOP_P, TritonBackend, choice_requests

PROMPT = {"prompt": "Hello"}
CHAT = {"messages": [{"role": "user", "content": "Hello"}]}


def parse_request(body, kind, served_model_name=None):
    """(The repository's request of the first choice, stream?, include usage?)."""
    request = read_request(body, kind, served_model_name)
    return choice_requests(request)[0][1], request.stream, request.include_usage


def refused(body, kind="completions", served_model_name=None) -> OpenAIError:
    with pytest.raises(OpenAIError) as error:
        parse_request(body, kind, served_model_name)
    return error.value


def test_max_tokens_defaults_to_openais_16_for_completions_and_256_for_chat():
    assert parse_request(PROMPT, "completions")[0].max_tokens == 16
    assert parse_request(CHAT, "chat")[0].max_tokens == 256


def test_max_completion_tokens_takes_precedence_over_the_deprecated_max_tokens():
    request, _, _ = parse_request({**CHAT, "max_completion_tokens": 7, "max_tokens": 30}, "chat")
    assert request.max_tokens == 7


@pytest.mark.parametrize(("name", "value", "field"), [
    ("temperature", 2.0, TEMPERATURE), ("temperature", 0.01, TEMPERATURE),
    ("presence_penalty", -2.0, PRESENCE_PENALTY), ("presence_penalty", 2.0, PRESENCE_PENALTY),
    ("frequency_penalty", -2.0, FREQUENCY_PENALTY), ("frequency_penalty", 2.0, FREQUENCY_PENALTY),
    ("top_k", 0, TOP_K),  # 0: no top-k limit
])
def test_openais_range_ends_are_accepted(name, value, field):
    assert parse_request({**PROMPT, name: value}, "completions")[0].parameters[field] == value


@pytest.mark.parametrize(("name", "value"), [("temperature", 2.01), ("temperature", -0.1), ("presence_penalty", -2.1),
                                             ("top_p", 1.1), ("max_tokens", 0), ("max_tokens", 2.5),
                                             ("max_tokens", True), ("temperature", "1"),
                                             # the engine reads top_p <= 0 as unset: it must never get there
                                             ("top_p", -0.5), ("repetition_penalty", -1.0), ("min_tokens", -1)])
def test_a_value_out_of_range_or_of_the_wrong_type_is_400_naming_it(name, value):
    error = refused({**PROMPT, name: value})
    assert (error.status, error.param) == (400, name)


@pytest.mark.parametrize(("name", "value", "says"), [("max_tokens", 0, "'max_tokens' must be at least 1, got 0"),
                                                    ("n", 17, "'n' must be in [1, 16], got 17"),
                                                    ("top_k", -1, "'top_k' must be at least 0, got -1")])
def test_a_range_open_at_one_end_is_said_in_words(name, value, says):
    assert refused({**PROMPT, name: value}).message == says


def test_up_to_four_stop_strings_are_sent_as_stop_words_and_a_fifth_is_refused():
    stops = ["a", "b", "c", "d"]
    assert parse_request({**PROMPT, "stop": stops}, "completions")[0].parameters[STOP_WORDS] == stops
    assert parse_request({**PROMPT, "stop": "end"}, "completions")[0].parameters[STOP_WORDS] == ["end"]
    assert refused({**PROMPT, "stop": [*stops, "e"]}).param == "stop"


@pytest.mark.parametrize("stop", ["", ["a", ""], [1]])
def test_an_empty_or_non_string_stop_is_refused(stop):
    assert refused({**PROMPT, "stop": stop}).param == "stop"


def test_a_negative_seed_is_refused_and_zero_is_a_seed():
    assert refused({**PROMPT, "seed": -1}).param == "seed"
    assert parse_request({**PROMPT, "seed": 0}, "completions")[0].parameters[SEED] == 0


@pytest.mark.parametrize("response_format", [{"type": "json_schema", "json_schema": {}}, "text", {"type": "xml"}])
def test_a_response_format_that_is_not_openais_is_refused(response_format):
    assert refused({**PROMPT, "response_format": response_format}).param.startswith("response_format")
    assert GUIDED_DECODING_GUIDE_TYPE not in parse_request({**PROMPT, "response_format": {"type": "text"}},
                                                           "completions")[0].parameters


def test_a_json_response_format_is_sent_as_the_engines_guide():
    parameters = parse_request({**PROMPT, "response_format": {"type": "json_object"}}, "completions")[0].parameters
    assert parameters[GUIDED_DECODING_GUIDE_TYPE] == "ebnf_grammar" and parameters[GUIDED_DECODING_GUIDE]


def test_a_request_that_says_nothing_is_sampled_at_temperature_one_over_the_whole_distribution():
    parameters = parse_request(PROMPT, "completions")[0].parameters
    assert (parameters[TEMPERATURE], parameters[TOP_P]) == (1.0, WHOLE_DISTRIBUTION_TOP_P)
    assert TOP_K not in parameters


@pytest.mark.parametrize("greedy", [{"temperature": 0}, {"top_p": 0}, {"top_k": 1}])
def test_temperature_zero_or_a_single_candidate_is_greedy(greedy):
    parameters = parse_request({**PROMPT, **greedy}, "completions")[0].parameters
    assert parameters[TOP_K] == 1 and TEMPERATURE not in parameters and TOP_P not in parameters


def test_n_choices_are_n_requests_whose_seeds_follow_the_requests():
    request = read_request({**PROMPT, "n": 3, "seed": 2**64 - 2}, "completions")
    choices = choice_requests(request)
    assert [generation.index for generation, _ in choices] == [0, 1, 2]
    assert [generate.parameters[SEED] for _, generate in choices] == [2**64 - 2, 2**64 - 1, 0]


def test_a_completions_list_of_prompts_is_a_choice_per_prompt_and_n_each():
    choices = choice_requests(read_request({"prompt": ["Hello", "again"], "n": 2}, "completions"))
    assert [(generation.prompt_index, generate.text_input) for generation, generate in choices] == [
        (0, "Hello"), (0, "Hello"), (1, "again"), (1, "again")]


def test_tools_go_to_preprocessing_with_the_messages_and_tool_turns_keep_their_fields():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    generate = parse_request({"messages": messages, "tools": [tool]}, "chat")[0]
    assert generate.messages["messages"] == messages
    assert [one["function"]["name"] for one in generate.messages["tools"]] == ["get_weather"]
    assert GUIDED_DECODING_GUIDE_TYPE not in generate.parameters  # auto: the model chooses


def test_a_forced_tool_call_is_guided():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        generate = parse_request({**CHAT, "tools": [tool], "tool_choice": choice}, "chat")[0]
        assert generate.parameters[GUIDED_DECODING_GUIDE_TYPE] == "ebnf_grammar"


def test_a_tool_result_without_its_call_id_is_400_naming_messages():
    error = refused({"messages": [{"role": "tool", "content": "sunny"}]}, "chat")
    assert (error.param, str(error)) == ("messages", "messages[0].tool_call_id must be a string")


def test_text_content_parts_are_joined_as_one_content_and_an_image_part_is_refused():
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    request, _, _ = parse_request({"messages": [{"role": "user", "content": parts}]}, "chat")
    assert request.messages == [{"role": "user", "content": "Hello, world"}]
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    error = refused({"messages": [{"role": "user", "content": [parts[0], image]}]}, "chat")
    assert (error.param, str(error)) == ("messages", "messages[0]: only text content parts are supported")


def test_n_up_to_its_limit_is_served_and_best_of_is_refused():
    parse_request({**PROMPT, "n": 16, "best_of": 1}, "completions")
    assert refused({**PROMPT, "n": 17}).param == "n"
    assert refused({"prompt": ["a", "b", "c"], "n": 6}).param == "n"
    assert refused({**PROMPT, "best_of": 3}).param == "best_of"


@pytest.mark.parametrize("name", ["logit_bias", "tools", "logprobs"])
def test_an_unsupported_field_sent_empty_asks_for_nothing_and_is_served(name):
    empty = {"logit_bias": {}, "tools": [], "logprobs": False}[name]
    assert parse_request({**PROMPT, name: empty}, "completions")[0].text_input == "Hello"


@pytest.mark.parametrize(("name", "value"), [("suffix", "!"), ("functions", [{"name": "f"}])])
def test_an_unsupported_field_that_asks_for_something_is_refused_naming_it(name, value):
    assert refused({**PROMPT, name: value}).param == name


@pytest.mark.parametrize(("body", "kind", "asked"), [
    ({"logprobs": 3}, "completions", 3), ({"logprobs": 0}, "completions", 0),
    ({"logprobs": False}, "completions", None),
    ({"logprobs": True}, "chat", 0), ({"logprobs": True, "top_logprobs": 20}, "chat", 20),
    ({"logprobs": False}, "chat", None), ({"top_logprobs": 0}, "chat", None)])
def test_log_probabilities_ask_the_bls_for_each_token_and_that_many_alternatives(body, kind, asked):
    base = PROMPT if kind == "completions" else CHAT
    generate, _, _ = parse_request({**base, **body}, kind)
    assert generate.parameters.get("num_top_log_probs") == asked


@pytest.mark.parametrize(("body", "kind", "param", "message"), [
    ({"logprobs": True}, "completions", "logprobs", "'logprobs' must be an integer"),
    ({"logprobs": 21}, "completions", "logprobs", "'logprobs' must be in [0, 20], got 21"),
    ({"logprobs": 2}, "chat", "logprobs", "'logprobs' must be true or false"),
    ({"top_logprobs": 3}, "chat", "top_logprobs", "'top_logprobs' needs 'logprobs' to be true"),
    ({"logprobs": True, "top_logprobs": 21}, "chat", "top_logprobs", "'top_logprobs' must be in [0, 20], got 21")])
def test_a_bad_log_probability_field_is_refused_naming_it(body, kind, param, message):
    base = PROMPT if kind == "completions" else CHAT
    error = refused({**base, **body}, kind)
    assert (error.param, str(error)) == (param, message)


def test_a_message_without_a_role_is_400_naming_messages():
    error = refused({"messages": [{"content": "Hello"}]}, "chat")
    assert (error.status, error.param) == (400, "messages")


def test_echo_with_log_probs_asks_for_the_prompts_and_max_tokens_0_asks_one_token_not_shown():
    request = read_request({**PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}, "completions")
    ((generation, generate),) = choice_requests(request)
    assert generate.max_tokens == 1 and generation.prompt_only and generation.echo == "Hello"
    assert generate.parameters["return_prompt_log_probs"] is True and generate.parameters["num_top_log_probs"] == 1
    (plain, _), = choice_requests(read_request({**PROMPT, "echo": True}, "completions"))
    assert plain.echo == "Hello" and not plain.prompt_only and plain.max_tokens == 16
    assert refused({**PROMPT, "max_tokens": 0}).param == "max_tokens"  # no new token is asked only with echo
    assert refused({**PROMPT, "echo": "yes"}).param == "echo"


def test_a_prompt_given_as_a_list_of_one_string_is_that_prompt():
    assert parse_request({"prompt": ["Hello"]}, "completions")[0].text_input == "Hello"
    assert refused({"prompt": [[1, 2]]}).param == "prompt"


def test_another_model_than_the_served_one_is_404_model_not_found():
    error = refused({**PROMPT, "model": "gpt-4"}, served_model_name="tritonforge")
    assert (error.status, error.code) == (404, "model_not_found")
    parse_request({**PROMPT, "model": "tritonforge"}, "completions", "tritonforge")


def test_a_lora_adapters_name_asks_for_its_task_id_and_the_base_for_none():
    adapters = {"support": 1, "legal": 2}
    for model, task in (("legal", 2), ("support", 1), ("tritonforge", None), (None, None)):
        request = read_request({**CHAT, "model": model}, "chat", "tritonforge", adapters)
        assert choice_requests(request)[0][1].parameters.get(LORA_TASK_ID) == task, model
        assert request.model == model
    with pytest.raises(OpenAIError, match="serves 'tritonforge', 'support', 'legal'") as error:
        read_request({**CHAT, "model": "medical"}, "chat", "tritonforge", adapters)
    assert (error.value.status, error.value.code, error.value.param) == (404, "model_not_found", "model")


def test_the_model_list_shows_each_adapter_on_its_parent():
    from tritonforge.gateway.protocol import model_list

    listed = model_list("tritonforge", {"support": 1})["data"]
    assert [(entry["id"], entry.get("parent")) for entry in listed] == [("tritonforge", None),
                                                                        ("support", "tritonforge")]


@pytest.mark.parametrize(("specs", "message"), [
    (("a",), "expected NAME=TASK_ID"), (("a=x",), "expected NAME=TASK_ID"), (("a=1", "a=2"), "names 'a' twice"),
    (("tritonforge=1",), "the served model's own name")])
def test_bad_lora_modules_are_refused_in_one_line(specs, message):
    from tritonforge.gateway.options import GatewayOptions

    with pytest.raises(ValueError, match=message):
        GatewayOptions(url="localhost:1", served_model_name="tritonforge", lora_modules=specs)


def test_a_request_that_names_no_model_is_served_by_the_served_model():
    assert parse_request(PROMPT, "completions", "tritonforge")[0].text_input == "Hello"


def test_token_counts_are_always_asked_for_since_usage_and_finish_reason_come_from_them():
    parameters = parse_request(PROMPT, "completions")[0].parameters
    assert parameters[RETURN_NUM_INPUT_TOKENS] is True and parameters[RETURN_NUM_OUTPUT_TOKENS] is True


def test_stream_and_include_usage_are_read_from_the_body():
    assert parse_request(PROMPT, "completions")[1:] == (False, False)
    body = {**PROMPT, "stream": True, "stream_options": {"include_usage": True}}
    assert parse_request(body, "completions")[1:] == (True, True)


def test_an_answer_of_exactly_max_tokens_finished_by_length_and_a_shorter_one_by_stop():
    assert Generation(max_tokens=4, completion_tokens=4).finish_reason == "length"
    assert Generation(max_tokens=4, completion_tokens=3).finish_reason == "stop"


def _response(**outputs):
    """One streamed gRPC response as the gateway reads it: named outputs, each as raw tensor bytes."""
    def raw(value):
        if isinstance(value, str):
            return len(value.encode()).to_bytes(4, "little") + value.encode()
        return value.to_bytes(4, "little", signed=True)

    names = list(outputs)
    response = SimpleNamespace(outputs=[SimpleNamespace(name=name) for name in names],
                               raw_output_contents=[raw(outputs[name]) for name in names])
    return SimpleNamespace(get_response=lambda: response)


class _StreamingClient:
    def __init__(self, responses):
        self._responses = responses

    async def responses(self, request, outputs):
        for response in self._responses:
            yield response


def test_a_streamed_answers_completion_tokens_add_up_over_its_responses():
    backend = TritonBackend.__new__(TritonBackend)
    backend.model = BLS_MODEL
    backend.client = _StreamingClient([
        _response(**{TEXT_OUTPUT: "Hel", NUM_INPUT_TOKENS: 5, NUM_OUTPUT_TOKENS: 2}),
        _response(**{TEXT_OUTPUT: "lo", NUM_INPUT_TOKENS: 5, NUM_OUTPUT_TOKENS: 1})])
    generation = Generation(max_tokens=3)

    async def collect():
        return [text async for text in backend.generate(parse_request(PROMPT, "completions")[0], generation)]

    assert "".join(asyncio.run(collect())) == "Hello"
    assert generation.usage() == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert generation.finish_reason == "length"


def test_a_developer_message_is_a_system_one_for_the_chat_template():
    request, _, _ = parse_request({"messages": [{"role": "developer", "content": "Be brief."}, *CHAT["messages"]]},
                                  "chat")
    assert request.messages[0] == {"role": "system", "content": "Be brief."}


def test_chat_template_kwargs_that_would_change_the_call_are_400_naming_the_field():
    assert refused({**CHAT, "chat_template_kwargs": {"tokenize": True}}, "chat").param == "chat_template_kwargs"
    assert refused({**CHAT, "chat_template_kwargs": ["x"]}, "chat").param == "chat_template_kwargs"
    generate = parse_request({**CHAT, "chat_template_kwargs": {"enable_thinking": False}}, "chat")[0]
    assert generate.messages["chat_template_kwargs"] == {"enable_thinking": False}

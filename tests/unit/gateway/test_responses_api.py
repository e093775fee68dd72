"""The Responses API as translation to chat completions: a Responses request becomes the chat body that asks the
same, and every refusal names its Responses field; a chat answer becomes the `response` object, and its chunks
Responses' events, all valid against the openai SDK's own types; the streamed deltas add up to the texts done,
and the streamed response completed is the whole answer's. Then the openai SDK (its stream reader included) and
the Agents SDK, in front of an in-process gateway double over a fake engine, run a function tool round trip."""

import asyncio
import json
import re

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tritonforge.gateway.errors import OpenAIError
from tritonforge.gateway.responses_api import ResponseEvents, chat_body_from_responses, response_from_chat, sse

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "strict": True}
CHAT_WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER_TOOL["parameters"],
    "strict": True}}


def chat_answer(content=None, calls=(), finish_reason="stop", usage=(12, 5)):
    """A chat.completion as the gateway answers it; `calls`: (id, name, arguments) each."""
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}
                                 for ident, name, arguments in calls]
    return {"id": "chatcmpl-0123", "object": "chat.completion", "created": 1700000000, "model": "tiny",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def pieces(text, size):
    return [text[at:at + size] for at in range(0, len(text), size)]


def chunks_of(answer, text_piece=3, arguments_piece=4):
    """The chat.completion.chunk objects that stream `answer`, as OpenAI streams one: the role, the text in
    pieces, each tool call named in its first delta and its arguments in pieces, the finish, then the usage."""
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}
    message, choice = answer["choices"][0]["message"], answer["choices"][0]

    def chunk(delta, finish=None):
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    chunks += [chunk({"content": piece}) for piece in pieces(text, text_piece)]
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in pieces(arguments, arguments_piece)]
    chunks.append(chunk({}, choice["finish_reason"]))
    return chunks + [{**head, "choices": [], "usage": answer["usage"]}]


def stream_events(answer, body, **pieces):
    events = ResponseEvents(body, answer["model"])
    streamed = events.start()
    for chunk in chunks_of(answer, **pieces):
        streamed += events.push(chunk)
    return streamed + events.finish()


def without_ids(response: dict) -> dict:
    """`response` with its random part of the ids, and its timestamps, made equal."""
    text = re.sub(r"(resp|msg|fc)_[0-9a-f]{32}", r"\1_ID", json.dumps(response))
    return {**json.loads(text), "created_at": 0, "completed_at": None}


# --- requests ------------------------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_after_the_instructions_as_system():
    chat = chat_body_from_responses({"model": "tiny", "instructions": "Be brief.", "input": "Hi"})
    assert chat == {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}]}


def test_message_items_keep_their_roles_developer_becomes_system_and_text_parts_are_joined():
    chat = chat_body_from_responses({"input": [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "More rules."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello, "}, {"type": "input_text", "text": "you"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]}]})
    assert chat["messages"] == [{"role": "system", "content": "Rules."}, {"role": "system", "content": "More rules."},
                                {"role": "user", "content": "Hello, you"}, {"role": "assistant", "content": "Hi!"}]


def test_function_calls_join_the_assistant_message_before_them_and_outputs_become_tool_messages():
    chat = chat_body_from_responses({"input": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # an earlier answer's thinking: no place in a chat
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city": "Rome"}',
         "id": "fc_2", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "call_c", "name": "get_weather", "arguments": "{}"}]})
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}]


def test_function_tools_take_chats_nested_shape():
    chat = chat_body_from_responses({"input": "x", "tools": [WEATHER_TOOL, {"type": "function", "name": "now"}]})
    assert chat["tools"] == [CHAT_WEATHER_TOOL, {"type": "function", "function": {"name": "now"}}]


@pytest.mark.parametrize("choice, expected", [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}})])
def test_tool_choice_takes_chats_shape(choice, expected):
    assert chat_body_from_responses({"input": "x", "tool_choice": choice})["tool_choice"] == expected


@pytest.mark.parametrize("text, expected", [
    ({"format": {"type": "text"}}, {"type": "text"}),
    ({"format": {"type": "json_object"}}, {"type": "json_object"}),
    ({"format": {"type": "json_schema", "name": "final_output", "schema": {"type": "object"}, "strict": True}},
     {"type": "json_schema", "json_schema": {"name": "final_output", "schema": {"type": "object"}, "strict": True}}),
    ({"verbosity": "low"}, None)])  # no format: none asked
def test_text_format_is_chats_response_format(text, expected):
    assert chat_body_from_responses({"input": "x", "text": text}).get("response_format") == expected


def test_limits_and_sampling_pass_and_what_asks_nothing_of_the_engine_is_dropped():
    chat = chat_body_from_responses({"input": "x", "max_output_tokens": 40, "temperature": 0.5, "top_p": 0.9,
                                     "parallel_tool_calls": False, "store": True, "metadata": {"k": "v"},
                                     "user": "u1", "include": [], "truncation": "auto"})
    assert chat == {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 40, "temperature": 0.5,
                    "top_p": 0.9, "parallel_tool_calls": False}


def test_a_stream_asks_for_its_usage_which_response_completed_carries():
    chat = chat_body_from_responses({"input": "x", "stream": True})
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert "stream" not in chat_body_from_responses({"input": "x", "stream": False})


def test_the_chat_body_is_read_by_the_gateways_chat_reader_as_asked():
    from tritonforge.gateway.protocol import read_request

    request = read_request(chat_body_from_responses(
        {"model": "tiny", "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 7, "temperature": 0.3,
         "stream": True}), "chat", "tiny")
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (request.max_tokens, request.sampling, request.stream, request.include_usage) == (7, {"temperature": 0.3},
                                                                                             True, True)
    call = {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    chat = chat_body_from_responses({"input": [{"role": "user", "content": "Weather?"}, call,
                                               {"type": "function_call_output", "call_id": "call_a", "output": "sun"}],
                                     "tools": [WEATHER_TOOL], "tool_choice": "auto"})
    request = read_request(chat, "chat", "tiny")
    assert request.messages == chat["messages"] and [tool.name for tool in request.tools] == ["get_weather"]


IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include"),
    ({"instructions": "x"}, "input"),
    ({"input": 3}, "input"),
    ({"input": "x", "instructions": ["y"]}, "instructions"),
    ({"input": ["x"]}, "input[0]"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_1"}]}, "input[1].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": "x"}, {"role": "user", "content": [IMAGE]}]}, "input[1].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_file"}]}]},
     "input[0].content[1].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [IMAGE]}]}, "input[0].output[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": None}]}, "input[0].output"),
    ({"input": "x", "tools": {"type": "function"}}, "tools"),
    ({"input": "x", "tools": [WEATHER_TOOL, {"type": "web_search"}]}, "tools[1].type"),
    ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": "x", "text": "json"}, "text"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": "{}"}}}, "text.format.schema"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": True}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 1.5}, "max_output_tokens")])
def test_a_request_that_asks_what_cannot_be_served_is_400_naming_its_field(body, param):
    with pytest.raises(OpenAIError) as refusal:
        chat_body_from_responses(body)
    assert refusal.value.status == 400 and refusal.value.param == param
    assert (param or "the request body") in refusal.value.message


def test_a_stateful_field_is_refused_saying_nothing_is_stored():
    with pytest.raises(OpenAIError, match="nothing is stored"):
        chat_body_from_responses({"input": "x", "previous_response_id": "resp_1"})


# --- answers -------------------------------------------------------------------------------------------------

REQUEST = {"model": "tiny", "input": "Weather in Paris?", "instructions": "Be brief.", "tools": [WEATHER_TOOL],
           "tool_choice": "auto", "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 64,
           "parallel_tool_calls": False, "text": {"format": {"type": "text"}}, "metadata": {"trace": "t1"}}
ANSWERS = {
    "text": chat_answer("It is sunny in Paris, 21 °C. 😀"),
    "calls": chat_answer(None, [("call_a", "get_weather", '{"city": "Paris"}'),
                                ("call_b", "get_weather", '{"city": "Rome, \\"Italy\\""}')], "tool_calls"),
    "text and calls": chat_answer("Checking.", [("call_a", "get_weather", '{"city": "Paris"}')], "tool_calls"),
    "cut short": chat_answer("It is sunny in Pa", finish_reason="length", usage=(12, 64)),
    "call cut short": chat_answer(None, [("call_a", "get_weather", '{"city": "Pa')], "length"),
    "empty": chat_answer(""),
}


def test_a_text_answer_is_a_completed_response_whose_output_text_is_the_content():
    wire = response_from_chat(ANSWERS["text"], REQUEST)
    response = Response.model_validate(wire)
    assert response.output_text == "It is sunny in Paris, 21 °C. 😀" and "output_text" not in wire
    assert (response.status, response.model, response.created_at) == ("completed", "tiny", 1700000000)
    assert re.fullmatch(r"resp_[0-9a-f]{32}", response.id) and response.output[0].id.startswith("msg_")
    assert wire["output"] == [{"id": response.output[0].id, "type": "message", "role": "assistant",
                               "status": "completed", "content": [{"type": "output_text", "annotations": [],
                                                                   "text": "It is sunny in Paris, 21 °C. 😀"}]}]
    assert wire["usage"] == {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17,
                             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}


def test_the_response_echoes_the_requests_settings():
    wire = response_from_chat(ANSWERS["text"], REQUEST)
    assert {name: wire[name] for name in ("instructions", "tools", "tool_choice", "text", "temperature", "top_p",
                                          "max_output_tokens", "parallel_tool_calls", "metadata")} == {
        name: REQUEST[name] for name in ("instructions", "tools", "tool_choice", "text", "temperature", "top_p",
                                         "max_output_tokens", "parallel_tool_calls", "metadata")}
    bare = response_from_chat(ANSWERS["text"], {"input": "x"})
    assert (bare["tools"], bare["tool_choice"], bare["parallel_tool_calls"], bare["text"]) == (
        [], "auto", True, {"format": {"type": "text"}})
    assert bare["store"] is False  # nothing is stored, whatever was asked


def test_each_tool_call_is_a_function_call_item_after_the_text():
    wire = response_from_chat(ANSWERS["text and calls"], REQUEST)
    response = Response.model_validate(wire)
    assert [item.type for item in response.output] == ["message", "function_call"]
    call = response.output[1]
    assert (call.call_id, call.name, call.arguments, call.status) == ("call_a", "get_weather", '{"city": "Paris"}',
                                                                      "completed")
    assert call.id.startswith("fc_") and response.output_text == "Checking."
    assert [item["type"] for item in response_from_chat(ANSWERS["calls"], REQUEST)["output"]] == ["function_call"] * 2


@pytest.mark.parametrize("name", ["cut short", "call cut short"])
def test_an_answer_cut_at_max_tokens_is_incomplete_and_so_is_its_last_item(name):
    response = Response.model_validate(response_from_chat(ANSWERS[name], REQUEST))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[-1].status == "incomplete" and response.completed_at is None


def test_an_empty_answer_is_one_empty_message():
    response = Response.model_validate(response_from_chat(ANSWERS["empty"], REQUEST))
    assert [(item.type, item.content[0].text) for item in response.output] == [("message", "")]


@pytest.mark.parametrize("name", ["text", "calls", "text and calls"])
def test_an_answers_output_sent_back_as_input_is_the_same_assistant_message(name):
    answer = ANSWERS[name]
    output = response_from_chat(answer, REQUEST)["output"]
    messages = chat_body_from_responses({"input": [{"role": "user", "content": "x"}, *output]})["messages"]
    assert messages[1:] == [answer["choices"][0]["message"]]


# --- streaming -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ANSWERS))
def test_every_streamed_event_is_one_the_sdk_knows_numbered_from_zero(name):
    events = stream_events(ANSWERS[name], REQUEST)
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[-1]["type"] == ("response.incomplete" if "cut" in name else "response.completed")


@pytest.mark.parametrize("name", list(ANSWERS))
def test_the_streamed_response_is_the_whole_answers(name):
    answer = ANSWERS[name]
    final = stream_events(answer, REQUEST)[-1]["response"]
    assert without_ids(final) == without_ids(response_from_chat(answer, REQUEST))


@pytest.mark.parametrize("pieces", [{"text_piece": 1, "arguments_piece": 1}, {"text_piece": 5, "arguments_piece": 7}])
@pytest.mark.parametrize("name", list(ANSWERS))
def test_streamed_deltas_join_into_the_texts_and_arguments_done(name, pieces):
    events = stream_events(ANSWERS[name], REQUEST, **pieces)
    message = ANSWERS[name]["choices"][0]["message"]
    deltas, arguments = [], {}
    for event in events:
        if event["type"] == "response.output_text.delta":
            deltas.append(event["delta"])
        elif event["type"] == "response.function_call_arguments.delta":
            arguments.setdefault(event["item_id"], []).append(event["delta"])
    texts = [event["text"] for event in events if event["type"] == "response.output_text.done"]
    has_message = bool(message["content"]) or not message.get("tool_calls")
    assert texts == ([message["content"]] if has_message else [])
    assert "".join(deltas) == "".join(texts)
    done = {event["item_id"]: event["arguments"] for event in events
            if event["type"] == "response.function_call_arguments.done"}
    assert done == {ident: "".join(arguments.get(ident, [])) for ident in done}
    assert list(done.values()) == [call["function"]["arguments"] for call in message.get("tool_calls") or []]


def test_each_item_is_added_before_its_deltas_and_done_with_the_id_it_was_added_with():
    events = stream_events(ANSWERS["text and calls"], REQUEST)
    added = {event["output_index"]: (event["sequence_number"], event["item"]["id"]) for event in events
             if event["type"] == "response.output_item.added"}
    done = {event["output_index"]: (event["sequence_number"], event["item"]["id"]) for event in events
            if event["type"] == "response.output_item.done"}
    assert sorted(added) == sorted(done) == [0, 1]
    for event in events:
        if "delta" in event["type"]:
            assert added[event["output_index"]][0] < event["sequence_number"] < done[event["output_index"]][0]
            assert event["item_id"] == added[event["output_index"]][1] == done[event["output_index"]][1]


def test_an_error_mid_stream_is_an_error_event_then_response_failed_with_the_text_so_far():
    events = ResponseEvents(REQUEST, "tiny")
    streamed = events.start() + events.push(chunks_of(ANSWERS["text"])[1])
    streamed += events.failed(OpenAIError(500, "the engine died", kind="server_error").body())
    for event in streamed:
        EVENT.validate_python(event)
    error, failed = streamed[-2:]
    assert (error["type"], error["message"], error["code"]) == ("error", "the engine died", "server_error")
    response = Response.model_validate(failed["response"])
    assert (failed["type"], response.status, response.error.code) == ("response.failed", "failed", "server_error")
    assert response.output_text == "It " and response.output[0].status == "incomplete"
    assert [event["sequence_number"] for event in streamed] == list(range(len(streamed)))


def test_an_event_is_written_as_a_named_server_sent_event_of_its_json():
    event = {"type": "response.output_text.delta", "sequence_number": 3, "delta": 'é "\n'}
    written = sse(event)
    assert written.startswith("event: response.output_text.delta\ndata: ") and written.endswith("\n\n")
    assert json.loads(written.split("data: ", 1)[1]) == event and written.count("\n") == 3


# --- through the openai SDK and the Agents SDK ---------------------------------------------------------------


def fake_engine(chat: dict) -> dict:
    """Calls the first tool until a tool has answered, then says what it answered."""
    last = chat["messages"][-1]
    if last["role"] == "tool":
        return chat_answer(f"The weather: {last['content']}.")
    if chat.get("tools"):
        city = "Paris" if "Paris" in last["content"] else "Rome"
        return chat_answer(None, [("call_7", chat["tools"][0]["function"]["name"], json.dumps({"city": city}))],
                           "tool_calls")
    return chat_answer("Hello there.")


class Gateway:
    """/v1/responses as the gateway serves it, over `fake_engine`, for an httpx transport; keeps the chat bodies
    the engine was asked."""

    def __init__(self):
        self.chats = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/responses"
        body = json.loads(request.content)
        try:
            chat = chat_body_from_responses(body)
        except OpenAIError as error:
            return httpx.Response(error.status, json=error.body())
        self.chats.append(chat)
        answer = fake_engine(chat)
        if not chat.get("stream"):
            return httpx.Response(200, json=response_from_chat(answer, body))
        events = "".join(sse(event) for event in stream_events(answer, body))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events.encode())


def test_the_openai_sdk_reads_the_response_and_the_stream_and_gets_a_refusals_message():
    gateway = Gateway()
    client = openai.OpenAI(api_key="unused", base_url="http://gateway.test/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(gateway)))
    assert client.responses.create(model="tiny", input="Hi").output_text == "Hello there."
    with client.responses.stream(model="tiny", input="Hi", instructions="Be brief.") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello there." and final.usage.total_tokens == 17
    with client.responses.stream(model="tiny", input="Weather in Paris?", tools=[WEATHER_TOOL]) as stream:
        call = stream.get_final_response().output[0]
    assert (call.type, call.call_id, call.arguments) == ("function_call", "call_7", '{"city": "Paris"}')
    with pytest.raises(openai.BadRequestError, match="nothing is stored"):
        client.responses.create(model="tiny", input="Hi", previous_response_id="resp_1")


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agents_sdk_function_tool_round_trip_works(streamed):
    import agents

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    gateway = Gateway()
    client = openai.AsyncOpenAI(api_key="unused", base_url="http://gateway.test/v1",
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(gateway)))
    agent = agents.Agent(name="forecaster", instructions="Answer with the tool.", tools=[get_weather],
                         model=agents.OpenAIResponsesModel(model="tiny", openai_client=client))

    async def run():
        if not streamed:
            return await agents.Runner.run(agent, "Weather in Paris?")
        result = agents.Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls == ["Paris"] and result.final_output == "The weather: sunny in Paris."
    first, second = gateway.chats
    assert first["messages"][0] == {"role": "system", "content": "Answer with the tool."}
    assert first["tools"][0]["function"]["name"] == "get_weather" and first.get("stream", False) == streamed
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_7", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny in Paris"}]

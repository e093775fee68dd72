"""What agent frameworks ask of the OpenAI gateway, asked by the frameworks themselves against a real tritonserver
on the tiny random-weight model: structured output and forced tool calls through guided decoding (a random model's
JSON parses and validates only because the grammar holds it), `n`, OpenAI's sampling semantics, `/v1/responses`,
and a function-tool round trip through the `openai` client, LangChain and the OpenAI Agents SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tritonforge.gateway.options import GatewayThread
from tritonforge.serve.ports import free_port

from .conftest import serve_tiny

MODEL = "tiny"
# Tools shown in the prompt take hundreds of the tiny tokenizer's tokens: more than the shared servers' inputs.
MAX_INPUT_LEN, MAX_SEQ_LEN = 1024, 1280
# Enough tokens for every answer the schemas below allow: their strings are enums, so each answer is short.
MAX_TOKENS = 96


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    unit: Literal["celsius", "fahrenheit"]
    rain: bool


WEATHER_PARAMETERS = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                      "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}}}
TIME_PARAMETERS = {"type": "object", "additionalProperties": False, "required": ["zone"],
                   "properties": {"zone": {"enum": ["UTC", "CET"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER_PARAMETERS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": TIME_PARAMETERS}}]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gateway(tiny_models, tmp_path_factory):
    server = serve_tiny(tiny_models["bpe"], tmp_path_factory.mktemp("agents") / "repo", max_input_len=MAX_INPUT_LEN,
                        max_seq_len=MAX_SEQ_LEN, preprocessing_instances=1, postprocessing_instances=1)
    gateway = GatewayThread(server.grpc_url, port=free_port(), served_model_name=MODEL).start()
    yield gateway
    gateway.stop()
    server.kill()


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)


def assert_valid_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.id and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# --- structured output --------------------------------------------------------------------------------------------

def test_parse_with_a_pydantic_model_returns_that_model(client):
    completion = client.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=Forecast,
                                               max_tokens=MAX_TOKENS, seed=3)
    assert isinstance(completion.choices[0].message.parsed, Forecast)


def test_a_json_object_response_is_a_json_object_whole_and_streamed(client):
    fields = {"model": MODEL, "messages": MESSAGES, "response_format": {"type": "json_object"}, "max_tokens": 12,
              "seed": 5}
    whole = client.chat.completions.create(**fields).choices[0]
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        **fields, stream=True) if chunk.choices)
    assert streamed == whole.message.content and whole.message.content.startswith("{")
    if whole.finish_reason == "stop":  # an object may be cut by max_tokens; a finished one is whole
        assert isinstance(json.loads(whole.message.content), dict)


# --- tools ----------------------------------------------------------------------------------------------------------

def test_required_tool_choice_returns_calls_that_match_their_schemas(client):
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                                max_tokens=MAX_TOKENS, seed=11)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert_valid_calls(choice.message.tool_calls)


def test_a_named_tool_choice_calls_that_tool(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=MAX_TOKENS, seed=12,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert_valid_calls([call])


def test_streamed_tool_calls_assemble_into_the_calls_of_the_whole_answer(client):
    fields = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
              "max_tokens": MAX_TOKENS, "seed": 13, "temperature": 0}
    whole = client.chat.completions.create(**fields).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = []
    for chunk in client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            finish += [choice.finish_reason] if choice.finish_reason else []
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    assert finish == ["tool_calls"]
    assert [(call.function.name, json.loads(call.function.arguments)) for call in whole] == [
        (call["name"], json.loads(call["arguments"])) for _, call in sorted(calls.items())]


def test_a_tool_round_trip_renders_the_call_and_its_result(client):
    (call,) = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                             parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                             seed=14).choices[0].message.tool_calls
    follow_up = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    answer = client.chat.completions.create(model=MODEL, messages=follow_up, tools=TOOLS, tool_choice="none",
                                            max_tokens=8)
    assert answer.choices[0].message.tool_calls is None and answer.usage.prompt_tokens > 0


def test_a_tool_choice_naming_no_given_tool_is_400_naming_tool_choice(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nowhere"}})
    assert error.value.body["param"] == "tool_choice"


# --- n and sampling -------------------------------------------------------------------------------------------------

def test_n_choices_come_whole_and_streamed_each_with_its_index(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, max_tokens=6, seed=21)
    one = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, seed=21)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    assert whole.choices[0].message.content == one.choices[0].message.content  # the first choice draws from seed
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens  # one prompt, counted once
    texts = {0: "", 1: "", 2: ""}
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, max_tokens=6, seed=21,
                                                stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[index] for index in range(3)] == [choice.message.content for choice in whole.choices]


def test_openais_default_temperature_samples_and_a_seed_repeats_the_sample(client):
    def answer(**fields) -> str:
        return client.completions.create(model=MODEL, prompt="The server", max_tokens=12, **fields).choices[0].text

    assert answer(seed=1) == answer(seed=1)
    assert len({answer(seed=seed) for seed in (1, 2, 3)}) > 1  # sampled: the greedy answer would be one
    assert answer(temperature=0) == answer(temperature=0, seed=9)  # greedy: the seed plays no part


# --- /v1/responses --------------------------------------------------------------------------------------------------

def test_responses_with_a_json_schema_answers_text_that_validates(client):
    response = client.responses.parse(model=MODEL, input="Weather?", text_format=Forecast,
                                      max_output_tokens=MAX_TOKENS)
    assert isinstance(response.output_parsed, Forecast)


def test_responses_streams_a_forced_function_call(client):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True}]
    with client.responses.stream(model=MODEL, input="Weather?", tools=tools, tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=MAX_TOKENS) as stream:
        events = [event.type for event in stream]
        response = stream.get_final_response()
    (call,) = [item for item in response.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    assert events[0] == "response.created" and events[-1] == "response.completed"


# --- frameworks -----------------------------------------------------------------------------------------------------

def test_langchain_binds_tools_and_returns_structured_output(gateway):
    from langchain_openai import ChatOpenAI

    def get_weather(city: Literal["Paris", "Oslo", "Lima"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The weather in a city."""
        return "sunny"

    chat = ChatOpenAI(model=MODEL, base_url=f"{gateway.base_url}/v1", api_key="unused", max_tokens=MAX_TOKENS,
                      max_retries=0, seed=31)
    message = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], {**WEATHER_PARAMETERS, "additionalProperties": True})
    assert isinstance(chat.with_structured_output(Forecast, method="json_schema").invoke("Weather?"), Forecast)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_the_agents_sdk_calls_a_function_tool_and_answers_after_its_result(gateway, api):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    calls = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    model = (OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel)(MODEL, client)
    # The first turn must call the tool; the SDK then lets the model choose again, and it answers with the agent's
    # output type (structured output: a random model's free text would run to max_tokens, which the SDK takes
    # for a failed response).
    agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather], model=model,
                  output_type=Forecast, model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                                     max_tokens=MAX_TOKENS))
    result = asyncio.run(Runner.run(agent, "Weather in Paris?", max_turns=4))
    assert calls and calls[0] in ("Paris", "Oslo", "Lima")
    assert isinstance(result.final_output, Forecast)

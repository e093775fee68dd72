"""The request fields of the gateway's three generating endpoints, as data: for each, the endpoints it applies
to, what the gateway does with it, and an example value that is served, or refused with HTTP 400 naming it.

This module only states the table; it decides nothing. `protocol`, `tool_calls`, `responses_api` and `serving`
do what it says, `tests/unit/gateway/test_fields.py` sends every example to every endpoint its entry names and
holds each to its answer, and `docs/reference/openai.md` is generated from it (`cli/reference_docs.py`). The
gateway's options that change what a request gets are stated here too, as prose (`OPTIONS`).
"""

from __future__ import annotations

import dataclasses

from .protocol import CHAT, COMPLETIONS, DEFAULT_MAX_TOKENS, MAX_CHOICES, MAX_STOP_STRINGS, PATHS, RESPONSES_PATH
from .reasoning import REASONING_PARSERS
from .responses_api import LOGPROBS_INCLUDE, STATEFUL_FIELDS
from .serving import DEFAULT_STREAM_INTERVAL, DEFAULT_TEMPERATURE, DEFAULT_TOOL_PARSER, WHOLE_DISTRIBUTION_TOP_P
from .tool_calls import NAME_RULE
from .tool_parsers import PARSERS

RESPONSES = "responses"
ENDPOINTS = {COMPLETIONS: PATHS[COMPLETIONS], CHAT: PATHS[CHAT], RESPONSES: RESPONSES_PATH}
ALL = (COMPLETIONS, CHAT, RESPONSES)
COMPLETIONS_AND_CHAT = (COMPLETIONS, CHAT)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestField:
    """One request field (dotted for a sub-field: `stream_options.include_usage`) on the endpoints it applies to."""

    name: str
    endpoints: tuple[str, ...]  # keys of ENDPOINTS
    does: str  # what the gateway does with it, in a sentence
    example: object  # a value of the field, as JSON has it
    served: bool  # False: the example is refused, HTTP 400 naming `refusal_param`
    param: str | None = None  # the refusal's `param` where it is not `name` (an item of a list, the parent field)
    with_fields: dict = dataclasses.field(default_factory=dict)  # other fields the example is sent with

    @property
    def refusal_param(self) -> str:
        return self.param or self.name

    def fragment(self) -> dict:
        """The example as request fields: the dotted name nested, merged into `with_fields`."""
        value = self.example
        for key in reversed(self.name.split(".")):
            value = {key: value}
        return merged(self.with_fields, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    title: str
    fields: tuple[RequestField, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Option:
    """A gateway option that changes what requests get."""

    flag: str
    does: str


def merged(base: dict, more: dict) -> dict:
    """`base` with `more` laid over it, objects merged key by key."""
    result = dict(base)
    for key, value in more.items():
        result[key] = merged(result[key], value) if isinstance(result.get(key), dict) and isinstance(value, dict) \
            else value
    return result


CHAT_TOOL = {"type": "function", "function": {"name": "get_weather"}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather"}
BAD_PATTERN_SCHEMA = {"type": "object", "properties": {"day": {"type": "string", "pattern": "(["}}}

SECTIONS = (
    Section(title="What to answer", fields=(
        RequestField(name="model", endpoints=ALL, example="tritonforge", served=True,
                     does="Optional: the served name (`--served-model-name`, `GET /v1/models`); another name is 404 "
                          "`model_not_found`, as OpenAI answers."),
        RequestField(name="prompt", endpoints=(COMPLETIONS,), example=["Say hi", "Say bye"], served=True,
                     does="A string or a list of strings, each prompt answered by its own choices (`n` each) in "
                          "order; token ids are 400."),
        RequestField(name="messages", endpoints=(CHAT,),
                     example=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]}],
                     served=False,
                     does="Roles system, developer (read as system), user, assistant, tool; content as text or "
                          "text parts (joined); an assistant's `tool_calls` and a tool message's `tool_call_id` go "
                          "to the chat template. An image or other non-text part is 400."),
        RequestField(name="chat_template_kwargs", endpoints=(CHAT,), example={"enable_thinking": False},
                     served=True,
                     does="An object passed to the chat template's rendering (Qwen3's `enable_thinking`, say); a key "
                          "of the template call itself (`tokenize`, `messages`, `tools`, `chat_template`...) is 400."),
        RequestField(name="input", endpoints=(RESPONSES,), example=[{"type": "item_reference", "id": "msg_1"}],
                     served=False, param="input[0].type",
                     does="A string (one user message) or a list of items: messages (`developer` is `system`; text "
                          "parts), `function_call` and `function_call_output` (a tool round trip), `reasoning` "
                          "(dropped). Another item or a non-text part is 400 naming it; nothing stored can be "
                          "referred to."),
        RequestField(name="instructions", endpoints=(RESPONSES,), example="Be brief.", served=True,
                     does="A leading system message."),
    )),
    Section(title="Length and stopping", fields=(
        RequestField(name="max_tokens", endpoints=COMPLETIONS_AND_CHAT, example=64, served=True,
                     does=f"The most tokens to generate, at least 1; default {DEFAULT_MAX_TOKENS[COMPLETIONS]} for "
                          f"completions (OpenAI's), {DEFAULT_MAX_TOKENS[CHAT]} for chat. `finish_reason` is "
                          f"`length` when the engine produced that many."),
        RequestField(name="max_completion_tokens", endpoints=(CHAT,), example=64, served=True,
                     does="Chat's newer name for `max_tokens`, which it overrides when both are given."),
        RequestField(name="max_output_tokens", endpoints=(RESPONSES,), example=0, served=False,
                     does="Sent as `max_completion_tokens`: a positive integer. A response it cuts short is "
                          "`incomplete`, reason `max_output_tokens`."),
        RequestField(name="stop", endpoints=COMPLETIONS_AND_CHAT, example=["\n\n", "User:"], served=True,
                     does=f"A string or up to {MAX_STOP_STRINGS} non-empty strings (OpenAI's limit), sent as the "
                          f"engine's stop words; the BLS matches them on the text and never emits them."),
        RequestField(name="min_tokens", endpoints=COMPLETIONS_AND_CHAT, example=8, served=True,
                     does="vLLM's: the engine does not end the answer before this many tokens."),
    )),
    Section(title="Sampling", fields=(
        RequestField(name="temperature", endpoints=ALL, example=0, served=True,
                     does=f"OpenAI's meaning, 0 to 2: default {DEFAULT_TEMPERATURE} (sampled); 0 is greedy, sent to "
                          f"the engine as `top_k` 1."),
        RequestField(name="top_p", endpoints=ALL, example=1, served=True,
                     does=f"0 to 1, default 1 (the whole distribution), sent as {WHOLE_DISTRIBUTION_TOP_P} because "
                          f"the engines sample only below 1; 0 is greedy."),
        RequestField(name="top_k", endpoints=COMPLETIONS_AND_CHAT, example=40, served=True,
                     does="vLLM's: at least 0; 0 is no limit, 1 is greedy."),
        RequestField(name="seed", endpoints=COMPLETIONS_AND_CHAT, example=7, served=True,
                     does="At least 0: choice i draws from seed + i (modulo 2^64), so the choices of one request "
                          "differ and each is reproducible."),
        RequestField(name="presence_penalty", endpoints=COMPLETIONS_AND_CHAT, example=0.5, served=True,
                     does="OpenAI's, -2 to 2, sent to the engine."),
        RequestField(name="frequency_penalty", endpoints=COMPLETIONS_AND_CHAT, example=0.5, served=True,
                     does="OpenAI's, -2 to 2, sent to the engine."),
        RequestField(name="repetition_penalty", endpoints=COMPLETIONS_AND_CHAT, example=1.1, served=True,
                     does="vLLM's, at least 0, sent to the engine."),
    )),
    Section(title="Choices", fields=(
        RequestField(name="n", endpoints=COMPLETIONS_AND_CHAT, example=3, served=True,
                     does=f"Up to {MAX_CHOICES} choices (times the prompts of a completions request), each one "
                          f"engine request, run side by side; streamed, each chunk names its choice's `index`."),
        RequestField(name="best_of", endpoints=(COMPLETIONS,), example=3, served=False,
                     does="1 or absent; more is 400 (ask for `n` choices instead)."),
    )),
    Section(title="Streaming", fields=(
        RequestField(name="stream", endpoints=ALL, example=True, served=True,
                     does="Server-sent events: chunks ending `data: [DONE]`; for responses, Responses' events, the "
                          "last (`response.completed`, or `.incomplete`) carrying the whole response and its usage."),
        RequestField(name="stream_options.include_usage", endpoints=COMPLETIONS_AND_CHAT, example=True, served=True,
                     does="A last chunk with the usage and no choices."),
    )),
    Section(title="Tools and structured output", fields=(
        RequestField(name="tools", endpoints=(CHAT,), example=[CHAT_TOOL], served=True,
                     does=f"Function tools, shown to the model by the chat template: a name ({NAME_RULE}), a "
                          f"description, `parameters` (an object's JSON schema; none: no arguments). Another type "
                          f"is 400."),
        RequestField(name="tool_choice", endpoints=(CHAT,), example="required", served=True,
                     with_fields={"tools": [CHAT_TOOL]},
                     does="`auto` (the default with tools): the model chooses, its calls read in the "
                          "`--tool-parser` format; `none`; `required` or a named function: a grammar holds the text "
                          "to calls that parse and match the tools' schemas."),
        RequestField(name="parallel_tool_calls", endpoints=(CHAT, RESPONSES), example=False, served=True,
                     does="`false`: a required call is exactly one (the grammar allows one); a named function is "
                          "always one call; under `auto` it is not enforced."),
        RequestField(name="response_format", endpoints=COMPLETIONS_AND_CHAT, example={"type": "json_object"},
                     served=True,
                     does="`text`; `json_object` (any JSON object) or `json_schema` (JSON the schema accepts, with no "
                          "property it does not name), enforced by a grammar with no free whitespace, so a model "
                          "cannot pad the JSON until `max_tokens`. A forced tool call takes its place."),
        RequestField(name="response_format.json_schema", endpoints=COMPLETIONS_AND_CHAT,
                     example={"name": "plan", "schema": BAD_PATTERN_SCHEMA}, served=False, param="response_format",
                     with_fields={"response_format": {"type": "json_schema"}},
                     does=f"A `name` ({NAME_RULE}) and a `schema`; a schema xgrammar cannot enforce (here a pattern "
                          f"that is no regular expression) is 400 naming `response_format`, with xgrammar's reason."),
        RequestField(name="tools", endpoints=(RESPONSES,), example=[{"type": "web_search"}], served=False,
                     param="tools[0].type",
                     does="Function tools (`name`, `description`, `parameters`, `strict`), read as chat's; a built-in "
                          "tool (`web_search`, `file_search`...) is 400: this server runs no tool itself."),
        RequestField(name="tool_choice", endpoints=(RESPONSES,), example={"type": "function", "name": "get_weather"},
                     served=True, with_fields={"tools": [RESPONSES_TOOL]},
                     does="`auto`, `none`, `required` or a named function, read as chat's."),
        RequestField(name="text.format", endpoints=(RESPONSES,),
                     example={"type": "json_schema", "name": "answer", "schema": {"type": "object"}}, served=True,
                     does="Chat's `response_format`: `text`, `json_object`, or `json_schema` with its name and "
                          "schema beside the type."),
    )),
    Section(title="Log probabilities", fields=(
        RequestField(name="logprobs", endpoints=(CHAT,), example=True, served=True,
                     does="Each generated token's log probability in the choice's `logprobs.content` (streamed: "
                          "in the chunk whose text holds the token), with its UTF-8 `bytes`; through the BLS "
                          "(`--model tensorrt_llm_bls`, the default), else 400."),
        RequestField(name="top_logprobs", endpoints=(CHAT,), example=5, served=True, with_fields={"logprobs": True},
                     does="0 to 20: the likeliest tokens at each generated token's step, likeliest first; 400 "
                          "without `logprobs` true."),
        RequestField(name="logprobs", endpoints=(COMPLETIONS,), example=2, served=True,
                     does="0 to 20: each generated token's log probability, and this many likeliest tokens at its "
                          "step, in OpenAI's completions form (`tokens`, `token_logprobs`, `top_logprobs`, "
                          "`text_offset`)."),
        RequestField(name="echo", endpoints=(COMPLETIONS,), example=True, served=True,
                     does="The answer starts with the prompt; with `logprobs`, the prompt's tokens come first, the "
                          "first with `null` (nothing predicts it), so evaluation harnesses score a text by its log "
                          "probabilities. `max_tokens` 0 then answers the prompt alone."),
    )),
    Section(title="What the engines cannot give", fields=(
        RequestField(name="top_logprobs", endpoints=(RESPONSES,), example=5, served=False,
                     does="400 unless 0: a response carries no log probabilities (ask chat completions)."),
        RequestField(name="logit_bias", endpoints=COMPLETIONS_AND_CHAT, example={"1000": -100}, served=False,
                     does="400 unless empty: the engines take no per-token bias."),
        RequestField(name="suffix", endpoints=(COMPLETIONS,), example="}", served=False,
                     does="400 unless empty: the engines fill in no text before a suffix."),
        RequestField(name="functions", endpoints=(CHAT,), example=[{"name": "get_weather"}], served=False,
                     does="Deprecated by OpenAI: 400 unless empty; send `tools`."),
        RequestField(name="function_call", endpoints=(CHAT,), example="auto", served=False,
                     does="Deprecated by OpenAI: 400 unless empty; send `tool_choice`."),
        RequestField(name="include", endpoints=(RESPONSES,), example=[LOGPROBS_INCLUDE], served=False,
                     does=f"Ignored, but `{LOGPROBS_INCLUDE}` is 400: a response carries no log probabilities "
                          f"(ask chat completions)."),
    )),
    Section(title="Stored state (Responses)", fields=(
        RequestField(name="previous_response_id", endpoints=(RESPONSES,), example="resp_1", served=False,
                     does=f"400: {STATEFUL_FIELDS['previous_response_id']}."),
        RequestField(name="conversation", endpoints=(RESPONSES,), example="conv_1", served=False,
                     does=f"400: {STATEFUL_FIELDS['conversation']}."),
        RequestField(name="background", endpoints=(RESPONSES,), example=True, served=False,
                     does=f"400: {STATEFUL_FIELDS['background']}."),
        RequestField(name="prompt", endpoints=(RESPONSES,), example={"id": "pmpt_1"}, served=False,
                     does=f"400: {STATEFUL_FIELDS['prompt']}."),
        RequestField(name="store", endpoints=(RESPONSES,), example=True, served=True,
                     does="Accepted and ignored: nothing is stored, and the response says `store: false`."),
        RequestField(name="metadata", endpoints=(RESPONSES,), example={"trace": "t1"}, served=True,
                     does="Echoed in the response."),
    )),
    Section(title="Accepted and ignored", fields=(
        RequestField(name="user", endpoints=ALL, example="u1", served=True,
                     does="Ignored, as is every field not listed here (as vLLM does)."),
        RequestField(name="reasoning", endpoints=(RESPONSES,), example={"effort": "low"}, served=True,
                     does="Ignored: the response has no reasoning items (`--reasoning-parser` sets a chat's thinking "
                          "apart; a response leaves it out)."),
        RequestField(name="truncation", endpoints=(RESPONSES,), example="auto", served=True,
                     does="Ignored: nothing is truncated, and the response says `disabled`."),
        RequestField(name="text.verbosity", endpoints=(RESPONSES,), example="low", served=True,
                     does="Ignored."),
    )),
)
FIELDS = tuple(entry for section in SECTIONS for entry in section.fields)

OPTIONS = (
    Option(flag="--tool-parser",
           does=f"The format of the calls a model writes when `tool_choice` lets it choose ({', '.join(PARSERS)}; "
                f"default {DEFAULT_TOOL_PARSER}; `tritonforge serve` takes the one its model's chat template "
                f"writes): what parses as a call becomes `tool_calls` and "
                f"`finish_reason` `tool_calls`, the rest stays content. Streamed, content that may begin a call is "
                f"held back until it is known, and each call arrives whole in one `tool_calls` delta."),
    Option(flag="--reasoning-parser",
           does=f"The format of a reasoning model's thinking ({', '.join(REASONING_PARSERS)}; default none): the "
                f"text between `<think>` and `</think>` is a chat answer's `reasoning_content` (streamed as "
                f"`reasoning_content` deltas), and tool calls are read from what follows. Completions are left as "
                f"written; a response leaves the thinking out."),
    Option(flag="--stream-interval",
           does=f"In front of the BLS, a streamed chunk carries up to this many engine responses after the first "
                f"(default {DEFAULT_STREAM_INTERVAL}; 1 streams each): fewer, larger chunks under load. The "
                f"ensemble streams what its engine sends."),
)


"""Tool calling and structured output: what the gateway refuses in `tools`, `tool_choice` and `response_format`,
what the grammars it sends let a model write (fed through xgrammar's matcher one character at a time), and the
calls it reads back, guided or in each model family's own format, whole or streamed in any two chunks."""

import json
import re
import string

import jsonschema
import pytest
import xgrammar

from tritonforge.gateway.protocol import OpenAIError
from tritonforge.gateway.tool_calls import (
    EBNF_GRAMMAR,
    ToolCall,
    ToolChoice,
    calls_from_guided_output,
    read_response_format,
    read_tools,
    tool_guide,
)
from tritonforge.gateway.tool_parsers import PARSERS, parser_for_chat_template
from tritonforge.runtime.engine.guided import GUIDE_TYPES

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"},
                                                       "unit": {"type": "string", "enum": ["c", "f"]}},
                      "required": ["city"]}
# A schema with a local reference, which must still resolve once it sits inside the list of calls.
ROUTE_PARAMETERS = {"type": "object", "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}}},
                    "required": ["stops"],
                    "$defs": {"stop": {"type": "object", "properties": {"name": {"type": "string"}},
                                       "required": ["name"]}}}


def function(name, parameters=None, **fields):
    spec = {"name": name, **fields}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


TOOLS = [function("get_weather", WEATHER_PARAMETERS, description="The weather in a city"),
         function("get_time"), function("plan_route", ROUTE_PARAMETERS)]
# What "required" lets the model write, as OpenAI documents it; written here, not by the code under test.
REQUIRED_CALLS_SCHEMA = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER_PARAMETERS},
     "required": ["name", "arguments"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"const": "get_time"},
                                      "arguments": {"type": "object", "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"const": "plan_route"}, "arguments": {"$ref": "#/$defs/route"}},
     "required": ["name", "arguments"], "additionalProperties": False}],
}, "$defs": {"route": {**ROUTE_PARAMETERS, "properties": {"stops": {"type": "array",
                                                                     "items": {"$ref": "#/$defs/stop"}}}},
             "stop": ROUTE_PARAMETERS["$defs"]["stop"]}}


# --- reading tools and tool_choice ---------------------------------------------------------------------------


def test_tool_choice_defaults_to_auto_with_tools_and_none_without():
    tools, choice = read_tools(TOOLS, None)
    assert [tool.name for tool in tools] == ["get_weather", "get_time", "plan_route"]
    assert choice == ToolChoice(mode="auto")
    assert read_tools(None, None) == ([], ToolChoice(mode="none"))
    assert read_tools([], "auto") == ([], ToolChoice(mode="none"))


def test_tool_choice_reads_each_mode_and_a_named_function():
    assert read_tools(TOOLS, "none")[1] == ToolChoice(mode="none")
    assert read_tools(TOOLS, "required")[1] == ToolChoice(mode="required")
    named = {"type": "function", "function": {"name": "get_time"}}
    assert read_tools(TOOLS, named)[1] == ToolChoice(mode="named", name="get_time")


def test_tool_without_parameters_takes_no_arguments_and_reads_back_in_openai_shape():
    weather, time, _ = read_tools(TOOLS, None)[0]
    assert time.parameters == {"type": "object", "properties": {}}
    assert time.as_openai() == {"type": "function", "function": {"name": "get_time", "parameters": time.parameters}}
    assert weather.as_openai() == TOOLS[0]


@pytest.mark.parametrize("tools, tool_choice, param, field", [
    ({"get_weather": {}}, None, "tools", "'tools'"),
    (["get_weather"], None, "tools", "tools[0]"),
    ([TOOLS[0], {"type": "retrieval"}], None, "tools", "tools[1].type"),
    ([{"type": "function"}], None, "tools", "tools[0].function"),
    ([function("get weather")], None, "tools", "tools[0].function.name"),
    ([function("x" * 65)], None, "tools", "tools[0].function.name"),
    ([{"type": "function", "function": {"parameters": {}}}], None, "tools", "tools[0].function.name"),
    ([function("f", description=7)], None, "tools", "tools[0].function.description"),
    ([function("f", strict="yes")], None, "tools", "tools[0].function.strict"),
    ([function("f", ["city"])], None, "tools", "tools[0].function.parameters"),
    ([function("f", {"type": "string"})], None, "tools", "tools[0].function.parameters"),
    ([function("f"), function("f")], None, "tools", "tools[1].function.name"),
    (TOOLS, "always", "tool_choice", "tool_choice"),
    (None, "required", "tool_choice", "tool_choice 'required'"),
    (TOOLS, {"type": "function", "function": {"name": "get_news"}}, "tool_choice", "tool_choice.function.name"),
    (None, {"type": "function", "function": {"name": "get_time"}}, "tool_choice", "tool_choice.function.name"),
    (TOOLS, {"type": "allowed_tools"}, "tool_choice", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": 3}}, "tool_choice", "tool_choice.function.name"),
])
def test_bad_tools_or_tool_choice_are_refused_naming_the_field(tools, tool_choice, param, field):
    with pytest.raises(OpenAIError) as refusal:
        read_tools(tools, tool_choice)
    assert (refusal.value.status, refusal.value.param) == (400, param)
    assert refusal.value.message.startswith(field)


def test_tool_choice_refuses_a_mode_it_does_not_know_and_a_name_without_named_mode():
    with pytest.raises(ValueError, match="mode"):
        ToolChoice(mode="sometimes")
    with pytest.raises(ValueError, match="named"):
        ToolChoice(mode="auto", name="get_time")
    with pytest.raises(ValueError, match="named"):
        ToolChoice(mode="named")


# --- reading response_format ---------------------------------------------------------------------------------


def test_text_response_format_asks_for_no_guide():
    assert read_response_format(None) is None
    assert read_response_format({"type": "text"}) is None


@pytest.mark.parametrize("response_format, field", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": WEATHER_PARAMETERS}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "w"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": "{}"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {}, "strict": 1}},
     "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {}, "description": []}},
     "response_format.json_schema.description"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "colour"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {"$ref": "#/$defs/missing"}}},
     "response_format.json_schema.schema"),
])
def test_bad_response_format_is_refused_naming_the_field(response_format, field):
    with pytest.raises(OpenAIError) as refusal:
        read_response_format(response_format)
    assert (refusal.value.status, refusal.value.param) == (400, "response_format")
    assert refusal.value.message.startswith(field)


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "broken"}}, "required"])
def test_parameters_xgrammar_cannot_take_are_refused_naming_the_tool(tool_choice):
    tools, choice = read_tools([function("get_time"), function("broken", {"type": "object", "properties": {
        "when": {"type": "string", "pattern": "(["}}})], tool_choice)
    with pytest.raises(OpenAIError) as refusal:
        tool_guide(tools, choice)
    assert (refusal.value.status, refusal.value.param) == (400, "tools")
    assert refusal.value.message.startswith("tools[1].function.parameters")
    assert "[12:" not in refusal.value.message  # xgrammar's log prefix is cut


# --- what the guides let a model write -----------------------------------------------------------------------

# A vocabulary of one token per printable character and a stop token: the matcher sees text as a model
# writing it character by character would.
VOCABULARY = list(string.printable) + ["</s>"]
STOP_TOKEN = len(VOCABULARY) - 1


@pytest.fixture(scope="module")
def compiler():
    info = xgrammar.TokenizerInfo(VOCABULARY, xgrammar.VocabType.RAW, stop_token_ids=[STOP_TOKEN])
    return xgrammar.GrammarCompiler(info)


def writable(grammar, text) -> bool:
    """Whether a model guided by the compiled `grammar` may write `text` and stop there."""
    matcher = xgrammar.GrammarMatcher(grammar)
    return all(matcher.accept_token(VOCABULARY.index(char)) for char in text) and matcher.accept_token(STOP_TOKEN)


def with_blanks(text):
    """`text` with a blank, newline or tab put in each place between its JSON tokens in turn (and at its end):
    the whitespace a model could pad its JSON with."""
    places, in_string, escaped = [], False, False
    for index, char in enumerate(text):
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        else:
            in_string = char == '"'
        if not in_string:
            places.append(index + 1)
    return [text[:place] + blank + text[place:] for place in places for blank in " \n\t"]


def assert_guides(compiler, guide, schema, valid, invalid):
    """The guide lets a model write each of `valid` (JSON that `schema` accepts, as json.dumps writes it) and
    none of `invalid`, nor any valid text padded with whitespace."""
    assert guide.guide_type == EBNF_GRAMMAR
    xgrammar.Grammar.from_ebnf(guide.guide)  # the engines read the guide as EBNF text
    grammar = compiler.compile_grammar(guide.guide)
    for value in valid:
        jsonschema.validate(value, schema)
        assert writable(grammar, json.dumps(value)), json.dumps(value)
        for padded in with_blanks(json.dumps(value)):
            assert not writable(grammar, padded), padded
    for text in invalid:
        assert not writable(grammar, text), text


def test_json_object_response_format_guides_to_any_object_with_no_free_whitespace(compiler):
    guide = read_response_format({"type": "json_object"})
    assert_guides(compiler, guide, {"type": "object"}, valid=[{}, {"a": [1, 2.5, {"b": None}], "c": "x y"}],
                  invalid=['[1]', '"text"', 'null', '{"a": 1'])


def test_json_schema_response_format_guides_to_the_schema_strictly(compiler):
    guide = read_response_format({"type": "json_schema",
                                  "json_schema": {"name": "weather", "schema": WEATHER_PARAMETERS, "strict": True}})
    assert_guides(compiler, guide, WEATHER_PARAMETERS, valid=[{"city": "Paris"}, {"city": "Oslo", "unit": "c"}],
                  invalid=['{"unit": "c"}', '{"city": "Paris", "unit": "k"}', '{"city": "Paris", "wind": 3}',
                           '{"city": 7}', '{"city":"Paris"}'])


def test_named_tool_guides_to_its_arguments_object(compiler):
    tools, choice = read_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert_guides(compiler, tool_guide(tools, choice), WEATHER_PARAMETERS, valid=[{"city": "Paris", "unit": "f"}],
                  invalid=['{}', '[{"city": "Paris"}]', '{"name": "get_weather", "arguments": {"city": "Paris"}}'])


def test_named_tool_without_parameters_guides_to_the_empty_object(compiler):
    tools, choice = read_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert_guides(compiler, tool_guide(tools, choice), {"type": "object"}, valid=[{}], invalid=['{"at": 1}'])


def test_required_tool_choice_guides_to_a_list_of_calls_of_given_tools(compiler):
    tools, choice = read_tools(TOOLS, "required")
    valid = [[{"name": "get_weather", "arguments": {"city": "Paris"}}],
             [{"name": "get_time", "arguments": {}}, {"name": "plan_route",
                                                      "arguments": {"stops": [{"name": "A"}, {"name": "B"}]}}]]
    invalid = ['[]', '{"name": "get_time", "arguments": {}}', '[{"name": "get_news", "arguments": {}}]',
               '[{"name": "get_time", "arguments": {"city": "Paris"}}]', '[{"name": "get_time"}]',
               '[{"arguments": {}, "name": "get_time"}]', '[{"name": "plan_route", "arguments": {"stops": [{}]}}]']
    assert_guides(compiler, tool_guide(tools, choice), REQUIRED_CALLS_SCHEMA, valid, invalid)


def test_free_tool_choices_ask_for_no_guide():
    tools, _ = read_tools(TOOLS, None)
    assert tool_guide(tools, ToolChoice(mode="auto")) is None
    assert tool_guide(tools, ToolChoice(mode="none")) is None


def test_guides_go_as_a_guide_type_the_engines_know():
    assert EBNF_GRAMMAR in GUIDE_TYPES


# --- reading guided output -----------------------------------------------------------------------------------

CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def test_guided_output_of_a_named_tool_is_one_call_with_compact_arguments():
    tools, choice = read_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    [call] = calls_from_guided_output('{"city": "Zürich", "unit": "c"}', tools, choice)
    assert (call.name, call.arguments) == ("get_weather", '{"city":"Zürich","unit":"c"}')
    assert CALL_ID.fullmatch(call.id)
    assert call.as_openai() == {"id": call.id, "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Zürich","unit":"c"}'}}


def test_guided_output_of_required_tools_is_one_call_per_item_in_order():
    tools, choice = read_tools(TOOLS, "required")
    text = '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    calls = calls_from_guided_output(text, tools, choice)
    assert [(call.name, call.arguments) for call in calls] == [("get_time", "{}"), ("get_weather", '{"city":"Oslo"}')]
    assert len({call.id for call in calls}) == 2


@pytest.mark.parametrize("tool_choice, text", [
    ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Os\x0clo\x1a"}'),
    ("required", '[{"name": "get_weather", "arguments": {"city": "Os\x0clo\x1a"}}]'),
])
def test_guided_output_with_raw_control_characters_in_a_string_is_still_a_call_with_escaped_arguments(
        tool_choice, text):
    """The grammar lets a model write U+000C or U+001A raw inside a JSON string, which a strict JSON parser refuses:
    the call still reaches the client as a call, its arguments written again with the characters escaped."""
    tools, choice = read_tools(TOOLS, tool_choice)
    [call] = calls_from_guided_output(text, tools, choice)
    assert call.name == "get_weather" and call.arguments == '{"city":"Os\\flo\\u001a"}'
    assert json.loads(call.arguments) == {"city": "Os\x0clo\x1a"}


@pytest.mark.parametrize("tool_choice, text", [
    ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Par'),
    ("required", '[{"name": "get_time", "arguments": {}}, {"name": "get_w'),
    ("auto", '{"city": "Paris"}'),
])
def test_guided_output_cut_short_or_unguided_makes_no_calls(tool_choice, text):
    tools, choice = read_tools(TOOLS, tool_choice)
    assert calls_from_guided_output(text, tools, choice) == []


# --- calls in a model's own format ---------------------------------------------------------------------------

WEATHER_CALL = ("get_weather", {"city": "Paris"})
TIME_CALL = ("get_time", {})

# (parser, what the model wrote, the content, the calls as (name, arguments))
PARSED = [
    ("hermes", "It is sunny.", "It is sunny.", []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [WEATHER_CALL]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.', "Let me look.Done.",
     [WEATHER_CALL, TIME_CALL]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>\nok',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>\nok', []),
    ("hermes", 'Sure <tool_call>\n{"name": "get_time", "arguments": {}}', 'Sure <tool_call>\n{"name": "get_time", '
                                                                          '"arguments": {}}', []),
    ("hermes", 'a <tool_call>{"arguments": {}}</tool_call>', 'a <tool_call>{"arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call> <tool', "<tool", [TIME_CALL]),
    ("hermes", "x < y and <tool> tags", "x < y and <tool> tags", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [WEATHER_CALL]),
    ("llama3_json", '\n{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", '
                    '"parameters": {}}', None, [WEATHER_CALL, TIME_CALL]),
    ("llama3_json", '{"name": "get_time", "arguments": {}}\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
     None, [TIME_CALL, WEATHER_CALL]),
    ("llama3_json", 'Checking.<|python_tag|>{"name": "get_time", "parameters": {}}', "Checking.", [TIME_CALL]),
    ("llama3_json", '{"name": "Ada", "age": 36}', '{"name": "Ada", "age": 36}', []),
    ("llama3_json", 'Use {"name": "get_time", "parameters": {}}', 'Use {"name": "get_time", "parameters": {}}', []),
    ("llama3_json", '<|python_tag|>brave_search.call(query="Paris")', '<|python_tag|>brave_search.call(query="Paris")',
     []),
    ("llama3_json", '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"ci',
     '; {"name": "get_weather", "parameters": {"ci', [TIME_CALL]),
    ("llama3_json", 'The set {1, 2} is small.', 'The set {1, 2} is small.', []),
    ("llama3_json", r'{"name": "say", "parameters": {"text": "a \"}\" {b"}}', None, [("say", {"text": 'a "}" {b'})]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [WEATHER_CALL]),
    ("mistral", 'On it.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
                '"arguments": {}}]', "On it.", [WEATHER_CALL, TIME_CALL]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time{}', None,
     [WEATHER_CALL, TIME_CALL]),
    ("mistral", '[TOOL_CALLS][{"name": 7, "arguments": {}}] then', '[TOOL_CALLS][{"name": 7, "arguments": {}}] then',
     []),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', []),
    ("mistral", 'Hi [TOOL_CALLS]', 'Hi [TOOL_CALLS]', []),
    ("mistral", '[TOOL_CALLS] no call here', '[TOOL_CALLS] no call here', []),
]


def as_pairs(calls: list[ToolCall]):
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize("parser, text, content, calls", PARSED)
def test_parser_reads_content_and_calls_from_whole_text(parser, text, content, calls):
    read_content, read_calls = PARSERS[parser]().parse(text)
    assert (read_content, as_pairs(read_calls)) == (content, calls)
    assert all(CALL_ID.fullmatch(call.id) for call in read_calls)


def streamed(parser, chunks):
    reader = PARSERS[parser]().streaming()
    content, calls = [], []
    for chunk in [*chunks, None]:
        text, completed = reader.push(chunk) if chunk is not None else reader.finish()
        content.append(text)
        calls.extend(completed)
    return "".join(content), as_pairs(calls)


@pytest.mark.parametrize("parser, text, content, calls", PARSED)
def test_parser_streamed_in_any_two_chunks_or_by_character_reads_as_whole(parser, text, content, calls):
    expected = (content or "", calls)
    for split in range(len(text) + 1):
        assert streamed(parser, [text[:split], text[split:]]) == expected, split
    assert streamed(parser, list(text)) == expected


@pytest.mark.parametrize("parser, head, rest, shown", [
    ("hermes", "Let me look <tool_", 'call>{"name": "get_time", "arguments": {}}</tool_call>', "Let me look"),
    ("llama3_json", " <|python", '_tag|>{"name": "get_time", "parameters": {}}', ""),
    ("llama3_json", "\n", '{"name": "get_time", "parameters": {}}', ""),
    ("mistral", "Sure. [TOOL", '_CALLS]get_time{}', "Sure."),
])
def test_marker_prefix_is_held_back_until_the_call_it_starts_completes(parser, head, rest, shown):
    reader = PARSERS[parser]().streaming()
    assert reader.push(head) == (shown, [])
    content, [call] = reader.push(rest)
    assert (content, call.name) == ("", "get_time")
    assert reader.finish() == ("", [])


def test_held_back_text_that_starts_no_marker_is_shown_with_what_follows():
    reader = PARSERS["hermes"]().streaming()
    assert reader.push("a <to") == ("a", [])
    assert reader.push("day") == (" <today", [])


@pytest.mark.parametrize("template, parser", [
    ("{% for m in messages %}<tool_call>{{ m }}</tool_call>{% endfor %}", "hermes"),
    ("{{- '<|python_tag|>' + tool_call.name }}", "llama3_json"),
    ("{%- if message.role == 'ipython' %}", "llama3_json"),
    ("{{ '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
    ("{{ messages }}", "hermes"),
    (None, "hermes"),
])
def test_chat_template_markers_pick_the_parser(template, parser):
    assert parser_for_chat_template(template) == parser
    assert PARSERS[parser].name == parser


def test_a_required_call_without_parallel_calls_guides_to_exactly_one(compiler):
    tools, choice = read_tools(TOOLS, "required")
    one = [{"name": "get_time", "arguments": {}}]
    two = json.dumps([*one, {"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert_guides(compiler, tool_guide(tools, choice, parallel=False), REQUIRED_CALLS_SCHEMA, valid=[one],
                  invalid=[two])
    assert writable(compiler.compile_grammar(tool_guide(tools, choice).guide), two)

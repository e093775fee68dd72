"""Guided decoding in the in-flight batching engine: random-weight models whose answers follow each request's
grammar, beside unguided rows and rows of other grammars, greedy and sampled, on the eager decode step and on the
step a CUDA graph captures (run here without a graph), for both tokenizer families."""

import json
import re

import jsonschema
import numpy as np
import pytest
import torch
import xgrammar
from transformers import AutoModelForCausalLM

from tritonforge.facts.errors import RequestError, UnsupportedError
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.guided import GuidedDecoding
from tritonforge.runtime.engine.sampling import SamplingParams
from tritonforge.runtime.engine.transformers.grammar import GrammarMasks, Grammars
from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine
from tritonforge.runtime.text.tokenization import load_tokenizer

from .sinks import Sink

WAIT_S = 120  # generous: CI machines are shared
MAX_NEW_TOKENS = 160  # room for every bounded answer below, whitespace included
PROMPT = "The engine"
# A random-weight model can walk a JSON grammar for ever (whitespace, long strings). Its JSON rows bias whitespace
# away (finite, as the engine's embedding bias must be) and the any-JSON row biases quotes and closing brackets
# up, so every answer ends well within MAX_NEW_TOKENS: the grammar alone decides what the answer may be. They bias
# lone bytes (byte-fallback tokens) away too: xgrammar before 0.2 lets a string hold bytes that are no whole
# character, which a string length counts otherwise than the decoded text does.
AWAY = -1.0e4
TOWARD = 30.0  # the tiny models' logits spread about 4 (one standard deviation): this wins where allowed

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "ok", "n"], "additionalProperties": False}
SMALL_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False}
STRUCTURAL_TAG = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>", "content": {
    "type": "json_schema", "json_schema": SMALL_SCHEMA}}}
REGEX = r"[ab]{3}-\d{2}"
EBNF = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'


def check_schema(text, schema=SCHEMA):
    jsonschema.validate(json.loads(text), schema)


def check_any_json(text):
    assert isinstance(json.loads(text), (dict, list))


def check_tag(text):
    inner = re.fullmatch(r"<f>(.*)</f>", text, re.DOTALL)
    assert inner, text
    check_schema(inner.group(1), SMALL_SCHEMA)


# guide → how its answer is checked, independently of xgrammar
CASES = {
    "json_schema": (GuidedDecoding("json_schema", json.dumps(SCHEMA)), check_schema),
    "json": (GuidedDecoding("json"), check_any_json),
    "regex": (GuidedDecoding("regex", REGEX), lambda text: re.fullmatch(REGEX, text) or pytest.fail(text)),
    "ebnf_grammar": (GuidedDecoding("ebnf_grammar", EBNF),
                     lambda text: re.fullmatch(r"(yes|no) \d\d?", text) or pytest.fail(text)),
    "structural_tag": (GuidedDecoding("structural_tag", json.dumps(STRUCTURAL_TAG)), check_tag),
}



@pytest.fixture(scope="module", params=[(family, path) for family in ("bpe", "sentencepiece")
                                        for path in ("eager", "static")], ids=lambda param: "-".join(param))
def setup(tiny_models, request):
    family, path = request.param
    tokenizer = load_tokenizer(tiny_models[family])
    model = AutoModelForCausalLM.from_pretrained(tiny_models[family]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=8, max_input_len=64, max_seq_len=512),
                                    tokenizer=tokenizer)
    if path == "static":
        engine.use_decode_graphs(capture=False)
    yield tokenizer, model, engine
    engine.shutdown()


def token_texts(tokenizer) -> list[str]:
    return [tokenizer.decode([token]) for token in range(len(tokenizer))]


def bias_for(tokenizer, vocab_size: int, case: str) -> np.ndarray | None:
    if case not in ("json_schema", "json", "structural_tag"):
        return None
    bias = np.zeros(vocab_size, dtype=np.float32)
    for token, text in enumerate(token_texts(tokenizer)):
        if (text and not text.strip()) or "\ufffd" in text:
            bias[token] = AWAY
        elif case == "json" and text in ('"', "}", "]"):
            bias[token] = TOWARD
    return bias


def submit(engine, tokenizer, *, guided=None, sampling=None, bias=None, end_id="eos",
           max_new_tokens=MAX_NEW_TOKENS, prompt=PROMPT, stream=False):
    request = GenerationRequest(request_id=prompt, prompt_ids=tokenizer(prompt).input_ids, sink=Sink(),
                                end_id=tokenizer.eos_token_id if end_id == "eos" else end_id, stream=stream,
                                max_new_tokens=max_new_tokens, sampling=sampling or SamplingParams(),
                                embedding_bias=bias,
                                guided_decoding=guided)
    engine.validate(request)
    engine.submit(request)
    return request.sink


def finished(sink):
    assert sink.done.wait(WAIT_S) and sink.error is None, sink.error
    return sink.result


def reference(model, tokenizer, prompt, max_new_tokens):
    ids = tokenizer(prompt).input_ids
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
    return out[:-1] if out and out[-1] == tokenizer.eos_token_id else out


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(top_k=40, top_p=0.95, temperature=1.0, seed=11)],
                         ids=["greedy", "sampled"])
def test_each_row_follows_its_own_grammar_beside_unguided_rows(setup, sampling):
    tokenizer, model, engine = setup
    vocab = model.config.vocab_size
    unguided_greedy = submit(engine, tokenizer, max_new_tokens=24)
    sinks = {case: submit(engine, tokenizer, guided=guided, sampling=sampling, bias=bias_for(tokenizer, vocab, case))
             for case, (guided, _) in CASES.items()}
    unguided_sampled = submit(engine, tokenizer, sampling=SamplingParams(top_k=40, temperature=1.0, seed=5),
                              max_new_tokens=24)
    for case, sink in sinks.items():
        result = finished(sink)
        text = tokenizer.decode(result.token_ids)
        assert result.finish_reason == "end_id", (case, text)  # the grammar ended it, not max_new_tokens
        assert tokenizer.eos_token_id not in result.token_ids
        CASES[case][1](text)
    # The rows without a grammar are untouched by their neighbours' masks.
    assert finished(unguided_greedy).token_ids == reference(model, tokenizer, PROMPT, 24)
    assert len(finished(unguided_sampled).token_ids) > 0


def test_greedy_guided_tokens_equal_a_step_by_step_reference_in_a_busy_batch(setup):
    """Token for token: the whole model run again each step, masked by xgrammar's own apply function."""
    tokenizer, model, engine = setup
    guided, _ = CASES["json_schema"]
    bias = bias_for(tokenizer, model.config.vocab_size, "json_schema")
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_json_schema(guided.guide))
    bitmask = xgrammar.allocate_token_bitmask(1, model.config.vocab_size)
    tokens = tokenizer(PROMPT).input_ids
    expected = []
    with torch.no_grad():
        while not matcher.is_terminated():
            logits = model(torch.tensor([tokens])).logits[:, -1].float() + torch.from_numpy(bias)
            matcher.fill_next_token_bitmask(bitmask)
            xgrammar.apply_token_bitmask_inplace(logits, bitmask)
            token = int(logits.argmax())
            assert matcher.accept_token(token)
            tokens.append(token)
            expected.append(token)
    others = [submit(engine, tokenizer, prompt=prompt, max_new_tokens=40) for prompt in ("A", "Hello world")]
    sink = submit(engine, tokenizer, guided=guided, bias=bias)
    assert finished(sink).token_ids == expected[:-1]  # the stop token ends the answer and is not part of it
    for other in others:
        finished(other)


def test_the_end_id_is_allowed_only_where_the_grammar_may_end(setup):
    tokenizer, model, engine = setup
    bias = np.zeros(model.config.vocab_size, dtype=np.float32)
    bias[tokenizer.eos_token_id] = TOWARD  # unguided, the answer would end at once
    result = finished(submit(engine, tokenizer, guided=GuidedDecoding("regex", "[ab]{3}"), bias=bias))
    assert re.fullmatch("[ab]{3}", tokenizer.decode(result.token_ids)) and result.finish_reason == "end_id"


def test_without_an_end_id_a_row_ends_once_its_grammar_is_complete(setup):
    """An engine request without end_id runs to max_new_tokens; a guided one ends with its grammar."""
    tokenizer, _, engine = setup
    result = finished(submit(engine, tokenizer, guided=GuidedDecoding("regex", "[ab]{3}"), end_id=None))
    assert re.fullmatch("[ab]{3}", tokenizer.decode(result.token_ids)) and result.finish_reason == "end_id"


def test_a_freed_slot_serves_an_unguided_request_unmasked_while_other_rows_are_guided(setup):
    """The lowest free slot goes to the next request: the unguided one takes the slot a guided one left, and runs
    in steps that mask (another guided row still runs), so a mask left in that slot would show."""
    tokenizer, model, engine = setup
    short = submit(engine, tokenizer, guided=GuidedDecoding("regex", "[ab]{3}"))
    long = submit(engine, tokenizer, guided=GuidedDecoding("regex", "[ab]{200}"), max_new_tokens=400, stream=True)
    finished(short)
    unguided = submit(engine, tokenizer, max_new_tokens=24)
    assert finished(unguided).token_ids == reference(model, tokenizer, PROMPT, 24)
    assert not long.done.is_set()  # it ran beside the unguided row to the end
    assert re.fullmatch("[ab]{200}", tokenizer.decode(finished(long).token_ids))


def test_bans_that_leave_the_grammar_no_token_end_the_answer_where_it_is(setup):
    """min_tokens bans the end id that a finished grammar alone allows: the row ends, its neighbours go on."""
    tokenizer, model, engine = setup
    neighbour = submit(engine, tokenizer, max_new_tokens=24, stream=True)
    assert neighbour.started.wait(WAIT_S)
    result = finished(submit(engine, tokenizer, guided=GuidedDecoding("regex", "a"),
                             sampling=SamplingParams(min_tokens=5)))
    assert tokenizer.decode(result.token_ids) == "a"
    assert finished(neighbour).token_ids == reference(model, tokenizer, PROMPT, 24)


@pytest.mark.parametrize(("guided", "reason"), [
    (GuidedDecoding("regex", "([a-"), "Unclosed"),
    (GuidedDecoding("json_schema", "{not json"), "Failed to parse JSON"),
    (GuidedDecoding("ebnf_grammar", "root ::= missing"), 'Rule "missing" is not defined'),
    (GuidedDecoding("structural_tag", "[1, 2"), "not JSON"),
    (GuidedDecoding("structural_tag", '{"type": "structural_tag"}'), "format"),
    (GuidedDecoding("structural_tag", '{"structures": [{"begin": "<f>"}], "triggers": []}'), "begin, schema and end"),
])
def test_a_guide_that_does_not_compile_is_a_request_error_and_the_running_rows_go_on(setup, guided, reason):
    tokenizer, model, engine = setup
    running = submit(engine, tokenizer, max_new_tokens=24, stream=True)
    assert running.started.wait(WAIT_S)
    with pytest.raises(RequestError, match=rf"^guided_decoding_guide: the {guided.guide_type} guide") as raised:
        submit(engine, tokenizer, guided=guided)
    assert reason in str(raised.value) and "/project/" not in str(raised.value)  # xgrammar's reason, not its log
    assert not isinstance(raised.value, UnsupportedError)
    assert finished(running).token_ids == reference(model, tokenizer, PROMPT, 24)


def test_the_older_structural_tag_format_of_structures_and_triggers_compiles(tiny_models):
    tokenizer = load_tokenizer(tiny_models["bpe"])
    grammars = Grammars(tokenizer, len(tokenizer))
    older = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": SMALL_SCHEMA, "end": "</f>"}],
             "triggers": ["<f>"]}
    matcher = grammars.matcher(grammars.compile(GuidedDecoding("structural_tag", json.dumps(older))))
    assert matcher.accept_string('free text <f>{"ok": true}</f>')


def test_an_engine_without_a_tokenizer_refuses_guided_requests_as_unsupported(tiny_models):
    tokenizer = load_tokenizer(tiny_models["bpe"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=512))
    try:
        with pytest.raises(UnsupportedError, match="^guided_decoding_guide_type: guided decoding is off"):
            submit(engine, tokenizer, guided=GuidedDecoding("json"))
    finally:
        engine.shutdown()


def test_the_mask_keeps_exactly_the_set_bits_of_each_row_across_words_and_the_sign_bit():
    """Hand-made bitmasks, read without xgrammar: bit t of word t // 32 allows token t (bit 31 is the int32 sign);
    a vocabulary that is not a multiple of 32 ends inside its last word."""
    vocab = 70

    class Fixed:
        vocab_size = vocab

    masks = GrammarMasks(3, Fixed(), vocab, torch.device("cpu"))
    allowed = {0: [0, 31, 32, 69], 2: [5, 63]}  # row 1 keeps every token
    for row, tokens in allowed.items():
        words = [0] * masks.host.shape[1]
        for token in tokens:
            words[token // 32] |= 1 << (token % 32)
        masks.host[row] = torch.tensor([word - (1 << 32) if word >= 1 << 31 else word for word in words],
                                       dtype=torch.int32)
    masks.upload()
    out = masks.apply(torch.zeros(3, vocab), slice(0, 3))
    for row in range(3):
        kept = torch.isfinite(out[row]).nonzero().flatten().tolist()
        assert kept == allowed.get(row, list(range(vocab)))
    only_last = masks.apply(torch.zeros(1, vocab), torch.tensor([2]))  # the rows of a prefill: a tensor of slots
    assert torch.isfinite(only_last[0]).nonzero().flatten().tolist() == allowed[2]


def test_the_engine_model_loads_the_tokenizer_its_build_named_and_without_one_turns_guided_decoding_off(
        tiny_models, tmp_path, caplog):
    """The build names preprocessing's tokenizer relative to the engine model; a repository built before guided
    decoding names none, and its checkpoint folder holds no tokenizer."""
    import shutil

    from tritonforge.builder.engines.transformers import parameters
    from tritonforge.builder.options import BuildOptions
    from tritonforge.facts.model_parameters import TransformersEngineParameters
    from tritonforge.runtime.engine.service import EngineSettings
    from tritonforge.runtime.engine.transformers.loading import load_guided_tokenizer

    shutil.copytree(tiny_models["bpe"], tmp_path / "preprocessing" / "tokenizer")
    (tmp_path / "tensorrt_llm" / "1" / "checkpoint").mkdir(parents=True)
    built = parameters(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "unused"), [])

    def settings(values):
        args = {"model_config": json.dumps({"parameters": {key: {"string_value": value}
                                                           for key, value in values.items()}}),
                "model_repository": str(tmp_path / "tensorrt_llm")}
        return EngineSettings.from_model_args(args, TransformersEngineParameters.from_config(values))

    tokenizer = load_guided_tokenizer(settings(built))
    assert tokenizer.get_vocab() == load_tokenizer(tiny_models["bpe"]).get_vocab()
    assert load_guided_tokenizer(settings({**built, "tokenizer_dir": ""})) is None
    assert "guided decoding is off" in caplog.text

"""The in-flight batching engine against transformers' own generate, without a server."""

import contextlib
import math
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from tritonforge.facts.errors import RequestError
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.sampling import SamplingParams
from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine
from tritonforge.runtime.text.tokenization import load_tokenizer

from .sinks import Sink

PROMPTS = ["The engine", "Hello world, the server reads a request", "你好 🚀", "A", "Stop phrases end"]
WAIT_S = 120  # generous: CI machines are shared



@pytest.fixture(scope="module", params=["eager", "static"])
def setup(tiny_models, request):
    """Each test runs on the eager decode step and on the step a CUDA graph captures (every slot, a bucketed
    length, static inputs), here run without a graph: the same logic, checkable on a CPU."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=128))
    if request.param == "static":
        engine.use_decode_graphs(capture=False)
    yield tokenizer, model, engine
    engine.shutdown()


def reference(model, tokenizer, prompt, max_new_tokens):
    ids = tokenizer(prompt).input_ids
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
    return out[:-1] if out and out[-1] == tokenizer.eos_token_id else out


def submit(engine, tokenizer, prompt, sink, **kwargs):
    request = GenerationRequest(request_id=kwargs.pop("request_id", prompt), prompt_ids=tokenizer(prompt).input_ids,
                                sink=sink, end_id=kwargs.pop("end_id", tokenizer.eos_token_id), stream=True,
                                max_new_tokens=kwargs.pop("max_new_tokens", 24), **kwargs)
    engine.validate(request)
    engine.submit(request)
    return sink


def test_greedy_equals_generate_with_requests_joining_midway(setup):
    tokenizer, model, engine = setup
    sinks = []
    for prompt in PROMPTS * 2:  # more requests than the batch holds: some wait, some join mid-generation
        if sinks:  # each one joins once the one before it is generating (or finished: a short generation)
            assert sinks[-1].started.wait(WAIT_S)
        sinks.append(submit(engine, tokenizer, prompt, Sink()))
    for prompt, sink in zip(PROMPTS * 2, sinks):
        assert sink.done.wait(WAIT_S) and sink.error is None
        assert sink.result.token_ids == sink.streamed + sink.final_tokens == reference(model, tokenizer, prompt, 24)
        # The last token is not streamed ahead of the end: it rides the final response (none after an end id).
        assert len(sink.final_tokens) == (1 if sink.result.finish_reason == "length" else 0)


def test_log_probs_and_the_likeliest_tokens_equal_the_models_own_forward_pass(setup):
    """Greedy, with 5 top log probs, beside a request without them in the same batch: each generated token's log
    probability and the likeliest 5 at its step are the log-softmax of the model's own logits for that step."""
    tokenizer, model, engine = setup
    plain = submit(engine, tokenizer, "The engine", Sink())
    sink = submit(engine, tokenizer, "Hello world, the server", Sink(), return_log_probs=True, num_top_log_probs=5,
                  max_new_tokens=12)
    assert sink.done.wait(WAIT_S) and plain.done.wait(WAIT_S) and sink.error is None
    prompt = tokenizer("Hello world, the server").input_ids
    generated = sink.result.token_ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1].float()
    expected = torch.log_softmax(logits, dim=-1)
    assert len(sink.result.top) == len(generated) == 12
    for step, (token, log_prob, top) in enumerate(zip(generated, sink.result.log_probs, sink.result.top)):
        assert log_prob == pytest.approx(expected[step, token].item(), abs=1e-4)
        values, ids = torch.topk(expected[step], 5)
        assert top.ids == ids.tolist() and top.ids[0] == token  # greedy: the likeliest is the one chosen
        assert top.log_probs == pytest.approx(values.tolist(), abs=1e-4)
    assert plain.result.top is None


def test_the_prompts_log_probs_equal_the_models_forward_pass_and_it_is_prefilled_alone(setup):
    """return_prompt_log_probs: before any token, each prompt token's log probability (none for the first) and the
    likeliest 4 at its place, from the model's own logits; a request beside it is answered as alone."""
    tokenizer, model, engine = setup

    class PromptSink(Sink):
        def prompt(self, log_probs, top):
            assert not self.streamed
            self.prompt_log_probs, self.prompt_top = log_probs, top

    beside = submit(engine, tokenizer, "The engine", Sink())
    sink = submit(engine, tokenizer, "Hello world, the server", PromptSink(), return_log_probs=True,
                  num_top_log_probs=4, return_prompt_log_probs=True, max_new_tokens=4)
    assert sink.done.wait(WAIT_S) and beside.done.wait(WAIT_S) and sink.error is None
    prompt = tokenizer("Hello world, the server").input_ids
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    assert math.isnan(sink.prompt_log_probs[0]) and sink.prompt_top[0] == ([], [])
    assert len(sink.prompt_log_probs) == len(sink.prompt_top) == len(prompt)
    for place in range(1, len(prompt)):
        assert sink.prompt_log_probs[place] == pytest.approx(expected[place - 1, prompt[place]].item(), abs=1e-4)
        values, ids = torch.topk(expected[place - 1], 4)
        assert sink.prompt_top[place].ids == ids.tolist()
        assert sink.prompt_top[place].log_probs == pytest.approx(values.tolist(), abs=1e-4)
    assert sink.result.token_ids == reference(model, tokenizer, "Hello world, the server", 4)
    assert beside.result.token_ids == reference(model, tokenizer, "The engine", 24)


def test_same_seed_samples_the_same_tokens(setup):
    tokenizer, _, engine = setup
    params = SamplingParams(top_k=50, temperature=1.0, seed=42)
    a = submit(engine, tokenizer, "The engine", Sink(), sampling=params)
    b = submit(engine, tokenizer, "The engine", Sink(), sampling=params)
    assert a.done.wait(WAIT_S) and b.done.wait(WAIT_S)
    assert a.result.token_ids == b.result.token_ids
    # And it is sampling: neither the greedy tokens nor another seed's (a silent fall back to greedy, or a
    # seed that is ignored, would make them equal).
    greedy = submit(engine, tokenizer, "The engine", Sink())
    other = submit(engine, tokenizer, "The engine", Sink(), sampling=SamplingParams(top_k=50, temperature=1.0,
                                                                                      seed=7))
    assert greedy.done.wait(WAIT_S) and other.done.wait(WAIT_S)
    assert a.result.token_ids != greedy.result.token_ids
    assert a.result.token_ids != other.result.token_ids


def test_stop_sequence_ends_generation_and_is_included(setup):
    tokenizer, model, engine = setup
    expected = reference(model, tokenizer, "The engine", 24)
    stop = expected[5:7]
    sink = submit(engine, tokenizer, "The engine", Sink(), stop_sequences=[stop])
    assert sink.done.wait(WAIT_S)
    assert sink.result.finish_reason == "stop_words" and sink.result.token_ids == expected[:7]


def test_end_id_ends_generation_and_min_tokens_masks_it(setup):
    tokenizer, model, engine = setup
    expected = reference(model, tokenizer, "The engine", 24)
    end_id = expected[3]
    sink = submit(engine, tokenizer, "The engine", Sink(), end_id=end_id)
    assert sink.done.wait(WAIT_S)
    assert sink.result.finish_reason == "end_id" and sink.result.token_ids == expected[:expected.index(end_id)]
    forced = submit(engine, tokenizer, "The engine", Sink(), end_id=end_id,
                    sampling=SamplingParams(min_tokens=10))
    assert forced.done.wait(WAIT_S) and len(forced.result.token_ids) >= 10


def test_an_end_id_outside_the_vocabulary_with_min_tokens_never_ends_the_answer_nor_fails_the_step(setup):
    """min_tokens bans the end id only where it is a token: a step that indexed past the vocabulary would fail
    every request running in it."""
    tokenizer, model, engine = setup
    sink = submit(engine, tokenizer, "The engine", Sink(), end_id=10**6, max_new_tokens=6,
                  sampling=SamplingParams(min_tokens=3))
    assert sink.done.wait(WAIT_S) and sink.error is None, sink.error
    assert sink.result.finish_reason == "length" and len(sink.result.token_ids) == 6


def test_bad_words_are_never_generated(setup):
    tokenizer, model, engine = setup
    expected = reference(model, tokenizer, "The engine", 24)
    sink = submit(engine, tokenizer, "The engine", Sink(), bad_sequences=[[expected[0]]])
    assert sink.done.wait(WAIT_S) and expected[0] not in sink.result.token_ids


def test_a_bad_word_of_several_tokens_bans_its_last_token_once_its_start_is_there():
    from tritonforge.runtime.engine.transformers.inflight import _banned_tokens

    assert _banned_tokens([5, 6, 7], [[7, 8], [6, 7, 9], [1, 2], [4], [5, 7, 3]]) == [8, 9, 4]
    assert _banned_tokens([], [[1, 2], [3]]) == [3]


def test_a_bad_word_of_two_tokens_is_never_generated(setup):
    tokenizer, model, engine = setup
    expected = reference(model, tokenizer, "The engine", 24)
    sink = submit(engine, tokenizer, "The engine", Sink(), bad_sequences=[expected[2:4]])
    assert sink.done.wait(WAIT_S)
    generated = sink.result.token_ids
    assert generated[:3] == expected[:3] and generated[3] != expected[3]  # banned right after its start


def test_cancelled_request_stops_and_frees_its_slot(setup):
    tokenizer, _, engine = setup
    sink = submit(engine, tokenizer, "The engine", Sink(cancel_after=3), max_new_tokens=100)
    assert sink.done.wait(WAIT_S) and sink.result.finish_reason == "cancelled"
    assert len(sink.streamed) < 100
    # The slot is free: the engine's published statistics count no running sequence and no cache in use.
    deadline = time.monotonic() + WAIT_S
    while engine.stats.scheduled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats.scheduled == 0 and engine.stats.kv_tokens == 0


def test_cancel_by_request_id(setup):
    tokenizer, _, engine = setup
    sink = submit(engine, tokenizer, "The engine", Sink(), max_new_tokens=100, request_id="r-1")
    engine.cancel("r-1")
    assert sink.done.wait(WAIT_S) and sink.result.finish_reason == "cancelled"


@pytest.mark.parametrize("kwargs, field", [
    ({"max_new_tokens": 0}, "request_output_len"),
    ({"max_new_tokens": 127}, "request_output_len"),
])
def test_engine_limits_are_enforced(setup, kwargs, field):
    tokenizer, _, engine = setup
    with pytest.raises(RequestError, match=field):
        submit(engine, tokenizer, "The engine", Sink(), **kwargs)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"), ({"temperature": float("nan")}, "temperature"),
])
def test_out_of_range_sampling_values_are_rejected(kwargs, field):
    with pytest.raises(RequestError, match=f"^{field}"):
        SamplingParams(**kwargs)


def test_freed_slot_serves_a_new_request_without_its_predecessors_cache(setup):
    """A finished request leaves its slot as it was; the next one in it writes its own columns and must not
    attend to the longer predecessor's leftovers past its own length."""
    tokenizer, model, engine = setup
    keeper = submit(engine, tokenizer, "Hello world, the server reads a request", Sink(), max_new_tokens=60,
                    end_id=None)
    assert keeper.started.wait(WAIT_S)
    long = submit(engine, tokenizer, "The engine", Sink(), max_new_tokens=40, end_id=None)
    assert long.done.wait(WAIT_S) and len(long.result.token_ids) == 40
    short = submit(engine, tokenizer, "A", Sink(), max_new_tokens=8)  # takes the freed slot, beside `keeper`
    assert short.done.wait(WAIT_S) and keeper.done.wait(WAIT_S)
    assert short.result.token_ids == reference(model, tokenizer, "A", 8)
    assert engine._free == sorted(engine._free) and len(engine._free) == engine.limits.max_batch_size


def test_seeded_sampling_is_the_same_alone_and_in_a_busy_batch(setup):
    tokenizer, _, engine = setup
    params = SamplingParams(top_k=50, temperature=1.5, seed=2**40 + 3, repetition_penalty=1.2)
    alone = submit(engine, tokenizer, "The engine", Sink(), sampling=params, request_id="alone")
    greedy = submit(engine, tokenizer, "The engine", Sink(), request_id="greedy",
                    sampling=SamplingParams(repetition_penalty=1.2))
    assert alone.done.wait(WAIT_S) and greedy.done.wait(WAIT_S)
    assert alone.result.token_ids != greedy.result.token_ids  # it does sample
    # They run on while `busy` generates, so it joins a batch of three, in another slot than `alone` had.
    others = [submit(engine, tokenizer, prompt, Sink(), request_id=f"other-{i}", end_id=None, max_new_tokens=60,
                     sampling=SamplingParams(top_k=5, seed=i) if i % 2 else SamplingParams())
              for i, prompt in enumerate(PROMPTS[:3])]
    assert all(other.started.wait(WAIT_S) for other in others)
    busy = submit(engine, tokenizer, "The engine", Sink(), sampling=params, request_id="busy")
    assert busy.done.wait(WAIT_S) and all(other.done.wait(WAIT_S) for other in others)
    assert busy.result.token_ids == alone.result.token_ids


@contextlib.contextmanager
def held(engine):
    """Hold the engine's next iteration until the block ends, so that what is submitted meanwhile is
    admitted in one iteration; yields the sizes of the groups it prefills, recorded until the block's requests
    are done (`done`)."""
    gate, sizes = threading.Event(), []
    iteration, prefill = engine._iteration, engine._prefill
    engine._iteration = lambda: (gate.wait(WAIT_S), iteration())
    engine._prefill = lambda group: (sizes.append(len(group)), prefill(group))
    try:
        yield sizes
    finally:
        gate.set()


def unhold(engine):
    del engine._iteration, engine._prefill


def test_requests_admitted_together_are_prefilled_in_one_pass_as_each_alone(setup):
    """Prompts of different lengths, right-padded into one forward pass: each one's greedy tokens are
    generate's, and a sampled, penalised request among them draws what it draws alone."""
    tokenizer, model, engine = setup
    params = SamplingParams(top_k=20, temperature=1.2, seed=5, repetition_penalty=1.3, frequency_penalty=3.0)
    alone = submit(engine, tokenizer, "Hello world", Sink(), sampling=params, request_id="alone", end_id=None)
    assert alone.done.wait(WAIT_S)
    prompts = ["The engine", "Hello world, the server reads a request", "A"]
    assert len({len(tokenizer(prompt).input_ids) for prompt in prompts}) == len(prompts)
    with held(engine) as sizes:
        sinks = [submit(engine, tokenizer, prompt, Sink(), request_id=f"joined-{i}")
                 for i, prompt in enumerate(prompts)]
        sampled = submit(engine, tokenizer, "Hello world", Sink(), sampling=params, request_id="sampled",
                         end_id=None)
    assert sampled.done.wait(WAIT_S) and all(sink.done.wait(WAIT_S) for sink in sinks)
    unhold(engine)
    assert sizes[0] == engine.limits.max_batch_size == len(prompts) + 1
    for prompt, sink in zip(prompts, sinks):
        assert sink.result.token_ids == reference(model, tokenizer, prompt, 24)
    assert sampled.result.token_ids == alone.result.token_ids


def test_a_failed_graph_capture_warns_once_and_decodes_eagerly(tiny_models, caplog):
    """No CUDA here: every capture fails, as one would on a GPU for any reason; requests do not notice."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=2, max_input_len=64, max_seq_len=128))
    engine.use_decode_graphs(capture=True)
    try:
        with caplog.at_level("WARNING"):
            sinks = [submit(engine, tokenizer, prompt, Sink(), max_new_tokens=8) for prompt in PROMPTS[:3]]
            assert all(sink.done.wait(WAIT_S) and sink.error is None for sink in sinks)
    finally:
        engine.shutdown()
    for prompt, sink in zip(PROMPTS, sinks):
        assert sink.result.token_ids == reference(model, tokenizer, prompt, 8)
    warnings = [record for record in caplog.records if "CUDA graphs are off" in record.getMessage()]
    assert len(warnings) == 1 and not engine.cuda_graphs


def test_while_sequences_run_admissions_wait_to_be_prefilled_together(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=16, max_input_len=64, max_seq_len=128),
                                    admission_wait_steps=3)
    engine.shutdown()  # its state is driven by hand below
    engine._waiting = ["a"]
    assert engine._admitting()  # nothing runs: at once
    engine._occupied[0] = True
    engine._free.remove(0)
    assert not engine._admitting()  # one waits: fewer than 16 / 8
    engine._decode_steps += 2
    assert not engine._admitting()
    engine._decode_steps += 1
    assert engine._admitting()  # waited 3 steps
    engine._waiting = ["a", "b"]
    assert engine._admitting()  # an eighth of the slots: at once
    engine._waiting = ["a"]
    engine._free = [1]
    assert engine._admitting()  # every free slot
    engine._waiting = []
    assert not engine._admitting() and engine._deferred_since is None


def test_a_prompt_longer_than_the_prefill_budget_is_prefilled_alone_and_the_next_one_waits_its_turn(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=128),
                                    prefill_tokens=4)
    engine.shutdown()  # its state is driven by hand below
    long, short = (GenerationRequest(request_id=name, prompt_ids=[5] * length, max_new_tokens=1, sink=Sink())
                   for name, length in (("long", 6), ("short", 1)))
    engine._waiting = [long, short]
    assert engine._take_group() == [long]  # the first always, even past the budget; 2 × 6 > 4 leaves the next
    assert engine._take_group() == [short]


@pytest.mark.parametrize("graph_logic", [False, True])
def test_a_long_first_prompt_grows_every_layer_of_the_cache_and_later_requests_still_equal_generate(
        tiny_models, graph_logic):
    """The slot cache starts at 256 columns and doubles: a first prompt longer than that must grow every
    layer (not only the first), and a short request after it must run past 256 columns too."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=2, max_input_len=400, max_seq_len=1024))
    if graph_logic:
        engine.use_decode_graphs(capture=False)
    try:
        long_prompt = " ".join(["the server reads a request"] * 60)
        assert len(tokenizer(long_prompt).input_ids) > 256
        for prompt, new_tokens in ((long_prompt, 8), ("A", 300)):
            sink = submit(engine, tokenizer, prompt, Sink(), max_new_tokens=new_tokens)
            assert sink.done.wait(WAIT_S) and sink.error is None, sink.error
            assert sink.result.token_ids == reference(model, tokenizer, prompt, new_tokens)
    finally:
        engine.shutdown()


def test_min_tokens_lets_the_end_id_end_the_answer_once_that_many_tokens_exist(setup):
    tokenizer, model, engine = setup
    expected = reference(model, tokenizer, "The engine", 24)
    end_id = expected[3]
    ends_at = expected.index(end_id)
    sink = submit(engine, tokenizer, "The engine", Sink(), end_id=end_id, sampling=SamplingParams(min_tokens=ends_at))
    assert sink.done.wait(WAIT_S)
    assert sink.result.finish_reason == "end_id" and sink.result.token_ids == expected[:ends_at]

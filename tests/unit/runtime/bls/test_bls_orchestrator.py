"""The BLS's logic (tritonforge/runtime/bls/): a client's request in, its rows run as `RowStream`s over the engine, the
client's responses out. The engine is a test double of the BLS's stream to it (`FakeEngineStream`) answering from
a script; the tokenizers are the real tiny ones of both families, so the token ids are real and a character can
span responses. The BLS over a real tritonserver is tested in tests/integration/test_bls.py."""

import threading
import time

import numpy as np
import pytest

from tests.unit.pb_utils_stand_in import FINAL, PB_UTILS_STAND_IN
from tests.unit.runtime.engine.test_engine_thread_faults import WAIT_S, Request, Sender
from tritonforge.facts.contract import (
    CUM_LOG_PROBS,
    EXCLUDE_INPUT_IN_OUTPUT,
    NUM_TOP_LOG_PROBS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    PROMPT_LOG_PROBS,
    PROMPT_TOP_LOG_PROBS,
    PROMPT_TOP_TOKEN_IDS,
    REQUEST_OUTPUT_LEN,
    RETURN_PROMPT_LOG_PROBS,
    SEQUENCE_LENGTH,
    STREAMING,
    TOP_LOG_PROBS,
    TOP_TOKEN_IDS,
)
from tritonforge.facts.errors import EngineCallError, EngineStreamError
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.bls.engine_stream import EngineCall
from tritonforge.runtime.bls.orchestrator import BlsOrchestrator, BlsSettings
from tritonforge.runtime.text.detokenization import TokenBytes
from tritonforge.runtime.text.tokenization import load_tokenizer

LOG_PROB = -0.5  # every scripted token's
PROMPT_LOG_PROB = -1.5  # every scored prompt token's but the first
TOKEN_PERIOD_S = 0.005  # between the tokens of an engine request that runs until it is stopped
UNTIL_STOPPED = object()  # a script's step: one token every TOKEN_PERIOD_S until the request's `stop` comes
# A request nobody stops still ends, after 10 s of tokens: a BLS that fails to stop it fails its test instead of
# leaving a worker waiting that holds the run's exit.
UNSTOPPED_TOKENS = 2000


def engine_response(ids: list[int], top: int = 0, prompt: list[int] | None = None) -> dict[str, np.ndarray]:
    """One streamed engine response, as the engine stream hands it over; with `top`, the likeliest tokens at each
    step: the token itself, then the ids after it, each less likely by 1; with `prompt`, its log probabilities
    (NaN, then PROMPT_LOG_PROB each) and likeliest tokens alike."""
    count = len(ids)
    response = {OUTPUT_IDS: np.array(ids, np.int32).reshape(1, 1, count),
                SEQUENCE_LENGTH: np.array([[count]], np.int32),
                OUTPUT_LOG_PROBS: np.full((1, 1, count), LOG_PROB, np.float32),
                CUM_LOG_PROBS: np.array([[LOG_PROB * count]], np.float32)}
    if top:
        response[TOP_TOKEN_IDS] = np.array([[[token + rank for rank in range(top)] for token in ids]], np.int32)
        response[TOP_LOG_PROBS] = np.array([[[LOG_PROB - rank for rank in range(top)] for _ in ids]], np.float32)
    if prompt is not None:
        response[PROMPT_LOG_PROBS] = np.array([[np.nan] + [PROMPT_LOG_PROB] * (len(prompt) - 1)], np.float32)
        response[PROMPT_TOP_TOKEN_IDS] = np.array([[[token + rank for rank in range(top)] for token in prompt]],
                                                  np.int32)
        response[PROMPT_TOP_LOG_PROBS] = np.full((1, len(prompt), top), PROMPT_LOG_PROB, np.float32)
    return response


class FakeEngineStream:
    """A test double of `EngineStream` (the BLS's gRPC stream to the engine model). Each engine request is
    answered by `script(inputs)`, a list of steps played on a thread of its own: a list of token ids (one
    response), an exception (the engine's error, which ends the request), an event (to wait for), or
    UNTIL_STOPPED (a token every few milliseconds until the request's `stop`, UNSTOPPED_TOKENS at most). Its
    end is the engine's empty final response. `close` ends every open request with the error the real
    stream's closing gives."""

    def __init__(self, script, filler_token: int):
        self.script, self.filler_token = script, filler_token
        self.requests: dict[str, dict[str, np.ndarray]] = {}  # the engine inputs, by request id
        self.stops: list[str] = []  # the request ids a `stop` was sent for
        self._stopped: dict[str, threading.Event] = {}
        self._calls: dict[str, EngineCall] = {}
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def call(self, request_id, inputs, outputs, on_response) -> EngineCall:
        engine_call = EngineCall(on_response)
        with self._lock:
            self.requests[request_id], self._calls[request_id] = inputs, engine_call
            self._stopped[request_id] = threading.Event()
        threading.Thread(target=self._play, args=(request_id, engine_call, self.script(inputs)), daemon=True).start()
        return engine_call

    def stop(self, request_id: str) -> None:
        with self._lock:
            self.stops.append(request_id)
            self._stopped[request_id].set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            calls = list(self._calls.values())
        for engine_call in calls:
            engine_call.end(EngineStreamError("the stream to the engine model closed"))

    def _play(self, request_id: str, engine_call: EngineCall, steps: list) -> None:
        prompt_sent = False
        for step in steps:
            if isinstance(step, Exception):
                engine_call.end(step)
                return
            if isinstance(step, threading.Event):
                assert step.wait(WAIT_S)
                continue
            responses = self._until_stopped(request_id) if step is UNTIL_STOPPED else [step]
            for ids in responses:
                if self._closed.is_set():
                    engine_call.end(EngineStreamError("the stream to the engine model closed"))
                    return
                inputs = self.requests[request_id]
                top = int(inputs.get(NUM_TOP_LOG_PROBS, np.zeros(1)).reshape(-1)[0])
                scores_prompt = RETURN_PROMPT_LOG_PROBS in inputs and not prompt_sent
                prompt = inputs["input_ids"].reshape(-1).tolist() if scores_prompt else None
                prompt_sent = True
                if engine_call.deliver(engine_response(ids, top, prompt), final=False):
                    return  # the BLS's handler raised: the call is over
        engine_call.deliver({}, final=True)

    def _until_stopped(self, request_id: str):
        for _ in range(UNSTOPPED_TOKENS):
            if self._stopped[request_id].wait(TOKEN_PERIOD_S) or self._closed.is_set():
                return
            yield [self.filler_token]


@pytest.fixture()
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


@pytest.fixture()
def make_bls(tiny_model, tokenizer):
    """Makes an orchestrator over a FakeEngineStream playing `script`; shuts every one down at the end."""
    made = []
    filler = token_ids(tokenizer, "a")[-1]

    def make(script, *, decoupled: bool = True) -> tuple[BlsOrchestrator, FakeEngineStream]:
        engine = FakeEngineStream(script, filler)
        settings = BlsSettings(tokenizer_dir=str(tiny_model), limits=EngineLimits(max_input_len=64, max_seq_len=256),
                               engine_model="tensorrt_llm", engine_url="unused:0", max_concurrency=4,
                               add_special_tokens=True, decoupled=decoupled)
        made.append(BlsOrchestrator(PB_UTILS_STAND_IN, settings, engine=engine))
        return made[-1], engine

    yield make
    for orchestrator in made:
        orchestrator.shutdown()


def token_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def one_token_a_response(ids: list[int]) -> list[list[int]]:
    return [[token] for token in ids]


def client_inputs(prompt: str = "Hello there", *, max_tokens: int = 32, stream: bool = True, **extra) -> dict:
    return {"text_input": np.array([[prompt.encode()]], dtype=object),
            "max_tokens": np.array([[max_tokens]], np.int32), "stream": np.array([[stream]]),
            **{name: np.asarray(value) for name, value in extra.items()}}


def answer(bls: BlsOrchestrator, inputs: dict, sender: Sender | None = None) -> Sender:
    """Submit a request; return its sender once the final response came."""
    sender = sender or Sender()
    bls.submit(Request("client-id", sender, inputs=inputs))
    assert sender.final.wait(WAIT_S), "the request never ended"
    return sender


def outputs(sender: Sender) -> list[dict]:
    """Every response's tensors, an error response as {"error": ...}; the final flag alone is left out."""
    return [{"error": response.error} if response.error else dict(response.tensors)
            for response, _ in sender.sent if response is not None]


def texts(sender: Sender) -> list[str]:
    return [response["text_output"][0].decode() for response in outputs(sender) if "error" not in response]


def final_error(sender: Sender):
    """The error the request ended with; None for an answer (the final flag alone is one)."""
    (response, flags) = sender.sent[-1]
    assert flags == FINAL
    return None if response is None else response.error


def test_streamed_chunks_are_whole_characters_when_a_character_spans_responses(make_bls, tokenizer):
    ids = token_ids(tokenizer, "naïve 你好 🚀 done")
    table = TokenBytes(tokenizer)
    assert any(_not_whole(table.decode([token])) for token in ids)  # some response ends mid-character
    bls, _ = make_bls(lambda inputs: one_token_a_response(ids))
    sender = answer(bls, client_inputs(return_num_output_tokens=[[True]]))
    chunks = texts(sender)
    assert "".join(chunks) == table.decode(ids).decode() and "你好 🚀" in "".join(chunks)
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert sum(response["num_output_tokens"].item() for response in outputs(sender)) == len(ids)
    assert [flags for _, flags in sender.sent] == [0] * (len(sender.sent) - 1) + [FINAL]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_each_response_carries_the_tokens_it_adds_with_their_bytes_log_probs_and_alternatives(
        make_bls, tokenizer, stream):
    """num_top_log_probs: the responses' tokens are the engine's, each once, in order; the text so far is always
    the start of the tokens' bytes so far (a token that ends mid-character waits for the response whose text
    holds that character), and at the end the two are equal."""
    ids = token_ids(tokenizer, "naïve 你好 🚀 done")
    table = TokenBytes(tokenizer)
    paced = [step for token in ids for step in ([token], Pause())]  # mostly a response per token, streamed
    bls, engine = make_bls(lambda inputs: paced)
    sender = answer(bls, client_inputs(stream=stream, num_top_log_probs=[[2]]))
    (engine_inputs,) = engine.requests.values()
    assert engine_inputs["return_log_probs"].item() and engine_inputs[NUM_TOP_LOG_PROBS].item() == 2
    responses = outputs(sender)
    text, token_bytes, sent = "", b"", []
    for response in responses:
        text += response["text_output"][0].decode()
        token_bytes += b"".join(response["token_bytes"].reshape(-1))
        assert token_bytes.startswith(text.encode())
        sent += response["token_ids"].reshape(-1).tolist()
        count = response["token_ids"].size
        assert response["token_log_probs"].shape == (1, count) and np.all(response["token_log_probs"] == LOG_PROB)
        assert response["top_token_ids"].shape == response["top_log_probs"].shape == (1, count, 2)
        assert [[table.token_bytes(int(token)) for token in row] for row in response["top_token_ids"][0]] == \
            response["top_token_bytes"][0].tolist()
        assert np.all(response["top_token_ids"][0, :, 0] == response["token_ids"][0])
    assert sent == ids and token_bytes == text.encode() == table.decode(ids)
    assert stream or len(responses) == 1


def test_the_prompts_tokens_come_first_in_the_token_log_scored_as_the_engine_scored_them(make_bls, tokenizer):
    ids = token_ids(tokenizer, "one two three")
    bls, engine = make_bls(lambda inputs: one_token_a_response(ids))
    sender = answer(bls, client_inputs(num_top_log_probs=[[2]], return_prompt_log_probs=[[True]]))
    (engine_inputs,) = engine.requests.values()
    prompt = engine_inputs["input_ids"].reshape(-1).tolist()
    assert engine_inputs[RETURN_PROMPT_LOG_PROBS].item()
    responses = outputs(sender)
    logged = [token for response in responses for token in response["token_ids"].reshape(-1).tolist()]
    log_probs = np.concatenate([response["token_log_probs"].reshape(-1) for response in responses])
    assert logged == prompt + ids and np.isnan(log_probs[0])
    assert np.all(log_probs[1:len(prompt)] == PROMPT_LOG_PROB) and np.all(log_probs[len(prompt):] == LOG_PROB)
    first = responses[0]
    assert first["top_token_ids"].shape[1] >= len(prompt)
    assert first["top_token_ids"][0, 0].tolist() == [prompt[0], prompt[0] + 1]


def test_a_top_log_probs_count_past_20_is_refused_naming_it(make_bls):
    bls, engine = make_bls(lambda inputs: [[5]])
    sender = answer(bls, client_inputs(num_top_log_probs=[[21]]))
    assert "num_top_log_probs: must be in [0, 20], got 21" in final_error(sender).message and not engine.requests


def _not_whole(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_a_stop_phrase_straddling_responses_is_never_sent_and_stops_the_engine(make_bls, tokenizer):
    ids = token_ids(tokenizer, "The answer is 42. STOP here, then more")
    table = TokenBytes(tokenizer)
    whole = table.decode(ids).decode()
    assert not any("STOP here" in table.decode([token]).decode(errors="replace") for token in ids)  # it straddles
    bls, engine = make_bls(lambda inputs: [*one_token_a_response(ids), UNTIL_STOPPED])
    sender = answer(bls, client_inputs(stop_words=[[b"STOP here"]]))
    assert "".join(texts(sender)) == whole[:whole.index("STOP here")]
    assert final_error(sender) is None
    assert engine.stops == list(engine.requests)  # the engine's request was stopped, and only it


def test_text_held_back_as_a_stop_phrases_start_goes_out_in_the_last_response(make_bls, tokenizer):
    ids = token_ids(tokenizer, "bread and")
    bls, engine = make_bls(lambda inputs: one_token_a_response(ids))
    sender = answer(bls, client_inputs(stop_words=[[b"and zebra"]]))
    chunks = texts(sender)
    assert "".join(chunks) == TokenBytes(tokenizer).decode(ids).decode()
    assert chunks[-1].endswith("and") and sender.sent[-1][1] == FINAL  # held until the end, then sent
    assert engine.stops == []


@pytest.mark.parametrize("exclude_input", [True, False])
def test_a_whole_answer_echoes_the_prompt_only_when_exclude_input_in_output_is_false(make_bls, tokenizer,
                                                                                    exclude_input):
    ids = token_ids(tokenizer, " and welcome")
    bls, engine = make_bls(lambda inputs: one_token_a_response(ids))
    sender = answer(bls, client_inputs("Hello there", stream=False,
                                       exclude_input_in_output=[[exclude_input]]))
    generated = TokenBytes(tokenizer).decode(ids).decode()
    assert texts(sender) == [generated if exclude_input else "Hello there" + generated]
    (request,) = engine.requests.values()  # the engine streams without the prompt, whatever the client asked
    assert request[EXCLUDE_INPUT_IN_OUTPUT].item() and request[STREAMING].item()


def test_an_engine_error_ends_its_own_request_only(make_bls, tokenizer):
    ids = token_ids(tokenizer, "fine words")
    failed = threading.Event()

    def script(inputs):
        if inputs[REQUEST_OUTPUT_LEN].item() == 7:
            return [ids[:1], EngineCallError("request_output_len: too long")]
        return [ids[:1], failed, *one_token_a_response(ids[1:])]  # still open when the other one fails

    bls, engine = make_bls(script)
    failing, healthy = Sender(), Sender()
    bls.submit(Request("failing", failing, inputs=client_inputs(max_tokens=7)))
    bls.submit(Request("healthy", healthy, inputs=client_inputs(max_tokens=8)))
    assert failing.final.wait(WAIT_S)
    failed.set()
    assert healthy.final.wait(WAIT_S)
    error = final_error(failing)
    assert error.message == "request_output_len: too long" and error.code == "INVALID_ARG"
    assert final_error(healthy) is None and "".join(texts(healthy)) == TokenBytes(tokenizer).decode(ids).decode()
    failed_id = next(rid for rid, inputs in engine.requests.items() if inputs[REQUEST_OUTPUT_LEN].item() == 7)
    assert engine.stops == [failed_id]  # the failed request's slot is freed; the other's untouched


class LeavingSender(Sender):
    """A client that goes away once it got two responses."""

    def is_cancelled(self):
        return len(self.sent) >= 2


def test_a_client_that_goes_away_stops_its_engine_request(make_bls):
    bls, engine = make_bls(lambda inputs: [UNTIL_STOPPED])
    answer(bls, client_inputs(), LeavingSender())
    assert engine.stops == list(engine.requests)


def test_a_chunk_that_cannot_be_sent_ends_the_request_with_an_error_and_stops_the_engine(make_bls):
    bls, engine = make_bls(lambda inputs: [UNTIL_STOPPED])
    sender = answer(bls, client_inputs(), Sender(fail_at=2))
    error = final_error(sender)
    assert error.code == "INTERNAL" and "could not be sent" in error.message
    assert engine.stops == list(engine.requests)


def test_a_batched_request_answers_each_row_with_its_batch_index_and_its_log_probs_summed(make_bls, tokenizer):
    rows = {5: token_ids(tokenizer, " one"), 9: token_ids(tokenizer, " two three")}
    bls, _ = make_bls(lambda inputs: one_token_a_response(rows[inputs[REQUEST_OUTPUT_LEN].item()]))
    inputs = {"text_input": np.array([[b"first"], [b"second"]], dtype=object),
              "max_tokens": np.array([[5], [9]], np.int32), "stream": np.array([[False]]),
              "return_log_probs": np.array([[True]]), "return_num_output_tokens": np.array([[True]])}
    sender = answer(bls, inputs)
    by_row = {response["batch_index"].item(): response for response in outputs(sender)}
    assert sorted(by_row) == [0, 1] and [flags for _, flags in sender.sent] == [0, FINAL]
    table = TokenBytes(tokenizer)
    for row, ids in enumerate(rows.values()):
        response = by_row[row]
        assert response["text_output"][0].decode() == table.decode(ids).decode()
        assert response["num_output_tokens"].item() == len(ids)
        assert response["output_log_probs"].reshape(-1).tolist() == [LOG_PROB] * len(ids)
        assert response["cum_log_probs"].item() == LOG_PROB * len(ids)


def test_a_single_requests_responses_carry_no_batch_index_and_no_log_probs_unless_asked(make_bls, tokenizer):
    bls, _ = make_bls(lambda inputs: one_token_a_response(token_ids(tokenizer, " one")))
    (response,) = outputs(answer(bls, client_inputs(stream=False)))
    assert set(response) == {"text_output"}


def test_a_request_open_when_the_model_shuts_down_ends_unavailable(make_bls):
    bls, _ = make_bls(lambda inputs: [UNTIL_STOPPED])
    sender = Sender()
    bls.submit(Request("open", sender, inputs=client_inputs()))
    deadline = time.monotonic() + WAIT_S
    while not sender.sent and time.monotonic() < deadline:  # streaming: it is running
        time.sleep(TOKEN_PERIOD_S)
    bls.shutdown()
    assert sender.final.is_set()  # shutdown returned once the request had ended
    assert final_error(sender).code == "UNAVAILABLE"


def test_a_bls_deployed_not_decoupled_refuses_streaming_and_asks_the_engine_for_one_answer(make_bls, tokenizer):
    ids = token_ids(tokenizer, " whole")
    bls, engine = make_bls(lambda inputs: [ids], decoupled=False)
    refused = final_error(answer(bls, client_inputs(stream=True)))
    assert refused.code == "INVALID_ARG" and refused.message.startswith("stream: ")
    assert engine.requests == {}
    sender = answer(bls, client_inputs(stream=False))
    assert texts(sender) == [TokenBytes(tokenizer).decode(ids).decode()] and final_error(sender) is None
    (request,) = engine.requests.values()
    assert not request[STREAMING].item()


class SignallingSender(Sender):
    """Says when its first response was sent."""

    def __init__(self):
        super().__init__()
        self.first_sent = threading.Event()

    def send(self, response=None, flags=0):
        super().send(response, flags)
        self.first_sent.set()


class Pause(threading.Event):
    """A script's step that waits a while: an engine slower than the BLS's senders."""

    def wait(self, timeout=None):
        time.sleep(TOKEN_PERIOD_S * 4)
        return True


@pytest.mark.parametrize("interval", [1, 4])
def test_a_stream_interval_sends_the_first_response_at_once_then_that_many_engine_responses_a_chunk(
        make_bls, tokenizer, interval):
    ids = token_ids(tokenizer, "one two three four five six seven eight nine")
    sender = SignallingSender()
    # The engine waits for the first chunk's send: what follows never joins it, whatever the threads' timing; then
    # it is slower than the senders, which would send each response alone but for the interval.
    paced = [step for token in ids[1:] for step in ([token], Pause())]
    bls, _ = make_bls(lambda inputs: [ids[:1], sender.first_sent, *paced])
    answer(bls, client_inputs(stream_interval=[[interval]], return_num_output_tokens=[[True]]), sender)
    assert "".join(texts(sender)) == TokenBytes(tokenizer).decode(ids).decode()
    tokens = [response["num_output_tokens"].item() for response in outputs(sender)]  # one a response here
    assert sum(tokens) == len(ids) and tokens[0] == 1
    # Responses that came while a send waited join it (more, never fewer); the last takes what is left.
    assert all(count >= interval for count in tokens[1:-1])
    assert len(tokens) <= 2 + (len(ids) - 1) // interval


@pytest.mark.parametrize(("value", "message"), [([[0]], "stream_interval: must be >= 1, got 0"),
                                                ([[2, 3]], "stream_interval: has 2 values, the request has 1 rows")])
def test_a_bad_stream_interval_is_refused_naming_it_before_the_engine_is_called(make_bls, value, message):
    bls, engine = make_bls(lambda inputs: [UNTIL_STOPPED])
    error = final_error(answer(bls, client_inputs(stream_interval=value)))
    assert (error.code, error.message) == ("INVALID_ARG", message)
    assert engine.requests == {}

"""Edges a change can silently move: the largest request the limits allow is served, one bad request of a batch
fails alone, and a full engine queue is the server's condition (503), never the client's mistake (400)."""

from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.pb_utils_stand_in import PB_UTILS_STAND_IN
from tritonforge.clients.client import GenerationError
from tritonforge.facts.errors import QueueFullError, RequestError
from tritonforge.facts.limits import EngineLimits
from tritonforge.gateway.serving import to_openai_error as _triton_error
from tritonforge.runtime.engine.generation import GenerationRequest, check_limits
from tritonforge.runtime.text.preprocess import PREPROCESSING_TENSORS, Preprocessor
from tritonforge.runtime.triton_adapter import answer_each, to_triton_error

LIMITS = EngineLimits(max_input_len=32, max_seq_len=101, max_batch_size=2, max_queue_size=3)
PROMPT = [5, 6, 7, 8]


def generation(max_new_tokens: int, prompt=PROMPT) -> GenerationRequest:
    return GenerationRequest(request_id="", prompt_ids=list(prompt), max_new_tokens=max_new_tokens, sink=None)


def test_the_engine_serves_a_request_that_fills_max_seq_len_exactly_and_refuses_one_more_token():
    check_limits(generation(LIMITS.max_seq_len - len(PROMPT)), LIMITS, vocab_size=100, pending=0)
    with pytest.raises(RequestError, match="^request_output_len: .*exceeds max_seq_len 101"):
        check_limits(generation(LIMITS.max_seq_len - len(PROMPT) + 1), LIMITS, vocab_size=100, pending=0)


def test_the_engine_serves_the_longest_prompt_and_refuses_one_token_more():
    check_limits(generation(1, prompt=[5] * LIMITS.max_input_len), LIMITS, vocab_size=100, pending=0)
    with pytest.raises(RequestError, match="^input_ids: prompt has 33 tokens"):
        check_limits(generation(1, prompt=[5] * (LIMITS.max_input_len + 1)), LIMITS, vocab_size=100, pending=0)


def test_preprocessing_accepts_the_largest_max_tokens_and_refuses_one_more(tiny_models):
    preprocessor = Preprocessor(str(tiny_models["sentencepiece"]), LIMITS)
    query = np.array([[b"Hello world"]], dtype=object)
    largest = LIMITS.max_output_len
    encoded = preprocessor.encode({"QUERY": query, "REQUEST_OUTPUT_LEN": np.array([[largest]], np.int32)},
                                  PREPROCESSING_TENSORS)
    assert encoded.max_tokens == [largest]
    with pytest.raises(RequestError, match=rf"^max_tokens: must be in \[1, {largest}\], got {largest + 1}"):
        preprocessor.encode({"QUERY": query, "REQUEST_OUTPUT_LEN": np.array([[largest + 1]], np.int32)},
                            PREPROCESSING_TENSORS)


def _request(value):
    return SimpleNamespace(inputs=lambda: [SimpleNamespace(name=lambda: "X", as_numpy=lambda: value)],
                           requested_output_names=lambda: [])


def test_one_bad_request_of_a_batch_gets_its_error_and_the_others_their_answers():
    def compute(inputs):
        if inputs["X"][0] < 0:
            raise RequestError("X", "must be >= 0")
        return {"Y": inputs["X"] * 2}

    responses = answer_each(PB_UTILS_STAND_IN, [_request(np.array([1])), _request(np.array([-1])),
                                                _request(np.array([3]))], compute)
    assert [response.error.code if response.error else None for response in responses] == [None, "INVALID_ARG", None]
    assert [dict(response.tensors)["Y"].tolist() for response in (responses[0], responses[2])] == [[2], [6]]
    assert responses[1].error.message == "X: must be >= 0"


def test_a_full_engine_queue_is_unavailable_at_the_model_and_503_at_the_gateway():
    with pytest.raises(QueueFullError) as full:
        check_limits(generation(8), LIMITS, vocab_size=100, pending=LIMITS.max_queue_size)
    assert to_triton_error(PB_UTILS_STAND_IN, full.value).code == "UNAVAILABLE"
    # Over a gRPC stream the gateway gets the model's message alone: it must still read it as the server's.
    answered = _triton_error(GenerationError(str(full.value)))
    assert answered.status == 503


def test_limits_must_leave_room_for_one_generated_token():
    assert EngineLimits(max_input_len=32, max_seq_len=33).max_output_len == 32
    with pytest.raises(ValueError, match="must exceed max_input_len"):
        EngineLimits(max_input_len=32, max_seq_len=32)


@pytest.mark.parametrize(("limits", "message"), [
    ({"max_input_len": 0, "max_seq_len": 8}, "must exceed max_input_len"),  # no prompt would fit
    ({"max_input_len": 8, "max_seq_len": 16, "max_queue_size": -1}, "^max_queue_size must be >= 0, got -1$")])
def test_engine_limits_refuse_a_prompt_of_no_token_and_a_negative_queue(limits, message):
    """A queue of -1 is no "unbounded" (that is 0): every request would find the queue full."""
    with pytest.raises(ValueError, match=message):
        EngineLimits(**limits)


@pytest.mark.parametrize("batch", [0, -1])
def test_engine_limits_refuse_a_batch_of_no_sequence(batch):
    from tritonforge.facts.limits import EngineLimits

    with pytest.raises(ValueError, match=f"^max_batch_size must be >= 1, got {batch}$"):
        EngineLimits(max_input_len=8, max_seq_len=16, max_batch_size=batch)


@pytest.mark.parametrize("token", [-1, 100])
def test_the_engine_refuses_a_prompt_id_outside_the_vocabulary_naming_input_ids(token):
    with pytest.raises(RequestError, match=r"^input_ids: token ids must be in \[0, 100\)$"):
        check_limits(generation(4, prompt=[1, token]), LIMITS, vocab_size=100, pending=0)

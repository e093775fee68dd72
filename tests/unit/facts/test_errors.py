"""The error kinds and their one table (tritonforge/facts/errors.py): each kind's code on every wire, and the
reading of a message that is all a gRPC stream's error carries: our own answers exactly, Triton's own checks
of a request by their wording, and anything else as the server's failure, never the client's."""

import pytest

from tritonforge.facts.errors import (
    ERROR_CODES,
    EngineCallError,
    EngineStreamError,
    ErrorKind,
    QueueFullError,
    RequestError,
    ResponseSendError,
    ServerStopping,
    UnsupportedError,
    answered_kind,
    grpc_status_kind,
)


@pytest.mark.parametrize("kind, triton, grpc, http, openai, exit_status", [
    (ErrorKind.CLIENT, "INVALID_ARG", "INVALID_ARGUMENT", 400, "invalid_request_error", 2),
    (ErrorKind.UNSUPPORTED, "UNSUPPORTED", "UNIMPLEMENTED", 501, "invalid_request_error", 2),
    (ErrorKind.UNAVAILABLE, "UNAVAILABLE", "UNAVAILABLE", 503, "server_error", 1),
    (ErrorKind.INTERNAL, "INTERNAL", "INTERNAL", 500, "server_error", 1)])
def test_each_kind_has_its_code_on_every_wire(kind, triton, grpc, http, openai, exit_status):
    codes = ERROR_CODES[kind]
    assert (codes.triton, codes.grpc, codes.http, codes.openai, codes.exit_status) == (
        triton, grpc, http, openai, exit_status)
    assert grpc_status_kind(grpc) is kind


def test_every_kind_is_in_the_table_and_a_grpc_status_outside_it_has_no_kind():
    assert set(ERROR_CODES) == set(ErrorKind)
    assert grpc_status_kind("CANCELLED") is None


@pytest.mark.parametrize("error, kind", [
    (RequestError("top_p", "must be in (0, 1], got 1.5"), ErrorKind.CLIENT),
    (UnsupportedError("beam_width", "beam search is not supported"), ErrorKind.UNSUPPORTED),
    (QueueFullError(8), ErrorKind.UNAVAILABLE),
    (ServerStopping(), ErrorKind.UNAVAILABLE),
    (EngineStreamError("the stream to the engine model 'tensorrt_llm' at localhost:8001 closed"),
     ErrorKind.UNAVAILABLE),
    (ResponseSendError(), ErrorKind.INTERNAL)])
def test_each_error_carries_its_kind(error, kind):
    assert error.kind is kind


@pytest.mark.parametrize("error", [RequestError("text_input[1]", "must not be empty"), QueueFullError(8),
                                   ServerStopping(), EngineStreamError("the stream to the engine closed"),
                                   ResponseSendError()], ids=lambda error: type(error).__name__)
def test_our_own_answer_reads_back_as_its_kind(error):
    """What a model answers over a gRPC stream is its message alone: the caller must read the same kind."""
    assert answered_kind(str(error)) is error.kind


def test_an_unsupported_answer_reads_as_the_clients_to_change():
    """Its message is "<field>: <reason>" like any bad request's: the caller reads the client's kind."""
    assert answered_kind(str(UnsupportedError("beam_width", "beam search is not supported"))) is ErrorKind.CLIENT


@pytest.mark.parametrize("message", [
    "max_tokens: must be in [1, 255], got 0",  # the BLS's own
    "in ensemble 'ensemble', temperature: must be >= 0, got -1.0",  # an ensemble step's, as Triton passes it on
    "in ensemble 'ensemble', text_input[1]: must not be empty",  # a row of a batch
    "input_ids: prompt has 300 tokens, more than max_input_len 64",  # the engine's, by its input's name
    "stop: needs the request id of the request to stop",
    "outputs: must include ['output_ids', 'sequence_length'], as the tensorrtllm backend requires",  # engine's
    # Triton's own checks of a request (as a 2.51 server answers them)
    "[request id: <id_unknown>] inference input 'max_tokens' data-type is 'FP32', but model 'ensemble' "
    "expects 'INT32'",
    "unexpected inference input 'no_such_input' for model 'tensorrt_llm_bls'",
    "[request id: <id_unknown>] unexpected shape for input 'text_input' for model 'ensemble'. Expected [-1,1], "
    "got [1,2].",
    "[request id: 7] inference request batch-size must be <= 64 for 'ensemble'",
    "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'tensorrt_llm'",
    "[request id: <id_unknown>] expected number of inputs between 2 and 60 but got 1 inputs for model "
    "'tensorrt_llm'"])
def test_a_bad_request_reads_as_the_clients(message):
    assert answered_kind(message) is ErrorKind.CLIENT


@pytest.mark.parametrize("message", [
    "unavailable: the engine queue is full (8 waiting)",
    "in ensemble 'ensemble', Exceeds maximum queue size",  # Triton's scheduler at the engine's max_queue_size
    "request: the engine queue is full (8 waiting)",  # the engine's answer before it said "unavailable: "
    "unavailable: the engine is shutting down",  # the C++ replay engine's
    "in ensemble 'ensemble', unavailable: the server is shutting down; the generation was stopped",
    "Server not ready: the server is stopping",
    "failed to connect to all addresses",
    "Request for unknown model: 'ensemble' has no available versions",  # Triton at a stop, its models unloaded
    "Socket closed"])  # gRPC's word for a connection lost mid-call
def test_a_server_that_cannot_serve_now_reads_as_unavailable(message):
    assert answered_kind(message) is ErrorKind.UNAVAILABLE


@pytest.mark.parametrize("message", [
    "internal error: KeyError",
    "Failed to process the request(s) for model instance 'tensorrt_llm_bls_0_0', message: Stub process "
    "'tensorrt_llm_bls_0_0' is not healthy.",
    "CUDA error: an illegal memory access was encountered",
    "Request for unknown model: 'no_such_model' is not found",
    "",
    # starts like a client error, but the word is no input of any model
    "note: the engine stopped",
    "RuntimeError: the engine is shutting down",
    "in ensemble 'ensemble', Assertion failed: beams (tensorrt_llm/runtime/decoder.cpp:12)",
    # an input's name, not at the start
    "the engine failed while reading top_p: it crashed",
    "internal error: top_p: unavailable"])  # our internal answer, whatever it names
def test_any_other_message_is_the_servers_failure(message):
    assert answered_kind(message) is ErrorKind.INTERNAL


def test_an_engine_answer_takes_the_kind_its_message_reads_as():
    assert EngineCallError("temperature: must be >= 0, got -1.0").kind is ErrorKind.CLIENT
    assert EngineCallError("Segmentation fault").kind is ErrorKind.INTERNAL

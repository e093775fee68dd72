"""The coalescer (the ensemble's engine step, a C++ backend calling the engine in-process) in a real tritonserver:
under a small budget of responses a second, a stream's waiting tokens arrive folded into fewer responses, the
first at once, with exactly the engine's tokens, log probabilities and lengths; a non-streamed answer and a
`stop` pass through; a client's cancel reaches the engine's slot; the ensemble's text is the engine's."""

import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.native import COALESCER as COALESCER_BACKEND
from tritonforge.clients.client import GenerateRequest, GrpcClient
from tritonforge.runtime.text.tokenization import load_tokenizer

from .conftest import lean_serving, running
from .test_cancellation import ANSWER_S, BATCH, HELD_S, STEP_MS, answer_within, open_long_engine_streams

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="needs a C++ compiler (g++) to build the coalescer")

# At 4 responses a second and one token every STEP_MS (50 ms), a pass of the sender comes every 250 ms while a
# stream sends a token every 50 ms: after its first token, about five tokens a response.
BUDGET = 4
TOKENS = 16
COALESCER = configs.COALESCER_MODEL


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    repository = build(BuildOptions(model=tiny_models["bpe"], engine="replay", replay_step_ms=STEP_MS,
                                    max_batch_size=BATCH, output=tmp_path_factory.mktemp("coalescer") / "repo",
                                    max_input_len=64, max_seq_len=1024,
                                    serving=lean_serving(coalescer_max_responses_per_second=BUDGET)),
                       progress=lambda _: None)
    with running(repository) as server:
        yield server, repository


def engine_inputs(repository, *, streaming: bool, tokens: int = TOKENS) -> dict[str, np.ndarray]:
    prompt_ids = load_tokenizer(repository / "preprocessing" / "tokenizer")("The engine").input_ids
    return {"input_ids": np.array([prompt_ids], dtype=np.int32),
            "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
            "request_output_len": np.array([[tokens]], dtype=np.int32), "streaming": np.array([[streaming]]),
            "return_log_probs": np.array([[True]])}


def responses_of(url: str, model: str, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Every response of one request on a gRPC stream, as its tensors (the empty final one left out)."""
    client = grpcclient.InferenceServerClient(url)
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "INT32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(name)
               for name in ("output_ids", "sequence_length", "output_log_probs", "cum_log_probs")]
    client.async_stream_infer(model, tensors, outputs=outputs, enable_empty_final_response=True)
    responses = []
    try:
        while True:
            result, error = arrived.get(timeout=ANSWER_S)
            assert error is None, error
            if result.as_numpy("output_ids") is not None:
                responses.append({name: result.as_numpy(name) for name in
                                  ("output_ids", "sequence_length", "output_log_probs", "cum_log_probs")})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_the_build_wires_the_ensemble_through_the_compiled_coalescer(served):
    _, repository = served
    assert (repository / COALESCER / "1" / COALESCER_BACKEND.library).is_file()
    ensemble = configs.parse_text((repository / "ensemble" / "config.pbtxt").read_text())
    assert ensemble.ensemble_scheduling.step[1].model_name == COALESCER


def test_a_stream_arrives_in_fewer_responses_the_first_at_once_with_exactly_the_engines_tokens(served):
    server, repository = served
    direct = responses_of(server.grpc_url, configs.ENGINE_MODEL, engine_inputs(repository, streaming=True))
    folded = responses_of(server.grpc_url, COALESCER, engine_inputs(repository, streaming=True))
    # Called directly, the engine sends each token as it comes, but one whose send waited goes out with the next
    # (runtime/sending.py): on a loaded machine two may share a response. All TOKENS come, in any case.
    assert sum(int(response["sequence_length"][0, 0]) for response in direct) == TOKENS
    assert folded[0]["output_ids"].shape == (1, 1, 1)  # the first token alone, not paced
    assert 2 <= len(folded) <= TOKENS // 2, [r["output_ids"].shape for r in folded]

    def joined(responses, name):
        return np.concatenate([r[name][0, 0] for r in responses]).tolist()

    assert joined(folded, "output_ids") == joined(direct, "output_ids")
    assert joined(folded, "output_log_probs") == pytest.approx(joined(direct, "output_log_probs"))
    for response in folded:  # each response's length is its own tokens'
        assert response["sequence_length"][0, 0] == response["output_ids"].shape[2]
        assert response["output_log_probs"].shape == response["output_ids"].shape
    assert folded[-1]["cum_log_probs"][0, 0] == pytest.approx(direct[-1]["cum_log_probs"][0, 0])


def test_a_non_streamed_request_is_answered_once_as_the_engine_answers_it(served):
    server, repository = served
    direct = responses_of(server.grpc_url, configs.ENGINE_MODEL, engine_inputs(repository, streaming=False))
    through = responses_of(server.grpc_url, COALESCER, engine_inputs(repository, streaming=False))
    assert len(through) == len(direct) == 1
    assert through[0]["output_ids"].tolist() == direct[0]["output_ids"].tolist()


def test_the_ensembles_streamed_text_is_its_non_streamed_answer(served):
    server, _ = served
    client = GrpcClient(server.grpc_url)
    try:
        whole = client.generate("The server", max_tokens=TOKENS)
        chunks = list(client.stream_bytes(GenerateRequest(text_input="The server", max_tokens=TOKENS)))
    finally:
        client.close()
    assert 2 <= len(chunks) < TOKENS
    assert b"".join(chunks).decode("utf-8", "replace").replace("\ufffd", "") == whole.replace("\ufffd", "")


def test_a_cancelled_stream_through_the_coalescer_frees_its_engine_slot(served):
    server, repository = served
    prompt_ids = load_tokenizer(repository / "preprocessing" / "tokenizer")("The engine").input_ids
    clients = open_long_engine_streams(server.grpc_url, prompt_ids, BATCH, model=COALESCER)
    assert answer_within(server.grpc_url, HELD_S) is None  # every slot is taken: a new request waits
    for client in clients:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert answer_within(server.grpc_url, ANSWER_S), "the cancelled generations kept their engine slots"

"""The C++ postprocessing (`--text-backend cpp`) in a real tritonserver against the Python model it replaces: for
the same prompts the ensemble answers the same bytes, response by response, streamed and not; token rows sent
to the model itself get the same OUTPUT, and a bad request the same error. One server at a time: the Python
model's answers are collected first, then the C++ server serves the tests."""

from __future__ import annotations

import queue
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.builder import native
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.clients.client import GenerateRequest, GrpcClient
from tritonforge.facts.contract import POST_OUTPUT, POST_SEQUENCE_LENGTH, POST_TOKENS_BATCH, POSTPROCESSING_MODEL
from tritonforge.runtime.text.detokenization import TABLE_FILE, TokenBytes
from tritonforge.serve.errors import ServerError
from tritonforge.serve.processes import all_stub_pids
from tritonforge.serve.server import only_models

from .conftest import DONE_S, MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving, running

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to build the C++ postprocessing")

PROMPTS = ["The server", "你好，世界", "café naïve", "🚀 launch"]
MAX_TOKENS = 24  # the tiny model's text is random tokens: split characters, byte pieces and specials show up
ROW_REQUESTS = 40  # token-row requests sent to the postprocessing model at once, so its batcher groups them


def _build(model_dir, output, text_backend: str):
    # response_lanes=0: the engine's thread sends each token as its own response. With sender threads, tokens
    # that wait for a send are merged into one response (runtime/sending.py), and so does the coalescer under load
    # (coalescer=False: the ensemble calls the engine directly), so chunk bounds would follow timing.
    return build(BuildOptions(model=model_dir, output=output, max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN,
                              max_batch_size=4, response_lanes=0, text_backend=text_backend,
                              serving=lean_serving(coalescer=False)),
                 progress=lambda _: None)


def _row_requests(table: TokenBytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """TOKENS_BATCH [B, beams, T] and SEQUENCE_LENGTH [B, beams]: any id (padding and specials too), several
    rows and beams, lengths past T and below 0."""
    rng = random.Random(11)
    size = len(table)
    requests = []
    for _ in range(ROW_REQUESTS):
        rows, beams, width = rng.randint(1, 3), rng.randint(1, 2), rng.randint(0, 10)
        tokens = np.array([rng.randrange(-1, size + 1) for _ in range(rows * beams * width)], dtype=np.int32)
        lengths = np.array([rng.randint(-1, width + 1) for _ in range(rows * beams)], dtype=np.int32)
        requests.append((tokens.reshape(rows, beams, width), lengths.reshape(rows, beams)))
    return requests


def _infer_inputs(tokens: np.ndarray, lengths: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in ((POST_TOKENS_BATCH, tokens), (POST_SEQUENCE_LENGTH, lengths)):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def postprocessing_answers(url: str, requests) -> list:
    """Every request sent at once to the postprocessing model: each one's OUTPUT, or its error (status, text)."""
    client = grpcclient.InferenceServerClient(url)
    answered: queue.Queue = queue.Queue()
    try:
        for index, (tokens, lengths) in enumerate(requests):
            client.async_infer(POSTPROCESSING_MODEL, _infer_inputs(tokens, lengths),
                               callback=lambda result, error, index=index: answered.put((index, result, error)))
        answers = [None] * len(requests)
        for _ in requests:
            index, result, error = answered.get(timeout=DONE_S)
            answers[index] = (error.status(), error.message()) if error is not None else \
                result.as_numpy(POST_OUTPUT).tolist()
        return answers
    finally:
        client.close()


def answers(server, table: TokenBytes) -> dict:
    """What a server answers: the ensemble's responses, one bytes string each, streamed and not, with and
    without the prompt; the postprocessing model's answers to token rows and to bad requests."""
    client = GrpcClient(server.grpc_url)
    out = {}
    try:
        for prompt in PROMPTS:
            request = GenerateRequest(text_input=prompt, max_tokens=MAX_TOKENS)
            out[prompt, "streamed"] = list(client.stream_bytes(request))
            out[prompt, "whole"] = list(client.stream_bytes(request, stream=False))
            echoed = GenerateRequest(text_input=prompt, max_tokens=MAX_TOKENS,
                                     parameters={"exclude_input_in_output": False})
            out[prompt, "echoed"] = list(client.stream_bytes(echoed, stream=False))
    finally:
        client.close()
    out["rows"] = postprocessing_answers(server.grpc_url, _row_requests(table))
    bad = [(np.zeros((1, 1, 3), np.int32), np.ones((1, 2), np.int32)),  # two lengths for one beam
           (np.array([[[table.bos_token_id or 0, 5]]], np.int32), np.array([[2]], np.int32))]  # then a good one
    out["bad"] = postprocessing_answers(server.grpc_url, bad)
    return out


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def served(request, tiny_models, tmp_path_factory):
    """(the C++ server, its repository, what it answered, what the Python postprocessing's server answered, why
    the C++ model would not load from each BROKEN repository)."""
    root = tmp_path_factory.mktemp(f"text-backend-{request.param}")
    model = tiny_models[request.param]
    python_repository = _build(model, root / "python", "python")
    table = TokenBytes.saved(tokenizer_dir(python_repository))
    with running(python_repository) as server:
        expected = answers(server, table)
        expected["post_stub_maps"] = [Path(f"/proc/{pid}/maps").read_text()
                                      for pid, name in all_stub_pids(server.pid).items() if name == "postprocessing"]
    repository = _build(model, root / "cpp", "cpp")
    refused = load_errors(repository)
    with running(repository) as server:
        yield server, repository, answers(server, table), expected, refused


def _without_table(repository: Path) -> Callable[[], None]:
    table = tokenizer_dir(repository) / TABLE_FILE
    aside = table.with_name(f"{table.name}.aside")
    table.rename(aside)
    return lambda: aside.rename(table)


def _with_config(change: Callable[[mc.ModelConfig], None]) -> Callable[[Path], Callable[[], None]]:
    def apply(repository: Path) -> Callable[[], None]:
        path = repository / POSTPROCESSING_MODEL / "config.pbtxt"
        original = path.read_text()
        config = text_format.Parse(original, mc.ModelConfig())
        change(config)
        path.write_text(text_format.MessageToString(config))
        return lambda: path.write_text(original)
    return apply


# What each broken repository must fail to load with: the change, then what the error names.
BROKEN = {
    "no byte table": (_without_table, "tritonforge_token_bytes.json: cannot be read"),
    "no tokenizer_dir": (_with_config(lambda config: config.parameters.pop("tokenizer_dir")),
                         "config parameter 'tokenizer_dir' is required"),
    "decoupled": (_with_config(lambda config: setattr(config.model_transaction_policy, "decoupled", True)),
                  "must not be decoupled"),
}


def load_errors(repository: Path) -> dict[str, str]:
    """Why the C++ postprocessing, started alone, does not load from each BROKEN variant of the repository."""
    errors = {}
    for name, (breaks, _) in BROKEN.items():
        restore = breaks(repository)
        try:
            with running(repository, extra_args=only_models(POSTPROCESSING_MODEL)):
                errors[name] = "it loaded"
        except ServerError as error:
            errors[name] = str(error)
        finally:
            restore()
    return errors


def test_the_build_compiles_the_cpp_postprocessing_into_its_model_instead_of_a_python_model(served):
    _, repository, _, _, _ = served
    version = repository / POSTPROCESSING_MODEL / "1"
    assert (version / native.POSTPROCESSING.library).is_file() and not (version / "model.py").exists()
    config = (repository / POSTPROCESSING_MODEL / "config.pbtxt").read_text()
    assert f'backend: "{native.POSTPROCESSING.name}"' in config and "tokenizer_dir" in config


def test_the_python_postprocessing_reads_the_saved_table_and_loads_no_tokenizer_library(served):
    """The Python twin starts from the byte table the build saved: its stubs map no tokenizers library."""
    _, _, _, expected, _ = served
    assert expected["post_stub_maps"], "no postprocessing stub found under the Python server"
    assert not [maps for maps in expected["post_stub_maps"] if "tokenizers" in maps]


@pytest.mark.parametrize("mode", ["streamed", "whole", "echoed"])
def test_the_ensemble_answers_the_python_postprocessings_bytes_response_by_response(served, mode):
    _, _, cpp, expected, _ = served
    for prompt in PROMPTS:
        assert cpp[prompt, mode] == expected[prompt, mode], prompt
    if mode == "streamed":  # the streams did carry characters split across responses, the hard case
        assert any("\ufffd".encode() in chunk for prompt in PROMPTS for chunk in cpp[prompt, mode])


def test_token_rows_batched_together_get_the_python_models_output_each(served):
    _, _, cpp, expected, _ = served
    assert all(isinstance(answer, list) for answer in expected["rows"])
    assert cpp["rows"] == expected["rows"]


def test_a_bad_request_gets_the_python_models_invalid_arg_and_the_next_one_its_text(served):
    _, _, cpp, expected, _ = served
    assert cpp["bad"] == expected["bad"]
    status, message = cpp["bad"][0]
    assert status == "StatusCode.INVALID_ARGUMENT" and "SEQUENCE_LENGTH: has 2 beams, TOKENS_BATCH has 1" in message
    assert isinstance(cpp["bad"][1], list)


@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_repository_fails_the_models_load_saying_what_to_fix(served, broken):
    _, repository, _, _, refused = served
    assert BROKEN[broken][1] in refused[broken]
    if broken == "no byte table":
        assert f"{tokenizer_dir(repository).resolve() / TABLE_FILE}:" in refused[broken]
        assert "tritonforge build" in refused[broken]

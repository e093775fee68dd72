"""The C++ BLS (`--text-backend cpp`, runtime/bls/native/bls_backend.cc) in a real tritonserver against the Python BLS
it replaces: for the same prompts both answer the same text, streamed and not, with and without the prompt, with
stop phrases that straddle responses, in batched requests and with a stream interval; a bad request gets the same
error from both. One server at a time: the Python BLS's answers are collected first, then the C++ server serves the
tests. A C++ BLS on the replay engine (a fixed step, so that a generation outlasts every bound here) shows that a
client's cancel reaches the engine, that a full BLS answers UNAVAILABLE, and that unloading it ends its open
streams."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.builder import native
from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GrpcClient
from tritonforge.facts.contract import BLS_MODEL, FINAL_RESPONSE_PARAMETER, TEXT_OUTPUT
from tritonforge.facts.errors import ErrorKind, answered_kind
from tritonforge.serve.errors import ServerError
from tritonforge.serve.server import only_models

from .conftest import DONE_S, MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving, running

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to build the C++ BLS")

PROMPTS = ["The server reads a request", "你好，世界。", "café naïve 🚀", "Привет, мир!"]
MAX_TOKENS = 24  # the tiny model's text is random tokens: split characters, byte pieces and specials show up
INTERVAL = 4  # the stream interval asked for
# The answers each BLS gives (`answers`), by name, and the requests behind them.
ERRORS = {  # request inputs past the first ones → the error both BLS answer, naming the field
    "engine refuses": {"temperature": np.array([[-1.0]], np.float32)},
    "preprocessing refuses": {"max_tokens": np.array([[0]], np.int32)},
    "bad messages": {"text_input": None, "messages": np.array([[b'[{"role": 1}]']], dtype=object)},
    "no prompt": {"text_input": None},
    "stop word not UTF-8": {"stop_words": np.array([[b"\xff"]], dtype=object)},
    "stream interval 0": {"stream_interval": np.array([[0]], np.int32)},
}

# The replay server's: its engine's step, a generation that outlasts every bound, the slots it holds.
STEP_MS = 50
LONG_GENERATION = 900  # 45 s at one token every 50 ms
SLOTS = 2  # the engine's batch, and the BLS's max_concurrency
ANSWER_S = 15  # far below LONG_GENERATION × STEP_MS
HELD_S = 1  # with every engine slot held, a new request gets no answer this long
ADMIN_KEY = "native-bls-tests"  # unlocks Triton's model-repository API (unload, load)


def _build(model_dir, output, text_backend: str):
    # response_lanes=0: the engine's thread sends each token as its own response, the hardest case for the text.
    return build(BuildOptions(model=model_dir, output=output, max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN,
                              max_batch_size=4, response_lanes=0, text_backend=text_backend, serving=lean_serving()),
                 progress=lambda _: None)


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    dtype = {np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64",
             np.object_: "BYTES"}[array.dtype.type]
    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def call(url: str, inputs: dict[str, np.ndarray | None], timeout_s: float = DONE_S) -> list:
    """One request to the BLS on a gRPC stream; every response until the final one: its outputs (a dict), or its
    error's message (an error inside a stream carries no status: clients read its kind from the message, as
    `answered_kind` does). A final flag that carries nothing is left out."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(BLS_MODEL, [_tensor(name, array) for name, array in inputs.items()
                                              if array is not None], enable_empty_final_response=True)
        out = []
        while True:
            result, error = responses.get(timeout=timeout_s)
            if error is not None:
                out.append(error.message())
                return out
            outputs = {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}
            if outputs:
                out.append(outputs)
            if result.get_response().parameters[FINAL_RESPONSE_PARAMETER].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def request(prompt: str, *, stream: bool, **inputs) -> dict[str, np.ndarray | None]:
    return {"text_input": np.array([[prompt.encode()]], dtype=object),
            "max_tokens": np.array([[MAX_TOKENS]], np.int32), "stream": np.array([[stream]]), **inputs}


def text_of(responses: list) -> str:
    return b"".join(response[TEXT_OUTPUT][0] for response in responses if isinstance(response, dict)).decode()


def chunks_of(responses: list) -> list[bytes]:
    return [response[TEXT_OUTPUT][0] for response in responses if isinstance(response, dict)]


def straddling_phrase(whole: str) -> tuple[str, int]:
    """Three characters from the middle of the answer, where they first occur: with tokens of one to a few
    characters, the phrase spans a token boundary, so it arrives in pieces."""
    for start in range(4, len(whole) - 4):
        phrase = whole[start:start + 3]
        if phrase.strip() and whole.find(phrase) == start:
            return phrase, start
    raise AssertionError(f"no phrase to stop at in {whole!r}")


def answers(url: str, phrases: dict[str, str] | None = None) -> dict:
    """What a BLS answers: whole, streamed, echoed, with stop phrases (those in `phrases`, else chosen from its own
    whole answers), with the stream interval, batched, and its errors."""
    out: dict = {}
    for prompt in PROMPTS:
        out[prompt, "whole"] = call(url, request(prompt, stream=False, return_log_probs=np.array([[True]]),
                                                 return_num_output_tokens=np.array([[True]])))
        out[prompt, "streamed"] = call(url, request(prompt, stream=True))
        out[prompt, "echoed"] = call(url, request(prompt, stream=False, exclude_input_in_output=np.array([[False]])))
        out[prompt, "interval"] = call(url, request(prompt, stream=True,
                                                    stream_interval=np.array([[INTERVAL]], np.int32),
                                                    return_num_output_tokens=np.array([[True]])))
        whole = text_of(out[prompt, "whole"])
        phrase = (phrases or {}).get(prompt) or straddling_phrase(whole)[0]
        out[prompt, "phrase"] = phrase
        stop_words = np.array([[b"", phrase.encode(), "never\u2603".encode()]], dtype=object)
        out[prompt, "stopped streamed"] = call(url, request(prompt, stream=True, stop_words=stop_words))
        out[prompt, "stopped whole"] = call(url, request(prompt, stream=False, stop_words=stop_words))
        held = np.array([[(whole[-1] + "\x01never").encode()]], dtype=object)  # starts at the very end
        out[prompt, "held back"] = call(url, request(prompt, stream=True, stop_words=held))
    out["batched"] = call(url, {
        "text_input": np.array([[PROMPTS[0].encode()], [PROMPTS[1].encode()]], dtype=object),
        "max_tokens": np.array([[4], [MAX_TOKENS]], np.int32), "stream": np.array([[True], [True]]),
        "return_num_output_tokens": np.array([[True], [True]])})
    for name, change in ERRORS.items():
        out[name] = call(url, {**request(PROMPTS[0], stream=True), **change})
    out["after the errors"] = call(url, request(PROMPTS[0], stream=False))
    return out


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def served(request, tiny_models, tmp_path_factory):
    """(the C++ server's answers, the Python server's, the C++ repository, the Python one)."""
    root = tmp_path_factory.mktemp(f"native-bls-{request.param}")
    model = tiny_models[request.param]
    python_repository = _build(model, root / "python", "python")
    with running(python_repository) as server:
        expected = answers(server.grpc_url)
    repository = _build(model, root / "cpp", "cpp")
    with running(repository) as server:
        phrases = {prompt: expected[prompt, "phrase"] for prompt in PROMPTS}
        yield answers(server.grpc_url, phrases), expected, repository, python_repository


def test_the_build_compiles_the_cpp_bls_with_the_python_bls_config_but_its_backend(served):
    _, _, repository, python_repository = served
    version = repository / BLS_MODEL / "1"
    assert (version / native.BLS.library).is_file() and not (version / "model.py").exists()
    config = (repository / BLS_MODEL / "config.pbtxt").read_text()
    python_config = (python_repository / BLS_MODEL / "config.pbtxt").read_text()
    assert f'backend: "{native.BLS.name}"' in config
    assert config.replace(f'backend: "{native.BLS.name}"', 'backend: "python"') == python_config


@pytest.mark.parametrize("mode", ["whole", "echoed", "stopped whole"])
def test_a_whole_answer_is_the_python_bls_answer_with_its_log_probs_and_token_count(served, mode):
    cpp, expected, _, _ = served
    for prompt in PROMPTS:
        got, want = cpp[prompt, mode], expected[prompt, mode]
        assert len(got) == len(want) == 1, prompt
        assert set(got[0]) == set(want[0]), prompt
        for name in want[0]:
            np.testing.assert_array_equal(got[0][name], want[0][name], err_msg=f"{prompt}: {name}")
    if mode == "echoed":
        assert all(text_of(cpp[prompt, mode]).startswith(prompt) for prompt in PROMPTS)


@pytest.mark.parametrize("mode", ["streamed", "stopped streamed", "held back", "interval"])
def test_a_stream_is_the_python_bls_text_in_chunks_of_whole_characters(served, mode):
    cpp, expected, _, _ = served
    for prompt in PROMPTS:
        assert text_of(cpp[prompt, mode]) == text_of(expected[prompt, mode]), prompt
        for chunk in chunks_of(cpp[prompt, mode]):
            chunk.decode("utf-8")  # strict: never half a character
    # The streams did carry characters whose bytes span responses, the hard case.
    assert any("\ufffd" in text_of(cpp[prompt, "whole"]) for prompt in PROMPTS)


def test_a_stop_phrase_straddling_responses_cuts_the_text_before_it(served):
    cpp, expected, _, _ = served
    for prompt in PROMPTS:
        whole, phrase = text_of(expected[prompt, "whole"]), expected[prompt, "phrase"]
        before = whole[:whole.index(phrase)]
        assert text_of(cpp[prompt, "stopped streamed"]) == text_of(cpp[prompt, "stopped whole"]) == before, prompt
        assert text_of(cpp[prompt, "held back"]) == whole, prompt  # held while it could start the phrase


def test_a_stream_interval_sends_the_first_response_then_that_many_engine_responses_a_chunk(served):
    cpp, _, _, _ = served
    for prompt in PROMPTS:
        tokens = [int(response["num_output_tokens"].item()) for response in cpp[prompt, "interval"]]
        assert sum(tokens) == MAX_TOKENS, prompt
        # One token a response here; a response may wait for the token that completes a character, and the last
        # one takes what is left.
        assert all(count >= INTERVAL for count in tokens[1:-1]), (prompt, tokens)
        assert len(tokens) <= 2 + (MAX_TOKENS - 1) // INTERVAL, (prompt, tokens)
    streamed = [len(chunks_of(cpp[prompt, "streamed"])) for prompt in PROMPTS]
    assert max(streamed) > 2 + (MAX_TOKENS - 1) // INTERVAL  # without it, more and smaller chunks


def test_a_batched_request_answers_each_row_as_the_python_bls(served):
    cpp, expected, _, _ = served

    def by_row(responses):
        rows: dict[int, list] = {}
        for response in responses:
            rows.setdefault(int(response["batch_index"].item()), []).append(response)
        return {row: (text_of(items), sum(int(item["num_output_tokens"].item()) for item in items))
                for row, items in rows.items()}

    assert by_row(cpp["batched"]) == by_row(expected["batched"])
    assert sorted(by_row(cpp["batched"])) == [0, 1] and by_row(cpp["batched"])[0][1] == 4


@pytest.mark.parametrize("name", ERRORS)
def test_a_bad_request_gets_the_python_bls_error_and_the_next_one_its_answer(served, name):
    cpp, expected, _, _ = served
    assert cpp[name] == expected[name]
    (message,) = cpp[name]
    field = "messages" if name == "bad messages" else next(iter(ERRORS[name]))
    assert message.startswith(f"{field}: ") and answered_kind(message) is ErrorKind.CLIENT
    assert text_of(cpp["after the errors"]) == text_of(expected["after the errors"]) != ""


# --- the C++ BLS on the replay engine: cancel, limits, unload -----------------------------------------------------

@pytest.fixture(scope="module")
def replay(tiny_models, tmp_path_factory):
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("native-bls-replay") / "r",
                                    engine="replay", replay_step_ms=STEP_MS, max_batch_size=SLOTS,
                                    max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN, text_backend="cpp",
                                    serving=lean_serving(bls_max_concurrency=SLOTS)), progress=lambda _: None)
    with running(repository, restricted_api_key=ADMIN_KEY,
                 extra_args=["--model-control-mode=explicit", "--load-model=*"]) as server:
        yield server


def answer_within(url: str, seconds: float) -> str | None:
    """The ensemble's answer to a short request, None when none came within `seconds` (the engine is full)."""
    result = {}

    def ask():
        client = GrpcClient(url)
        try:
            result["text"] = client.generate("Hello", max_tokens=4)
        finally:
            client.close()

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(seconds)
    return result.get("text")


class LongStream:
    """A long BLS stream, past its first chunk; `close` cancels it as a client that goes away does."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        # A stream an earlier test cancelled leaves the BLS when the cancel reaches it, after the client's
        # stop_stream returns: until then this one is refused for max_concurrency and is asked for again.
        deadline = time.monotonic() + ANSWER_S
        while True:
            self.client.async_stream_infer(BLS_MODEL, [
                _tensor("text_input", np.array([[b"The server"]], dtype=object)),
                _tensor("max_tokens", np.array([[LONG_GENERATION]], np.int32)),
                _tensor("stream", np.array([[True]]))])
            result, error = self.responses.get(timeout=ANSWER_S)
            if error is None or "max_concurrency" not in error.message() or time.monotonic() > deadline:
                break
        assert error is None, error.message()
        assert result.as_numpy(TEXT_OUTPUT) is not None

    def error(self, timeout_s: float):
        """The error that ends the stream, skipping the chunks before it."""
        deadline = time.monotonic() + timeout_s
        while True:
            result, error = self.responses.get(timeout=max(deadline - time.monotonic(), 0.01))
            if error is not None:
                return error

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def test_a_client_that_cancels_its_bls_stream_frees_the_engine_slot_and_a_full_bls_answers_unavailable(replay):
    streams = [LongStream(replay.grpc_url) for _ in range(SLOTS)]
    try:
        assert answer_within(replay.grpc_url, HELD_S) is None  # every engine slot is taken
        refused = call(replay.grpc_url, request("Hello", stream=True), timeout_s=ANSWER_S)
        (message,) = refused  # at once: the BLS runs its max_concurrency requests
        assert answered_kind(message) is ErrorKind.UNAVAILABLE and "max_concurrency" in message
    finally:
        for stream in streams:
            stream.close()  # no stop from the client: the BLS must pass the cancel on
    assert answer_within(replay.grpc_url, ANSWER_S), "the cancelled BLS streams kept their engine slots"
    assert text_of(call(replay.grpc_url, request("Hello", stream=True))) != ""  # the BLS has room again


def test_a_stop_phrase_ends_the_engine_request_and_frees_its_slot(replay):
    """Once a stop phrase matches, the BLS cancels the engine's request: else the answer waits for the whole long
    generation, and the slot stays taken."""
    bls = GrpcClient(replay.grpc_url, BLS_MODEL)
    opening = bls.generate("The server", max_tokens=8)
    phrase = opening.split()[1]  # a word the generation reaches within its first tokens
    holder = LongStream(replay.grpc_url)  # the other slot stays taken
    try:
        started = time.monotonic()
        text = bls.generate("The server", max_tokens=LONG_GENERATION, stop_words=[phrase])
        assert time.monotonic() - started < ANSWER_S, "the answer waited for the engine to run to max_tokens"
        assert phrase not in text and opening.startswith(text)
        assert answer_within(replay.grpc_url, ANSWER_S), "the stopped generation kept its engine slot"
    finally:
        holder.close()
        bls.close()


def test_unloading_the_bls_ends_its_open_streams_unavailable_and_frees_their_engine_slots(replay):
    client = grpcclient.InferenceServerClient(replay.grpc_url)
    headers = {"triton-grpc-protocol-admin-key": ADMIN_KEY}
    streams = [LongStream(replay.grpc_url) for _ in range(SLOTS)]
    try:
        unloading = threading.Thread(target=client.unload_model, args=(BLS_MODEL,), kwargs={"headers": headers},
                                     daemon=True)
        unloading.start()
        for stream in streams:
            message = stream.error(ANSWER_S).message()
            assert answered_kind(message) is ErrorKind.UNAVAILABLE and "shutting down" in message
        unloading.join(ANSWER_S)
        deadline = time.monotonic() + ANSWER_S
        while client.is_model_ready(BLS_MODEL) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not client.is_model_ready(BLS_MODEL)
        assert answer_within(replay.grpc_url, ANSWER_S), "the BLS's engine requests outlived its unload"
    finally:
        for stream in streams:
            stream.close()
        client.load_model(BLS_MODEL, headers=headers)  # as it was, for the tests after this one
        client.close()


# --- a broken repository -------------------------------------------------------------------------------------------

def _with_parameter(repository: Path, key: str, value: str | None) -> str:
    path = repository / BLS_MODEL / "config.pbtxt"
    original = path.read_text()
    config = text_format.Parse(original, mc.ModelConfig())
    if value is None:
        config.parameters.pop(key)
    else:
        config.parameters[key].string_value = value
    path.write_text(text_format.MessageToString(config))
    return original


@pytest.mark.parametrize(("key", "value", "said"), [
    ("tokenizer_dir", None, "config parameter 'tokenizer_dir' is required by BlsParameters"),
    ("tokenizer_dir", "nowhere", "tritonforge_token_bytes.json: cannot be read"),
    ("max_concurrency", "0", "config parameter 'max_concurrency' must be >= 1, got 0"),
    ("max_concurrency", "many", "config parameter 'max_concurrency' must be int, got 'many'"),
    ("max_seq_len", None, "config parameter 'max_seq_len' is required by BlsParameters"),
])
def test_a_broken_bls_config_fails_the_load_saying_what_to_fix(replay, key, value, said):
    repository = replay.repository
    path = repository / BLS_MODEL / "config.pbtxt"
    original = _with_parameter(repository, key, value)
    try:
        with pytest.raises(ServerError, match=said.replace("(", r"\(").replace(")", r"\)")), \
                running(repository, extra_args=only_models(BLS_MODEL)):
            pass
    finally:
        path.write_text(original)


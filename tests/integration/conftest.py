"""Real tritonservers on repositories built from tiny models, shared across modules where tests only send them
requests; a failing test's report carries the logs of the servers up at the time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import AsyncGrpcClient
from tritonforge.facts.contract import BATCH_INDEX, TEXT_OUTPUT
from tritonforge.serve.server import TritonServer

MAX_INPUT_LEN = 64
MAX_SEQ_LEN = 1024
ENGINE_BATCH = 4


def lean_serving(**serving) -> configs.ServingConfig:
    """One instance of each Python model unless a test asks for more: each tokenizer stub takes about a CPU
    second to start, and the suite starts servers some forty times. (The session's `tiny_servers` keep the
    defaults, more postprocessing instances included.)"""
    return configs.ServingConfig(**{"preprocessing_instances": 1, "postprocessing_instances": 1, **serving})


# Servers started by these tests: a failing test's report shows their logs (pytest_runtest_makereport).
LIVE_SERVERS: list[TritonServer] = []


def serve_tiny(model_dir, repo_dir, *, max_input_len: int = MAX_INPUT_LEN, max_seq_len: int = MAX_SEQ_LEN,
               **serving) -> TritonServer:
    """A server on a tiny model's repository; end it with `kill()` (see `running`)."""
    build(BuildOptions(model=model_dir, output=repo_dir, max_input_len=max_input_len, max_seq_len=max_seq_len,
                       max_batch_size=ENGINE_BATCH, serving=configs.ServingConfig(**serving)))
    server = TritonServer(repo_dir).start()
    LIVE_SERVERS.append(server)
    return server


@contextlib.contextmanager
def running(repository, **options):
    """A started server, killed at the end. Tests end their servers at once (SIGKILL, which also removes the
    stubs' leftovers) instead of waiting seconds for every stub to finalize; test_faults tests the graceful
    shutdown."""
    server = TritonServer(repository, **options).start()
    LIVE_SERVERS.append(server)
    try:
        yield server
    finally:
        server.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach to a failing test's report, where pytest prints them, the logs of the servers still up and of those
    that exited while the tests still used them (a crash, a kill from outside: the exit status says which)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for server in LIVE_SERVERS:
            if server.is_running():
                report.sections.append((f"tritonserver log ({server.grpc_url})", server.failure_summary(60)))
            elif server.pid is not None and server.log_path is not None:  # not stopped by a test: its log is kept
                report.sections.append((f"tritonserver log ({server.grpc_url}, exited with status "
                                        f"{server._process.returncode})", server.failure_summary(60)))


@pytest.fixture(scope="session")
def tiny_servers(tiny_models, tmp_path_factory):
    """`tiny_servers(family)`: one server per tokenizer family for the whole session, started on first use and
    shared by the modules that only send it requests (ensemble, BLS, gateway). Several postprocessing
    instances, so that the ordering of streamed chunks is exercised; one BLS instance, so that its concurrency is."""
    servers: dict[str, TritonServer] = {}

    def server_of(family: str) -> TritonServer:
        if family not in servers:
            servers[family] = serve_tiny(tiny_models[family], tmp_path_factory.mktemp(f"repo-{family}") / "repo",
                                         postprocessing_instances=3, bls_instances=1)
        return servers[family]

    yield server_of
    for server in servers.values():
        work_dir, group = server._work_dir, server.pid
        server.kill()
        assert work_dir is not None and not work_dir.exists(), "the server's work folder outlived it"
        with pytest.raises(ProcessLookupError):  # no stub of it outlives the server
            os.killpg(group, 0)


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def served(request, tiny_models, tiny_servers):
    """(server, model_dir) for each tokenizer family."""
    return tiny_servers(request.param), tiny_models[request.param]


def engine_stream(url: str, inputs: dict[str, np.ndarray], request_id: str = "", timeout_s: float = 120):
    """Send one request straight to the engine model on a gRPC stream; return its responses' token ids."""
    import queue

    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    tensors = []
    for name, array in inputs.items():
        dtype = {np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64"}[array.dtype.type]
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.async_stream_infer("tensorrt_llm", tensors, request_id=request_id, enable_empty_final_response=True)
    tokens, errors = [], []
    try:
        while True:
            result, error = responses.get(timeout=timeout_s)
            if error is not None:
                errors.append(str(error))
                break
            ids = result.as_numpy("output_ids")
            if ids is not None:
                tokens.append(ids[0, 0, : result.as_numpy("sequence_length")[0, 0]].tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return tokens, errors


DONE_S = 120  # generous upper bound for a short request on a shared CPU machine


def batch_column(name: str, values: list, dtype, triton_dtype: str) -> grpcclient.InferInput:
    """One input of a batched request: a [rows, 1] column."""
    tensor = grpcclient.InferInput(name, [len(values), 1], triton_dtype)
    tensor.set_data_from_numpy(np.array([[value] for value in values], dtype=dtype))
    return tensor


def batched_texts(url: str, model: str, inputs: list[grpcclient.InferInput]) -> dict[int, str]:
    """Send one batched request on a gRPC stream; each row's `text_output` (flat, as NVIDIA's clients read
    it), by the `batch_index` its responses carry."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        texts = {}
        while True:
            result, error = responses.get(timeout=DONE_S)
            assert error is None
            if result.as_numpy(TEXT_OUTPUT) is not None:
                texts[int(result.as_numpy(BATCH_INDEX)[0, 0])] = result.as_numpy(TEXT_OUTPUT)[0].decode("utf-8")
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts
    finally:
        client.stop_stream()
        client.close()


def stream_concurrently(url: str, model: str, prompts: list[str], max_tokens: int, **parameters) -> list[str]:
    """Stream every prompt at once over one asyncio gRPC connection; return each stream's whole text."""
    async def run():
        client = AsyncGrpcClient(url, model)
        try:
            async def one(prompt):
                pieces = client.stream(prompt, max_tokens=max_tokens, **parameters)
                return "".join([piece async for piece in pieces])
            return await asyncio.gather(*(one(prompt) for prompt in prompts))
        finally:
            await client.close()

    return asyncio.run(run())


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (whichever of its threads started them)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def ascii_only(text: str) -> str:
    """The single-byte characters of a text: an ensemble stream keeps every one of them in place, since only
    a character whose bytes straddle two chunks (never an ASCII one) turns into U+FFFD there."""
    return "".join(c for c in text if c.isascii())

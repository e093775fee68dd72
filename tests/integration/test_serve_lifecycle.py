"""`tritonforge serve` as a user runs it (a subprocess, a real tritonserver): what it says, what it refuses while
it serves (a second serve on its ports, `tune` of its repository), how it stops (SIGTERM or Ctrl-C under open
ensemble, BLS and OpenAI streams: one line, within the exit timeout it announces, the server exiting by itself,
clients told the server stopped, nothing left), and what a run killed with SIGKILL leaves (nothing, once its
reaper has cleaned up; with the reaper killed too, what the next start removes, saying so in one line). Models
around an engine that reads no stop end its streams at the deadline. The supervisor gives up on a server that
cannot come back."""

from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GrpcClient
from tritonforge.facts.contract import ENGINE_MODEL
from tritonforge.serve.leftovers import OWNER_RECORD, SHARED_MEMORY_DIR
from tritonforge.serve.ports import free_port
from tritonforge.serve.processes import all_stub_pids
from tritonforge.serve.server import DEFAULT_EXIT_TIMEOUT_S, DRAIN_END_S, TritonServer, only_models
from tritonforge.serve.supervisor import Supervisor

from .conftest import child_pids, lean_serving
from .test_user_mistakes import assert_one_line, tritonforge

READY_WITHIN_S = 300  # a server start on the loaded 2-core CI machine takes 10-60 s
# serve's: a stop ends within it (open streams get all of it but its last 10 s), or the server is killed
EXIT_TIMEOUT_S = DEFAULT_EXIT_TIMEOUT_S
STOPPING = re.compile(r"^stopping tritonserver: .* exits within (\d+(?:\.\d+)?) s")
# Once serve has exited: how long its clients may take to see their streams end (a gateway's last events)
CLIENTS_END_S = 10
STREAMS = 2  # per model, ensemble and BLS
STEP_MS = 20  # the replay engine's step
# Streams that finish well within the time a stop gives them (0.8 s at STEP_MS), and streams that outlive any
# stop's deadline (18 s; 180 s at LAG_STEP_MS).
SHORT_STREAM_TOKENS = 40
LONG_STREAM_TOKENS = 900
# The one warning a sound start may log: Triton 2.51 wedged or crashed while loading (a starved CPU is enough),
# and the start made once more (test_server_start.py). Its message spans lines, up to this one.
START_RETRIED = re.compile(r"^WARNING tritonforge\.serve\.server: .*?^starting the server once more$\n?", re.M | re.S)
# And the line of a start that removed what killed runs left (other test runs on the machine: their regions).
SWEPT = re.compile(r"^WARNING tritonforge\.serve\.server: removed what killed tritonforge servers .*$\n?", re.M)


class Serve:
    """A `tritonforge serve` subprocess; its stderr lines as they come."""

    def __init__(self, repository: Path, *, openai: bool = False, flags: tuple[str, ...] = ()):
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.openai_port = free_port() if openai else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.cli", "serve", str(repository), "--http-port", str(self.http_port),
             "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
             *(["--openai-port", str(self.openai_port)] if openai else []), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self.stderr_lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        line = self.process.stdout.readline()  # "serving ..." once ready (or EOF if it failed)
        if openai and line.startswith("OpenAI API:"):  # said first, once the gateway listens
            line = self.process.stdout.readline()
        if not line.startswith("serving"):
            self.stop()
            pytest.fail(f"serve did not start: {line!r}, {self.stderr}")
        self.url = f"127.0.0.1:{self.grpc_port}"

    def wait_for_stderr(self, text: str, within_s: float = 30) -> bool:
        """Whether a stderr line holding `text` arrives within `within_s` (lines are read by another thread, so
        one printed just after stdout's may not be in `stderr` yet)."""
        if any(text in line for line in self.stderr):
            return True
        deadline = time.monotonic() + within_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                if text in self.stderr_lines.get(timeout=left):
                    return True
            except queue.Empty:
                return False
        return False

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr.append(line.rstrip("\n"))
            self.stderr_lines.put(line)

    def server_pid(self) -> int:
        return next(pid for pid in child_pids(self.process.pid)
                    if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"tritonserver"))

    def work_dir(self, server_pid: int) -> Path:
        command = Path(f"/proc/{server_pid}/cmdline").read_bytes().decode().split("\0")
        backends = next(part.split("=", 1)[1] for part in command if part.startswith("--backend-directory="))
        return Path(backends).parent

    def leftovers(self) -> dict:
        """What the run makes that must not outlive it: its server's work folder, shared-memory prefix and
        Python backend folder (from the folder's record), and the server's and stubs' pids."""
        server_pid = self.server_pid()
        work_dir = self.work_dir(server_pid)
        record = json.loads((work_dir / OWNER_RECORD).read_text())
        assert record["python_env"] and Path(record["python_env"]).is_dir(), record  # known while it serves
        return {"server": server_pid, "stubs": all_stub_pids(server_pid), "work_dir": work_dir,
                "shm_prefix": record["shm_prefix"], "python_env": Path(record["python_env"])}

    def stop_line(self, since: int) -> tuple[str, float]:
        """The one line serve says at a stop, after stderr line `since`, and the exit timeout it announces."""
        lines = [line for line in self.stderr[since:] if line.startswith("stopping")]
        assert len(lines) == 1, self.stderr[since:]
        announced = STOPPING.match(lines[0])
        assert announced, lines[0]
        return lines[0], float(announced.group(1))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _gone(pid: int, within_s: float) -> bool:
    """Whether `pid` ends within `within_s`: an exited process its adopter has not reaped yet (a zombie) has."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling for an exit we are not the parent of: it has no signal of its own


@pytest.fixture(scope="module")
def repository(tiny_models, tmp_path_factory) -> Path:
    # The replay engine: how `serve` starts and stops does not depend on the tokens, and its streams last the
    # same on any machine (the transformers engine would spend the CPU generating them).
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("lifecycle") / "repo",
                              engine="replay", replay_step_ms=STEP_MS, max_input_len=64, max_seq_len=1024,
                              max_batch_size=2 * STREAMS, serving=lean_serving()))


@pytest.fixture(scope="module")
def native_repository(tiny_models, tmp_path_factory) -> Path:
    """The same, its engine the C++ replay backend (--replay-native), which runs in tritonserver's own process."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler (g++) to build the C++ replay engine")
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("lifecycle-native") / "repo",
                              engine="replay", replay_native=True, replay_step_ms=STEP_MS, max_input_len=64,
                              max_seq_len=1024, max_batch_size=2 * STREAMS, serving=lean_serving()),
                 progress=lambda _: None)


@pytest.fixture(scope="module")
def serve(repository):
    serving = Serve(repository)
    yield serving
    serving.stop()


def test_serve_says_it_holds_the_terminal_and_answers_from_a_second_one(serve):
    assert serve.wait_for_stderr("second terminal"), serve.stderr
    said = SWEPT.sub("", START_RETRIED.sub("", "\n".join(serve.stderr)))
    assert "WARNING" not in said and "error" not in said, serve.stderr
    result = tritonforge("generate", "The server", "--url", serve.url, "--max-tokens", "4")
    assert result.returncode == 0 and result.stdout.strip(), result.stderr


def test_serve_of_a_checkpoint_builds_into_the_cache_and_a_second_serve_reuses_that_build_and_answers(
        tiny_models, tmp_path):
    """`serve CHECKPOINT` twice with the same build flags: the first builds the repository into --cache-dir and
    serves it; the second says it reuses that folder, builds nothing, and answers through the OpenAI API (a serve
    option: not a build's, so not keyed)."""
    cache = tmp_path / "cache"
    flags = ("--cache-dir", str(cache), "--engine", "replay", "--replay-step-ms", str(STEP_MS), "--max-input-len",
             "64", "--max-seq-len", "1024", "--preprocessing-instances", "1", "--postprocessing-instances", "1")
    first = Serve(tiny_models["bpe"], flags=flags)
    try:
        assert first.wait_for_stderr("building the repository of"), first.stderr
        [built] = list(cache.iterdir())  # the complete build alone: its temporary folder was renamed
        assert not built.name.startswith(".") and (built / "tritonforge.json").is_file()
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=EXIT_TIMEOUT_S + 30) == 0
    finally:
        first.stop()
    second = Serve(tiny_models["bpe"], openai=True, flags=flags)
    try:
        assert second.wait_for_stderr(f"reusing {built}:"), second.stderr
        assert not any("building" in line or "writing" in line for line in second.stderr), second.stderr
        assert list(cache.iterdir()) == [built]
        connection = http.client.HTTPConnection("127.0.0.1", second.openai_port, timeout=READY_WITHIN_S)
        connection.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                           body=json.dumps({"model": "tritonforge", "prompt": "The server", "max_tokens": 4}))
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == 200 and answer["choices"][0]["text"], answer
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=EXIT_TIMEOUT_S + 30) == 0
    finally:
        second.stop()


def test_serve_of_a_checkpoint_answers_grammar_guided_requests_on_the_run_that_builds_it(tiny_models, tmp_path):
    """The run of `serve CHECKPOINT --openai-port` that builds: the build (in serve's own process) only tokenizes and
    marks torch absent; the gateway then writes each guided request's grammar with xgrammar, which imports torch.
    It once answered every such request 500 in plain text; here a json_schema one is answered, as the schema says."""
    flags = ("--cache-dir", str(tmp_path / "cache"), "--max-input-len", "256", "--max-seq-len", "512",
             "--preprocessing-instances", "1", "--postprocessing-instances", "1")
    served = Serve(tiny_models["bpe"], openai=True, flags=flags)
    try:
        assert served.wait_for_stderr("building the repository of"), served.stderr
        schema = {"type": "object", "additionalProperties": False, "required": ["city"],
                  "properties": {"city": {"enum": ["Paris", "Oslo"]}}}
        connection = http.client.HTTPConnection("127.0.0.1", served.openai_port, timeout=READY_WITHIN_S)
        body = {"model": "tritonforge", "messages": [{"role": "user", "content": "Which city?"}], "max_tokens": 32,
                "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}}
        connection.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                           body=json.dumps(body))
        response = connection.getresponse()
        answer = response.read()
        connection.close()
        assert response.status == 200, answer
        choice = json.loads(answer)["choices"][0]
        if choice["finish_reason"] == "stop":  # an object may be cut by max_tokens; a finished one is whole
            assert json.loads(choice["message"]["content"])["city"] in ("Paris", "Oslo"), choice
        else:
            assert choice["message"]["content"].startswith('{"city": "'), choice
    finally:
        served.stop()


def test_a_second_serve_on_the_same_ports_is_refused_and_the_first_keeps_serving(serve, repository):
    result = tritonforge("serve", str(repository), "--http-port", str(serve.http_port), "--grpc-port",
                         str(serve.grpc_port), "--metrics-port", str(serve.metrics_port))
    assert_one_line(result, 2, f"--http-port: 127.0.0.1:{serve.http_port} is already in use")
    assert tritonforge("generate", "hi", "--url", serve.url, "--max-tokens", "2").returncode == 0


def test_generate_over_http_at_the_grpc_port_says_it_is_not_triton_http(serve):
    result = tritonforge("generate", "hi", "--protocol", "http", "--url", serve.url)
    assert_one_line(result, 1, f"no Triton server answers at {serve.url} (HTTP): it answers HTTP/2, as a gRPC port "
                               f"does", "--protocol grpc")


def test_eval_at_the_http_port_says_it_answers_http_not_grpc(serve, tiny_models):
    """Triton's HTTP port closes a gRPC connection without a word ("Socket closed"): the client asks it in HTTP."""
    url = f"127.0.0.1:{serve.http_port}"
    result = tritonforge("eval", "--url", url, "--reference", str(tiny_models["bpe"]))
    assert_one_line(result, 1, f"no Triton server answers at {url} (gRPC): it answers HTTP, not gRPC")


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_request_without_max_tokens_is_refused_naming_it_on_every_protocol(serve, model):
    """Triton 2.51 runs no ensemble step whose required input is missing: without our optional max_tokens the
    ensemble answered HTTP 200 with no text (gRPC: an empty final response), where the BLS named the field."""
    import json
    import urllib.error
    import urllib.request

    for endpoint in ("generate", "generate_stream"):
        request = urllib.request.Request(f"http://127.0.0.1:{serve.http_port}/v2/models/{model}/{endpoint}",
                                         data=json.dumps({"text_input": "The server"}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400, (endpoint, refused.value.read())
        assert "max_tokens: is required" in refused.value.read().decode(), endpoint
    assert grpc_answer(serve.url, model, {"text_input": np.array([[b"The server"]], dtype=np.object_)}) == \
        "max_tokens: is required"


def grpc_answer(url: str, model: str, inputs: dict) -> str | None:
    """One request on a gRPC stream: the error its stream ends with, or None for a final response."""
    import tritonclient.grpc as grpcclient

    from tritonforge.clients.client import grpc_tensors, is_final

    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, grpc_tensors(grpcclient, inputs), enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                return str(error).removeprefix("in ensemble 'ensemble', ")
            if is_final(result):
                return None
    finally:
        client.stop_stream()
        client.close()


def test_tune_refuses_a_repository_that_a_running_serve_uses_and_changes_nothing(serve, repository):
    before = {path: path.read_text() for path in repository.glob("*/config.pbtxt")}
    result = tritonforge("tune", str(repository), "--concurrency", "2", "--duration-s", "1")
    assert_one_line(result, 1, f"{repository} is served now", str(serve.process.pid), "stop it first")
    assert {path: path.read_text() for path in repository.glob("*/config.pbtxt")} == before


def open_streams(url: str, first_chunk: threading.Barrier, tokens: int = LONG_STREAM_TOKENS,
                 models: tuple[str, ...] = ("ensemble",) * STREAMS + ("tensorrt_llm_bls",) * STREAMS) -> list[dict]:
    """Streams of `tokens` through `models` (the ensemble and the BLS), still open when the test stops the
    server; each waits at `first_chunk` once it has its first text."""
    outcomes = [{"ended": threading.Event()} for _ in models]

    def run(outcome: dict, model: str) -> None:
        client = GrpcClient(url, model=model)
        try:
            for index, _ in enumerate(client.stream("Tell me a long story", max_tokens=tokens, min_tokens=tokens)):
                if index == 0:
                    first_chunk.wait(timeout=READY_WITHIN_S)
            outcome["error"] = None
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcome["error"] = str(error)
        finally:
            outcome["ended"].set()
            client.close()

    for outcome, model in zip(outcomes, models):
        threading.Thread(target=run, args=(outcome, model), daemon=True).start()
    return outcomes


def test_sigterm_under_open_streams_stops_in_one_line_and_the_server_exits_by_itself(serve):
    first_chunk = threading.Barrier(2 * STREAMS + 1)
    outcomes = open_streams(serve.url, first_chunk, SHORT_STREAM_TOKENS)
    first_chunk.wait(timeout=READY_WITHIN_S)
    left = serve.leftovers()
    lines_before = len(serve.stderr)
    asked = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=EXIT_TIMEOUT_S + 30) == 0
    took = time.monotonic() - asked
    said = serve.stderr[lines_before:]
    _, announced = serve.stop_line(lines_before)
    assert took < announced, (took, said)
    assert not any("killing" in line or "Traceback" in line for line in said), said
    assert all(outcome["ended"].wait(CLIENTS_END_S) for outcome in outcomes), outcomes  # each finished or failed
    assert_nothing_left(left)


def assert_nothing_left(left: dict) -> None:
    """No process of the run's server, and none of its folders or shared memory (the server and its stubs end
    within a bounded wait: they are no children of the test)."""
    assert _gone(left["server"], 5)
    assert all(_gone(stub, 5) for stub in left["stubs"]), left["stubs"]
    assert not left["work_dir"].exists(), "the server's work folder outlived it"
    assert not list(SHARED_MEMORY_DIR.glob(f"{left['shm_prefix']}*")), "the stubs' shared memory outlived them"
    assert not left["python_env"].exists(), "the Python backend's folder outlived its server"


LAG_STEP_MS = 200
# Slower than a step: the postprocessing of an ensemble stream's last chunk is still running when a stop ends
# the stream (as on a loaded machine), which Triton 2.51 answered by keeping the ensemble request in flight for
# ever; two instances keep up with one ensemble stream on average (5 chunks a second).
POSTPROCESSING_LAG_S = 0.3
LAGGING_POSTPROCESSING = f"""

import time as _time

_execute = TritonPythonModel.execute


def _lagging_execute(self, requests):  # a test double: postprocessing that lags behind the engine
    _time.sleep({POSTPROCESSING_LAG_S})
    return _execute(self, requests)


TritonPythonModel.execute = _lagging_execute
"""
OPENAI_STREAMS = 2


@pytest.fixture(scope="module")
def lagging_repository(tiny_models, tmp_path_factory) -> Path:
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("lagging") / "repo",
                                    engine="replay", replay_step_ms=LAG_STEP_MS, text_backend="python",
                                    max_input_len=64, max_seq_len=1024, max_batch_size=2 + OPENAI_STREAMS,
                                    serving=lean_serving(postprocessing_instances=2)))
    model = repository / "postprocessing" / "1" / "model.py"
    model.write_text(model.read_text() + LAGGING_POSTPROCESSING)
    return repository


def openai_stream(port: int, outcome: dict, first_chunk: threading.Barrier) -> None:
    """One OpenAI completion streamed as server-sent events; `outcome` gets its last event before [DONE]."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=READY_WITHIN_S)
    body = {"model": "tritonforge", "prompt": "Tell me a long story", "stream": True,
            "max_tokens": LONG_STREAM_TOKENS, "min_tokens": LONG_STREAM_TOKENS}
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        events = 0
        for line in response:
            if line.startswith(b"data: {"):
                outcome["last"] = json.loads(line[6:])
                events += 1
                if events == 1:
                    first_chunk.wait(timeout=READY_WITHIN_S)
            elif line.startswith(b"data: [DONE]"):
                outcome["done"] = True
    except Exception as error:  # noqa: BLE001 - the outcome under test
        outcome["error"] = repr(error)
    finally:
        outcome["ended"].set()
        connection.close()


@pytest.mark.parametrize("stop", [signal.SIGINT], ids=["ctrl-c"])
def test_a_stop_under_ensemble_bls_and_openai_streams_ends_within_its_exit_timeout_and_tells_the_clients(
        lagging_repository, stop):
    """Ctrl-C of `serve --openai-port` under streams that outlive any stop: serve ends within the exit timeout it
    announces, without killing tritonserver (whose ensemble stream ended while postprocessing still ran its last
    chunk), and every client is told that the server is shutting down, none that no server answers."""
    serving = Serve(lagging_repository, openai=True)
    try:
        first_chunk = threading.Barrier(2 + OPENAI_STREAMS + 1)
        grpc_outcomes = open_streams(serving.url, first_chunk, models=("ensemble", "tensorrt_llm_bls"))
        openai_outcomes = [{"ended": threading.Event()} for _ in range(OPENAI_STREAMS)]
        for outcome in openai_outcomes:
            threading.Thread(target=openai_stream, args=(serving.openai_port, outcome, first_chunk),
                             daemon=True).start()
        first_chunk.wait(timeout=READY_WITHIN_S)
        left = serving.leftovers()
        lines_before = len(serving.stderr)
        asked = time.monotonic()
        serving.process.send_signal(stop)
        assert serving.process.wait(timeout=EXIT_TIMEOUT_S + 30) == 0
        took = time.monotonic() - asked
        said = serving.stderr[lines_before:]
        _, announced = serving.stop_line(lines_before)
        assert took < announced, (took, said)
        assert not any("killing" in line or "Traceback" in line or "WARNING" in line for line in said), said
        assert all(outcome["ended"].wait(CLIENTS_END_S) for outcome in grpc_outcomes + openai_outcomes)
        for outcome in grpc_outcomes:
            assert "unavailable: the server is shutting down" in (outcome["error"] or ""), outcome
        for outcome in openai_outcomes:
            assert outcome.get("done") and "the server is shutting down" in outcome["last"]["error"]["message"], \
                outcome
        assert_nothing_left(left)
    finally:
        serving.stop()


STUB_EXIT_S = 30  # a stub's watcher acts on its server's end at once; the rest absorbs a loaded machine
# Once the server's processes are gone: the reaper's cleanup (its imports, the removals) and its exit
REAPER_DONE_S = 10


@pytest.fixture(scope="module")
def transformers_repository(tiny_models, tmp_path_factory) -> Path:
    """The transformers engine, whose stub publishes Triton metrics from a thread of its own: the stub that was
    left running after its server was killed."""
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("engine") / "repo",
                              max_input_len=64, max_seq_len=1024, max_batch_size=2 * STREAMS, serving=lean_serving()))


def reaper_pid(serve: Serve) -> int:
    """The process that cleans up after a kill of `serve` (serve/reaper.py)."""
    return next(pid for pid in child_pids(serve.process.pid)
                if b"tritonforge.serve.reaper" in Path(f"/proc/{pid}/cmdline").read_bytes())


def kill_under_streams(serve: Serve, *, with_reaper: bool) -> tuple[dict, list[dict], list[Path]]:
    """`kill -9` of `serve` while the engine answers streams (and of its reaper too, with `with_reaper`): its
    server dies with it and so does every stub (the engine's was seen holding 429 MB five minutes later, its
    metrics thread stuck with the GIL in a call to the dead server), and the clients are told the server stopped
    their streams. Returns what the run had made, the streams' outcomes and the stubs' regions."""
    first_chunk = threading.Barrier(2 * STREAMS + 1)
    outcomes = open_streams(serve.url, first_chunk)
    first_chunk.wait(timeout=READY_WITHIN_S)
    left = serve.leftovers()
    stub_regions = sorted(SHARED_MEMORY_DIR.glob(f"tritonforge_pid{serve.process.pid}_*"))
    assert stub_regions, "the stubs' regions do not name the process that started their server"
    assert "tensorrt_llm" in left["stubs"].values(), left["stubs"]
    reaper = reaper_pid(serve)
    if with_reaper:
        os.kill(reaper, signal.SIGKILL)
    serve.process.kill()
    serve.process.wait()
    assert _gone(left["server"], STUB_EXIT_S), "tritonserver outlived the `serve` that started it"
    alive = [(pid, model) for pid, model in left["stubs"].items() if not _gone(pid, STUB_EXIT_S)]
    assert not alive, f"stubs outlived their server: {alive}"
    assert all(outcome["ended"].wait(CLIENTS_END_S) for outcome in outcomes), outcomes
    assert all("stopped the stream" in (outcome["error"] or "") for outcome in outcomes), outcomes
    left["reaper"] = reaper
    return left, outcomes, stub_regions


def test_serve_killed_with_sigkill_under_streams_leaves_nothing_a_few_seconds_later(
        transformers_repository, tmp_path, monkeypatch):
    """After `kill -9` of serve, its reaper removes the run's work folder, shared memory and Python backend folder
    once the server's processes are gone, and ends: nothing of the run is left."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # work folders of this test's own: no other start sweeps them
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    killed = Serve(transformers_repository)
    try:
        left, _, stub_regions = kill_under_streams(killed, with_reaper=False)
        assert _gone(left["reaper"], REAPER_DONE_S), "the reaper did not end"
        assert not left["work_dir"].exists(), "the killed run's work folder is left"
        assert not [region for region in stub_regions if region.exists()], "and its shared memory"
        assert not left["python_env"].exists(), "and its Python backend folder"
    finally:
        killed.stop()


def test_what_a_kill_of_serve_and_its_reaper_leaves_the_next_start_removes_saying_so_in_one_line(
        transformers_repository, repository, tmp_path, monkeypatch, caplog):
    """`kill -9` of serve and of its reaper (say, the whole machine's processes of a user): the next start
    removes the run's work folder, shared memory and Python backend folder, saying so in one line."""
    # Work folders in a temporary folder of this test's own: a server started meanwhile by another test process
    # sweeps the shared one, and could remove the dead run's folder before this test looks for it.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    killed = Serve(transformers_repository)
    try:
        left, _, stub_regions = kill_under_streams(killed, with_reaper=True)
        assert left["work_dir"].exists() and left["python_env"].exists()  # left: nobody was there to clean up
        with caplog.at_level(logging.WARNING, logger="tritonforge.serve.leftovers"):
            with TritonServer(repository, extra_args=only_models(ENGINE_MODEL)):  # any start sweeps: the quickest
                assert not left["work_dir"].exists(), "the next start left the dead run's work folder"
                assert not [region for region in stub_regions if region.exists()], "and its shared memory"
                assert not left["python_env"].exists(), "and its Python backend folder"
        swept = [record.getMessage() for record in caplog.records if "killed tritonforge servers" in
                 record.getMessage()]
        assert len(swept) == 1 and "\n" not in swept[0] and str(killed.process.pid) in swept[0], swept
        assert "1 work folder" in swept[0] and "1 Python backend folder" in swept[0], swept
    finally:
        killed.stop()


def test_a_tritonserver_killed_from_outside_takes_its_stubs_along(transformers_repository):
    """tritonserver killed by someone else, its launcher alive but not looking (no supervisor): its stubs end
    without it, the engine's too, whose metrics thread gets stuck with the GIL in its next call to the server."""
    server = TritonServer(transformers_repository, extra_args=only_models(ENGINE_MODEL)).start()
    try:
        stubs, python_env = all_stub_pids(server.pid), server.python_env
        assert list(stubs.values()) == [ENGINE_MODEL], stubs
        os.kill(server.pid, signal.SIGKILL)
        alive = [(pid, model) for pid, model in stubs.items() if not _gone(pid, STUB_EXIT_S)]
        assert not alive, f"stubs outlived their server: {alive}"
        # Its Python backend's folder is the server's only where it was the one folder that appeared while it started
        # (serve/python_env.py); another server starting beside it leaves it unclaimed, which the unit tests cover.
        if python_env is not None:
            assert python_env.is_dir()  # a killed server cannot remove its Python backend's folder ...
            server.kill()
            assert not python_env.exists()  # ... its launcher does
    finally:
        server.kill()


def test_the_supervisor_gives_up_on_a_server_that_does_not_come_back(repository, tmp_path, caplog):
    """A server that serves, then dies, then fails every start (its model broke on disk, say): a few attempts,
    each after twice the wait of the one before, then one clear error instead of restarting for ever. The
    server loads the engine model alone, whose start and failures take seconds, not the whole repository's."""
    server = TritonServer(repository, extra_args=only_models(ENGINE_MODEL))
    supervisor = Supervisor(server, wedged_after_s=0, period_s=0.2, max_backoff_s=2, max_failed_starts=3)
    supervisor.start()
    config = repository / ENGINE_MODEL / "config.pbtxt"
    original = config.read_text()
    config.write_text("this is not a model config")
    try:
        server.kill()
        with caplog.at_level(logging.ERROR, logger="tritonforge.serve.supervisor"):
            with pytest.raises(Exception, match="did not come back in 3 attempts in a row; giving up"):
                supervisor.run(threading.Event())
    finally:
        config.write_text(original)
    assert not server.is_running()
    waits = re.findall(r"next attempt in (\d+) s", caplog.text)
    assert waits == ["1", "2"], caplog.text


@pytest.mark.parametrize("engine_repository", ["repository", "native_repository"], ids=["python", "cpp"])
def test_streams_still_open_when_the_stop_deadline_comes_end_unavailable_and_the_server_exits_by_itself(
        engine_repository, request):
    """A stop that gives open requests 1 s, less than the open streams need: the engine, the Python replay engine
    or the C++ one, ends them with UNAVAILABLE, the ensemble's included, within that time and the engine's few
    seconds to end them, and the server then unloads and exits by itself (status 0: no kill) within its exit
    timeout."""
    assert_a_stop_of_1_s_ends_the_streams_unavailable(request.getfixturevalue(engine_repository))


def assert_a_stop_of_1_s_ends_the_streams_unavailable(repository: Path) -> None:
    """Ensemble and BLS streams longer than any stop, a stop that gives them 1 s: each ends with UNAVAILABLE
    within that second and the few the models take to end them, and the server exits by itself (status 0: no
    kill) within its exit timeout, leaving nothing."""
    server = TritonServer(repository, drain_timeout_s=1).start()
    first_chunk = threading.Barrier(2 * STREAMS + 1)
    outcomes = open_streams(server.grpc_url, first_chunk)
    first_chunk.wait(timeout=READY_WITHIN_S)
    work_dir, shm_prefix, python_env = server._work_dir, server.shm_prefix, server.python_env
    stopped: queue.Queue = queue.Queue()
    asked = time.monotonic()
    threading.Thread(target=lambda: stopped.put(server.stop()), daemon=True).start()
    assert all(outcome["ended"].wait(1 + DRAIN_END_S + 5) for outcome in outcomes), outcomes
    assert all("the server is shutting down" in (outcome["error"] or "") for outcome in outcomes), outcomes
    assert stopped.get(timeout=server.exit_timeout_s + 30) == 0 and time.monotonic() - asked < server.exit_timeout_s
    assert not work_dir.exists() and not list(SHARED_MEMORY_DIR.glob(f"{shm_prefix}*"))
    assert python_env is not None and not python_env.exists()


@pytest.fixture(scope="module", params=["cpp", "python"])
def deaf_engine_repository(request, tiny_models, tmp_path_factory) -> Path:
    """The C++ replay engine told to read no stop of ours (`replay_reads_stop` false), as NVIDIA's engine reads
    none: a test double of that engine. Its ensemble goes through the coalescer; its BLS is the C++ one or the
    Python one (`text_backend`)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler (g++) to build the C++ replay engine and the coalescer")
    repository = build(BuildOptions(
        model=tiny_models["bpe"], output=tmp_path_factory.mktemp(f"deaf-{request.param}") / "repo", engine="replay",
        replay_native=True, replay_step_ms=STEP_MS, text_backend=request.param, max_input_len=64, max_seq_len=1024,
        max_batch_size=2 * STREAMS, serving=lean_serving()), progress=lambda _: None)
    path = repository / ENGINE_MODEL / "config.pbtxt"
    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    config.parameters["replay_reads_stop"].string_value = "false"
    path.write_text(text_format.MessageToString(config))
    return repository


def test_the_models_around_an_engine_that_reads_no_stop_end_its_streams_at_the_deadline(deaf_engine_repository):
    """NVIDIA's engine ends nothing at a stop of ours: the BLS and the ensemble's coalescer end their open streams
    at the deadline themselves (UNAVAILABLE, the server is shutting down), cancel the engine's requests, and the
    server exits by itself (status 0: no kill) within its exit timeout."""
    assert_a_stop_of_1_s_ends_the_streams_unavailable(deaf_engine_repository)

"""`tritonforge serve` as a user runs it (a subprocess, a real tritonserver): what it says, what it refuses while
it serves (a second serve on its ports, `tune` of its repository), how it stops (SIGTERM under open streams:
one line, the server exits by itself, nothing left), and what a run killed with SIGKILL leaves to the next
start (nothing, once that start has swept). The supervisor gives up on a server that cannot come back."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GrpcClient
from tritonforge.facts.contract import ENGINE_MODEL
from tritonforge.serve.server import DRAIN_END_S, SHARED_MEMORY_DIR, TritonServer, free_port, only_models
from tritonforge.serve.supervisor import Supervisor

from .conftest import child_pids, lean_serving
from .test_user_mistakes import assert_one_line, tritonforge

READY_WITHIN_S = 300  # a server start on the loaded 2-core CI machine takes 10-60 s
EXIT_TIMEOUT_S = 10  # TritonServer's default: the wait for in-flight requests, and again for unloading
# A clean stop takes at most the server's two waits and the stubs' exit; more means it had to be killed.
STOP_WITHIN_S = 2 * EXIT_TIMEOUT_S + 15
STREAMS = 2  # per model, ensemble and BLS
STEP_MS = 20  # the replay engine's step
# Streams that finish well within the exit timeout (0.8 s at STEP_MS): streams cut at that deadline can leave
# Triton 2.51 counting ensemble requests in flight, which ends the stop in a kill (the edge
# docs/design/faults.md describes); and streams that outlive any stop's deadline (18 s).
SHORT_STREAM_TOKENS = 40
LONG_STREAM_TOKENS = 900
# The one warning a sound start may log: Triton 2.51 wedged or crashed while loading (a starved CPU is enough),
# and the start made once more (test_server_start.py). Its message spans lines, up to this one.
START_RETRIED = re.compile(r"^WARNING tritonforge\.serve\.server: .*?^starting the server once more$\n?", re.M | re.S)


class Serve:
    """A `tritonforge serve` subprocess; its stderr lines as they come."""

    def __init__(self, repository: Path):
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.cli", "serve", str(repository), "--http-port", str(self.http_port),
             "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self.stderr_lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        line = self.process.stdout.readline()  # "serving ..." once ready (or EOF if it failed)
        assert line.startswith("serving"), (line, self.stderr)
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

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)  # polling for an exit we are not the parent of: it has no signal of its own
    return False


@pytest.fixture(scope="module")
def repository(tiny_models, tmp_path_factory) -> Path:
    # The replay engine: how `serve` starts and stops does not depend on the tokens, and its streams last the
    # same on any machine (the transformers engine would spend the CPU generating them).
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("lifecycle") / "repo",
                              engine="replay", replay_step_ms=STEP_MS, max_input_len=64, max_seq_len=1024,
                              max_batch_size=2 * STREAMS, serving=lean_serving()))


@pytest.fixture(scope="module")
def serve(repository):
    serving = Serve(repository)
    yield serving
    serving.stop()


def test_serve_says_it_holds_the_terminal_and_answers_from_a_second_one(serve):
    assert serve.wait_for_stderr("second terminal"), serve.stderr
    said = START_RETRIED.sub("", "\n".join(serve.stderr))
    assert "WARNING" not in said and "error" not in said, serve.stderr
    result = tritonforge("generate", "The server", "--url", serve.url, "--max-tokens", "4")
    assert result.returncode == 0 and result.stdout.strip(), result.stderr


def test_a_second_serve_on_the_same_ports_is_refused_and_the_first_keeps_serving(serve, repository):
    result = tritonforge("serve", str(repository), "--http-port", str(serve.http_port), "--grpc-port",
                         str(serve.grpc_port), "--metrics-port", str(serve.metrics_port))
    assert_one_line(result, 2, f"--http-port: 127.0.0.1:{serve.http_port} is already in use")
    assert tritonforge("generate", "hi", "--url", serve.url, "--max-tokens", "2").returncode == 0


def test_generate_over_http_at_the_grpc_port_says_it_is_not_triton_http(serve):
    result = tritonforge("generate", "hi", "--protocol", "http", "--url", serve.url)
    assert_one_line(result, 1, f"no Triton server answers at {serve.url} (HTTP)")


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


def open_streams(url: str, first_chunk: threading.Barrier, tokens: int = LONG_STREAM_TOKENS) -> list[dict]:
    """Streams of `tokens` through the ensemble and the BLS, still open when the test stops the server."""
    outcomes = [{"ended": threading.Event()} for _ in range(2 * STREAMS)]

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

    for index, outcome in enumerate(outcomes):
        model = "ensemble" if index < STREAMS else "tensorrt_llm_bls"
        threading.Thread(target=run, args=(outcome, model), daemon=True).start()
    return outcomes


def test_sigterm_under_open_streams_stops_in_one_line_and_the_server_exits_by_itself(serve):
    first_chunk = threading.Barrier(2 * STREAMS + 1)
    outcomes = open_streams(serve.url, first_chunk, SHORT_STREAM_TOKENS)
    first_chunk.wait(timeout=READY_WITHIN_S)
    server_pid = serve.server_pid()
    work_dir = serve.work_dir(server_pid)
    shm_prefix = next(part.rsplit("=", 1)[1] for part in
                      Path(f"/proc/{server_pid}/cmdline").read_bytes().decode().split("\0")
                      if "shm-region-prefix-name=" in part)
    lines_before = len(serve.stderr)
    asked = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=STOP_WITHIN_S + 30) == 0
    took = time.monotonic() - asked
    said = serve.stderr[lines_before:]
    assert took < STOP_WITHIN_S, (took, said)
    assert len([line for line in said if "stopping" in line]) == 1, said
    assert not any("killing" in line or "Traceback" in line for line in said), said
    assert all(outcome["ended"].wait(10) for outcome in outcomes), outcomes  # each stream finished or failed
    assert _gone(server_pid, 5)
    assert not work_dir.exists(), "the server's work folder outlived it"
    assert not list(SHARED_MEMORY_DIR.glob(f"{shm_prefix}*")), "the stubs' shared memory outlived them"


def test_serve_killed_with_sigkill_takes_its_server_along_and_the_next_start_sweeps_what_it_left(repository, tmp_path,
                                                                                                   monkeypatch):
    # Work folders in a temporary folder of this test's own: a server started meanwhile by another test process
    # sweeps the shared one, and could remove the dead run's folder before this test looks for it.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    killed = Serve(repository)
    try:
        server_pid = killed.server_pid()
        work_dir = killed.work_dir(server_pid)
        stub_regions = sorted(SHARED_MEMORY_DIR.glob(f"tritonforge_pid{killed.process.pid}_*"))
        assert stub_regions, "the stubs' regions do not name the process that started their server"
        killed.process.kill()
        killed.process.wait()
        assert _gone(server_pid, 30), "tritonserver outlived the `serve` that started it"
        assert work_dir.exists()  # left: nobody was there to clean up
        with TritonServer(repository, extra_args=only_models(ENGINE_MODEL)):  # any start sweeps: the quickest
            assert not work_dir.exists(), "the next start left the dead run's work folder"
            assert not [region for region in stub_regions if region.exists()], "and its shared memory"
    finally:
        killed.stop()


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


def test_streams_still_open_when_the_stop_deadline_comes_end_unavailable_and_nothing_is_left(repository):
    """A stop that gives open requests 1 s, less than the open streams need: the engine ends them with
    UNAVAILABLE, the ensemble's included, within that time and the engine's few seconds to end them. (Triton
    2.51 then keeps those ensemble requests in flight, so that server may still need its kill after its own
    timeouts: docs/design/faults.md#supervisor; a 2 s exit timeout keeps that wait short.)"""
    server = TritonServer(repository, drain_timeout_s=1, exit_timeout_s=2).start()
    first_chunk = threading.Barrier(2 * STREAMS + 1)
    outcomes = open_streams(server.grpc_url, first_chunk)
    first_chunk.wait(timeout=READY_WITHIN_S)
    work_dir, shm_prefix = server._work_dir, server.shm_prefix
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    assert all(outcome["ended"].wait(1 + DRAIN_END_S + 5) for outcome in outcomes), outcomes
    assert all("the server is shutting down" in (outcome["error"] or "") for outcome in outcomes), outcomes
    stopping.join(timeout=server.stop_timeout_s + 30)
    assert not work_dir.exists() and not list(SHARED_MEMORY_DIR.glob(f"{shm_prefix}*"))

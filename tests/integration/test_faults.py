"""Fault injection against a real tritonserver run by the supervisor: kill -9 of each Python stub kind
under streaming load (every open stream must end with an error within 5 s, readiness must stop saying
ready within 5 s, and requests must succeed again within 60 s), stubs that are alive but run nothing, and
shutdowns (a clean one under open streams; `tritonforge serve` under Ctrl-C, twice)."""

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GrpcClient
from tritonforge.facts.errors import ErrorKind
from tritonforge.serve.leftovers import SHARED_MEMORY_DIR
from tritonforge.serve.ports import free_port
from tritonforge.serve.processes import all_stub_pids
from tritonforge.serve.server import TritonServer
from tritonforge.serve.supervisor import Supervisor

from .conftest import child_pids, lean_serving

STREAMS = 4
WEDGED_AFTER_S = 5  # the supervisor's limit here: far above a healthy stub's silence, far below the default
# A restart takes ~15 s on an idle 2-core machine and 60-80 s while it runs other suites; every wait below ends
# at its event, so a wide bound costs a passing run nothing.
RESTART_S = 150
STEP_MS = 20  # the replay engine's step: a 900-token stream lasts 18 s, far past every kill and stop here


@pytest.fixture(scope="module")
def supervised(tiny_models, tmp_path_factory):
    # The replay engine: what is under test is the pipeline around a dying stub, not the tokens; a transformers
    # engine would spend the machine's CPU generating the open streams and loading torch at every restart.
    # The Python postprocessing: its stub is one of the victims.
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("faults") / "repo",
                                    engine="replay", replay_step_ms=STEP_MS, max_input_len=64, max_seq_len=1024,
                                    text_backend="python",
                                    max_batch_size=STREAMS, serving=lean_serving(postprocessing_instances=2)))
    supervisor = Supervisor(TritonServer(repository), period_s=0.2, probe_period_s=0.5, wedged_after_s=WEDGED_AFTER_S)
    supervisor.start()
    stop = threading.Event()
    thread = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    thread.start()
    yield supervisor
    stop.set()
    thread.join(timeout=60)


def ready(server) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def open_streams(url: str, model: str, first_chunk: threading.Barrier) -> list[dict]:
    outcomes = [{} for _ in range(STREAMS)]

    def run(outcome):
        client = GrpcClient(url, model=model)
        try:
            for index, _ in enumerate(client.stream("Tell me a long story", max_tokens=900, min_tokens=900)):
                if index == 0:
                    first_chunk.wait(timeout=60)
            outcome["error"] = None
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcome["error"] = str(error)
            outcome["kind"] = getattr(error, "kind", None)
        finally:
            outcome["ended"] = time.monotonic()
            client.close()

    for outcome in outcomes:
        threading.Thread(target=run, args=(outcome,), daemon=True).start()
    return outcomes


@pytest.mark.parametrize("victim, model", [("tensorrt_llm", "ensemble"), ("postprocessing", "ensemble"),
                                           ("tensorrt_llm_bls", "tensorrt_llm_bls")])
def test_a_killed_stub_ends_every_stream_with_an_error_and_the_server_comes_back(supervised, victim, model):
    server = supervised.server
    restarts = supervised.restarts
    first_chunk = threading.Barrier(STREAMS + 1)
    outcomes = open_streams(server.grpc_url, model, first_chunk)
    first_chunk.wait(timeout=120)  # every stream is generating
    pid = next(pid for pid, name in all_stub_pids(server.pid).items() if name == victim)
    killed_server_regions = server.shm_prefix
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()

    deadline = killed + 5
    while time.monotonic() < deadline and (ready(server) or any("ended" not in o for o in outcomes)):
        time.sleep(0.05)
    assert all("ended" in o for o in outcomes), "a stream was still open 5 s after the kill"
    assert all(o["error"] and o["ended"] - killed <= 5 for o in outcomes), outcomes
    # a crash is the server's failure: never read as the client's mistake (HTTP 400 at the gateway)
    assert all(o["kind"] in (ErrorKind.INTERNAL, ErrorKind.UNAVAILABLE) for o in outcomes), outcomes
    assert not ready(server) or supervised.restarts > restarts

    # The supervisor says the server is back once its restart is done (a request can succeed a little earlier,
    # before it has looked at the new stubs: a stub killed then would go unnoticed).
    while supervised.restarts == restarts:
        assert time.monotonic() - killed < RESTART_S, f"the server was not serving again within {RESTART_S} s"
        time.sleep(0.1)
    assert supervised.restarts == restarts + 1
    client = GrpcClient(server.grpc_url, model=model)
    try:
        assert client.generate("Hello", max_tokens=4)
    finally:
        client.close()
    assert not list(SHARED_MEMORY_DIR.glob(f"{killed_server_regions}*")), "the killed server's stubs left memory"


@pytest.mark.parametrize("victim", ["preprocessing", "tensorrt_llm_bls"])
def test_a_stub_that_is_alive_but_answers_nothing_is_found_by_its_probe_and_the_server_comes_back(supervised, victim):
    server = supervised.server
    restarts = supervised.restarts
    pid = next(pid for pid, name in all_stub_pids(server.pid).items() if name == victim)
    os.kill(pid, signal.SIGSTOP)  # alive to every process check, answering nothing
    stopped = time.monotonic()
    while supervised.restarts == restarts:
        assert time.monotonic() - stopped < WEDGED_AFTER_S + RESTART_S, "the wedged stub was never noticed"
        time.sleep(0.1)
    client = GrpcClient(server.grpc_url, model="tensorrt_llm_bls" if victim == "tensorrt_llm_bls" else "ensemble")
    try:
        assert client.generate("Hello", max_tokens=4)
    finally:
        client.close()


def test_a_clean_shutdown_ends_open_streams_with_an_error_within_the_exit_timeout(tiny_models, tmp_path):
    # A 900-token stream lasts 18 s whatever the machine's speed, far past the exit timeout.
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", engine="replay",
                                    replay_step_ms=STEP_MS, max_input_len=64, max_seq_len=1024,
                                    max_batch_size=STREAMS, serving=lean_serving()))
    server = TritonServer(repository, exit_timeout_s=2).start()
    first_chunk = threading.Barrier(STREAMS + 1)
    outcomes = open_streams(server.grpc_url, "ensemble", first_chunk)
    first_chunk.wait(timeout=120)
    asked = time.monotonic()
    server.stop()  # SIGTERM; tritonserver waits for open streams, so stop() kills it after the exit timeout
    deadline = asked + 2 + 5 + 2
    while time.monotonic() < deadline and any("ended" not in o for o in outcomes):
        time.sleep(0.05)
    assert all("ended" in o and o["error"] for o in outcomes), outcomes


def test_a_python_engine_model_that_served_unloads_without_crashing_its_stub(tiny_models, tmp_path):
    """The engine model lets go of its requests' response senders when it is finalized: left for the
    interpreter's exit, they crashed the stub on its way out (Triton 2.51's Python backend logs "Segfault
    encountered" and the stub's backtrace in the server's log)."""
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                                    max_seq_len=256, max_batch_size=2, serving=lean_serving()))
    log = tmp_path / "server.log"
    server = TritonServer(repository, log_file=log).start()
    client = GrpcClient(server.grpc_url)
    try:
        assert client.generate("Hello", max_tokens=4) and "".join(client.stream("Hello", max_tokens=4))
    finally:
        client.close()
    server.stop()
    said = log.read_text()
    assert "successfully unloaded 'tensorrt_llm'" in said and "Segfault" not in said, said[-4000:]


def test_serve_stops_on_ctrl_c_and_a_second_one_leaves_nothing_behind(supervised):
    """`tritonforge serve` under a first SIGINT stops cleanly; a second one, sent during that stop, kills the
    server at once, and neither leaves a process, a work folder or shared memory behind."""
    http_port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "tritonforge.cli", "serve", str(supervised.server.repository),
                              "--http-port", str(http_port), "--grpc-port", str(free_port()),
                              "--metrics-port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert serve.stdout.readline().startswith(b"serving"), "serve did not start"  # and handles signals now
        server_pid = next(pid for pid in child_pids(serve.pid))
        command = Path(f"/proc/{server_pid}/cmdline").read_bytes().decode().split("\0")
        shm_prefix = next(part.rsplit("=", 1)[1] for part in command if "shm-region-prefix-name=" in part)
        work_dir = Path(next(part.split("=", 1)[1] for part in command if part.startswith("--backend-directory")))
        serve.send_signal(signal.SIGINT)
        for line in serve.stderr:  # the first signal is handled once serve says it is stopping
            if line.startswith(b"stopping tritonserver"):
                break
        else:
            pytest.fail("serve never said it was stopping")
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)  # the server and every stub of it are gone
    assert not work_dir.parent.exists(), "the server's work folder outlived it"
    assert not list(SHARED_MEMORY_DIR.glob(f"{shm_prefix}*"))

"""Failures of Triton 2.51 itself while it loads a repository are met with one more start, on a real
tritonserver: a load its Python backend wedges (a stub that misses its health check while its model
initializes is waited for forever; the stand-in for a starved stub is a model that stops itself, SIGSTOP, in
`initialize`: its health thread stops with it), and a server that crashes (the stand-in: a model that aborts
its tritonserver, SIGABRT, in `initialize`). The failure of the last of START_ATTEMPTS starts is the start's error.
Where a start lock is named, a start waits for the one that holds it."""

from __future__ import annotations

import fcntl
import logging
import threading
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.facts.environment import SERVER_START_LOCK_ENV
from tritonforge.serve.server import START_ATTEMPTS, CrashedWhileLoading, StubLaunchWedged, TritonServer

MODEL = "fails_in_initialize"
# Fails in `initialize` as many times as the count in the file `failures` says, one fewer each load: by
# FAILURE, formatted with the statement that fails.
STOP_ITS_STUB = "os.kill(os.getpid(), signal.SIGSTOP)"
ABORT_ITS_SERVER = "os.kill(os.getppid(), signal.SIGABRT)"
MODEL_PY = '''
import os
import signal
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        failures = Path(args["model_repository"]).parents[1] / "failures"
        left = int(failures.read_text())
        if left > 0:
            failures.write_text(str(left - 1))
            {failure}

    def execute(self, requests):
        return []
'''


def repository(tmp_path: Path, failure: str, failures: int) -> Path:
    root = tmp_path / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY.format(failure=failure))
    config = mc.ModelConfig(name=MODEL, backend="python", max_batch_size=0)
    config.input.add(name="IN", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="OUT", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    (root / MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    (tmp_path / "failures").write_text(str(failures))
    return root


@pytest.mark.parametrize("failure", [STOP_ITS_STUB, ABORT_ITS_SERVER], ids=["wedged", "crashed"])
def test_a_load_that_fails_once_is_started_once_more_and_serves(tmp_path, failure):
    server = TritonServer(repository(tmp_path, failure, failures=1), ready_timeout_s=60)
    try:
        server.start()
        assert server.is_running() and (tmp_path / "failures").read_text() == "0"
    finally:
        server.stop()


def test_a_load_wedged_at_every_start_fails_naming_the_model(tmp_path):
    with pytest.raises(StubLaunchWedged, match=f"^the load of {MODEL} is wedged: its stub missed"):
        TritonServer(repository(tmp_path, STOP_ITS_STUB, failures=START_ATTEMPTS), ready_timeout_s=60).start()
    assert (tmp_path / "failures").read_text() == "0"  # every load stopped: each start was made


def test_a_server_that_crashes_at_every_start_while_loading_fails_saying_so(tmp_path):
    with pytest.raises(CrashedWhileLoading, match=r"^tritonserver crashed while loading \(Aborted\)"):
        TritonServer(repository(tmp_path, ABORT_ITS_SERVER, failures=START_ATTEMPTS), ready_timeout_s=60).start()
    assert (tmp_path / "failures").read_text() == "0"


class _Seen(logging.Handler):
    """Sets `event` when a record's message starts with `prefix`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix, self.event = prefix, threading.Event()

    def emit(self, record):
        if record.getMessage().startswith(self.prefix):
            self.event.set()


def test_a_start_waits_while_another_holds_the_start_lock_then_serves(tmp_path, monkeypatch, caplog):
    """The start runs in the test's own thread (the server dies with the thread that started it, PR_SET_PDEATHSIG);
    another thread holds the lock, as another process would, until the start says it waits."""
    lock_path = tmp_path / "starts.lock"
    monkeypatch.setenv(SERVER_START_LOCK_ENV, str(lock_path))
    caplog.set_level(logging.INFO, logger="tritonforge.serve.start_lock")
    waiting = _Seen("waiting for another server's start to end")
    logging.getLogger("tritonforge.serve.start_lock").addHandler(waiting)
    server = TritonServer(repository(tmp_path, "pass", failures=0), ready_timeout_s=60)
    held = open(lock_path, "a")  # noqa: SIM115 - closed by the other thread: that releases the lock
    fcntl.flock(held, fcntl.LOCK_EX)
    launched_while_held = []

    def release_once_waited_for() -> None:
        if waiting.event.wait(60):
            launched_while_held.append(server.pid)
        held.close()

    releaser = threading.Thread(target=release_once_waited_for)
    releaser.start()
    try:
        server.start()
        releaser.join(60)
        assert waiting.event.is_set() and launched_while_held == [None]  # nothing launched while the lock was held
        assert server.is_running()
    finally:
        logging.getLogger("tritonforge.serve.start_lock").removeHandler(waiting)
        releaser.join(60)
        held.close()
        server.stop()

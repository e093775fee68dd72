"""The edge to Triton's Python backend: responses carry only the outputs their caller requested, and an
error another model answered keeps its message and its kind.

The 2.51 stub drops unrequested outputs without holding the GIL, which kills it under Python 3.12 (seen with
a BLS call that requests a subset of the engine's outputs), so the adapter must never send them.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.pb_utils_stand_in import FINAL, PB_UTILS_STAND_IN, TritonErrorStandIn
from tritonforge.facts.errors import (
    EngineCallError,
    EngineStreamError,
    QueueFullError,
    RequestError,
    ResponseSendError,
    ServerStopping,
    UnsupportedError,
)
from tritonforge.runtime.triton_adapter import output_tensors, requested_outputs, to_triton_error

OUTPUTS = {"output_ids": np.zeros((1, 1, 2), np.int32), "sequence_length": np.ones((1, 1), np.int32),
           "cum_log_probs": np.zeros((1, 1), np.float32)}


def test_only_the_requested_outputs_are_sent():
    tensors = output_tensors(PB_UTILS_STAND_IN, OUTPUTS, frozenset({"output_ids", "sequence_length"}))
    assert [name for name, _ in tensors] == ["output_ids", "sequence_length"]


def test_every_output_is_sent_when_the_caller_names_none():
    request = SimpleNamespace(requested_output_names=lambda: [])
    tensors = output_tensors(PB_UTILS_STAND_IN, OUTPUTS, requested_outputs(request))
    assert [name for name, _ in tensors] == list(OUTPUTS)


FIRST_BEAT_S = 5  # the first beat is written at once; 5 s only absorbs a loaded machine


def test_a_stub_beats_into_the_supervisors_folder_only_when_asked(tmp_path, monkeypatch):
    import os
    import time

    from tritonforge.facts.environment import HEARTBEAT_DIR_ENV
    from tritonforge.runtime.triton_adapter import start_heartbeat

    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    start_heartbeat()  # no supervisor: nothing is written anywhere
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
    start_heartbeat()
    beat = tmp_path / str(os.getpid())
    deadline = time.monotonic() + FIRST_BEAT_S
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 0 <= time.monotonic() - float(beat.read_text()) < FIRST_BEAT_S  # the stub's clock is this clock


@pytest.mark.parametrize("error, code", [
    (EngineCallError("temperature: must be >= 0, got -1.0"), "INVALID_ARG"),  # the request is at fault
    (EngineCallError("unavailable: the engine queue is full (8 waiting)"), "UNAVAILABLE"),
    (EngineCallError("internal error: KeyError"), "INTERNAL"),
    (EngineCallError("Stub process 'tensorrt_llm_0_0' is not healthy."), "INTERNAL"),  # the engine crashed
    (EngineCallError("note: an answer of no kind we know"), "INTERNAL"),  # never the client's fault by default
    (EngineStreamError("the stream to the engine model 'tensorrt_llm' at localhost:8001 closed"), "UNAVAILABLE")])
def test_an_error_the_engine_answered_the_bls_keeps_its_message_and_gets_its_kind(error, code):
    """Over gRPC the engine's answer carries only its message: its code is read from it, as the gateway does."""
    triton_error = to_triton_error(SimpleNamespace(TritonError=TritonErrorStandIn), error)
    assert (triton_error.message, triton_error.code) == (str(error), code)


@pytest.mark.parametrize("error, code", [
    (RequestError("top_p", "must be in (0, 1], got 1.5"), "INVALID_ARG"),
    (UnsupportedError("beam_width", "beam search is not supported"), "UNSUPPORTED"),
    (QueueFullError(8), "UNAVAILABLE"),
    (ServerStopping(), "UNAVAILABLE"),
    (ResponseSendError(), "INTERNAL")])
def test_our_error_keeps_its_message_and_gets_its_kinds_code(error, code):
    triton_error = to_triton_error(SimpleNamespace(TritonError=TritonErrorStandIn), error)
    assert (triton_error.message, triton_error.code) == (str(error), code)


def test_an_exception_of_no_kind_of_ours_is_internal_and_shows_no_internals():
    triton_error = to_triton_error(SimpleNamespace(TritonError=TritonErrorStandIn), KeyError("/secret/path"))
    assert (triton_error.message, triton_error.code) == ("internal error: KeyError", "INTERNAL")


STUB_EXIT_S = 30  # the stub checks its server every heartbeat (1 s); the rest absorbs a loaded machine


def _alive(pid: int) -> bool:
    """Whether `pid` still runs: an exited process that its adopter has not reaped yet (a zombie) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the parenthesised command name


# A stand-in server: a process that starts the stub (the code in its first argument) as its child, prints the
# stub's pid once the stub printed it, and waits.
STAND_IN_SERVER = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                   "stdout=subprocess.PIPE, text=True); print(child.stdout.readline().strip(), flush=True); "
                   "import time; time.sleep(600)")


def _serve_stub(stub: str, heartbeat_dir: Path):
    """(the stand-in server running `stub`, the stub's pid), the stub told to beat into `heartbeat_dir`."""
    import os
    import subprocess
    import sys

    from tritonforge.facts.environment import HEARTBEAT_DIR_ENV

    env = {**os.environ, HEARTBEAT_DIR_ENV: str(heartbeat_dir)}
    server = subprocess.Popen([sys.executable, "-c", STAND_IN_SERVER, stub], stdout=subprocess.PIPE, text=True,
                              env=env)
    return server, int(server.stdout.readline())


def _assert_ends(stub_pid: int) -> None:
    import time

    deadline = time.monotonic() + STUB_EXIT_S
    while _alive(stub_pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling: the stub is no child of ours to wait for
    assert not _alive(stub_pid), "the stub outlived its server"


def test_a_stub_whose_server_and_folder_are_gone_exits(tmp_path):
    """The server (here a parent process) is killed and its work folder removed: the stub must not live on."""
    import os
    import time

    from tritonforge.facts.environment import HEARTBEAT_PERIOD_S

    folder = tmp_path / "heartbeats"
    folder.mkdir()
    stub = ("import os, sys, time; from tritonforge.runtime.triton_adapter import start_heartbeat; start_heartbeat(); "
            "print(os.getpid(), flush=True); time.sleep(600)")
    parent, stub_pid = _serve_stub(stub, folder)
    try:
        # the folder goes first (a sweep, a cleanup), in one step: the stub writes into it all the while ...
        folder.rename(tmp_path / "swept")
        # ... and the stub beats into nothing for a while: not a synchronisation (a shorter wait only lets the
        # test miss a stub that gives up watching once its folder is gone, never fail a correct one)
        time.sleep(3 * HEARTBEAT_PERIOD_S)
        parent.kill()  # ... then the server dies
        parent.wait()
        _assert_ends(stub_pid)
    finally:
        if _alive(stub_pid):
            os.kill(stub_pid, 9)


class _FailingSender:
    """A response sender whose first `fail` sends raise (the stub out of shared memory), as a stand-in."""

    def __init__(self, fail: int):
        self.fail, self.sent = fail, []

    def send(self, response=None, flags=0):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("no shared memory")
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


ROWS_PB_UTILS = SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL, TritonError=TritonErrorStandIn,
                                InferenceResponse=lambda tensors=None, error=None: SimpleNamespace(error=error))


@pytest.mark.parametrize("failures, ends_with", [(1, "the error"), (2, "the flag alone")])
def test_a_last_response_that_cannot_be_sent_still_ends_the_request(failures, ends_with):
    """A final flag never sent would hold the client's stream open: the failed response is replaced by an
    error, and when even that fails, by the final flag alone."""
    from tritonforge.runtime.triton_adapter import RequestRows

    done = []
    sender = _FailingSender(failures)
    rows = RequestRows(ROWS_PB_UTILS, sender, 1, None, 1.0, on_done=lambda: done.append(True))
    assert rows.send(SimpleNamespace(error=None), row_done=True) is False
    (response, flags), = sender.sent
    assert flags == FINAL and done == [True]
    if ends_with == "the error":
        assert "could not be sent" in response.error.message
    else:
        assert response is None


def test_a_stub_orphaned_before_it_could_watch_its_server_exits_at_once(tmp_path):
    """The server was killed while the stub loaded (its parent is now whoever adopted it): the launcher's
    record of the server's pid tells the stub, which ends instead of holding its memory for ever."""
    import os
    import subprocess
    import sys
    import time

    from tritonforge.facts.environment import HEARTBEAT_DIR_ENV, SERVER_PID_FILE

    folder = tmp_path / "heartbeats"
    folder.mkdir()
    stub = ("from tritonforge.runtime.triton_adapter import start_heartbeat; start_heartbeat(); "
            "import time; time.sleep(60)")
    env = {**os.environ, HEARTBEAT_DIR_ENV: str(folder)}
    (folder / SERVER_PID_FILE).write_text(str(os.getpid()))  # this test is the stub's parent: the server
    kept = subprocess.Popen([sys.executable, "-c", stub], env=env)
    deadline = time.monotonic() + STUB_EXIT_S
    while not (folder / str(kept.pid)).exists():  # its first heartbeat: it checked its parent and serves
        assert kept.poll() is None and time.monotonic() < deadline, "the stub of the recorded server exited"
        time.sleep(0.05)
    (folder / SERVER_PID_FILE).write_text("999999999")  # another server: this stub's parent is not it
    orphan = subprocess.run([sys.executable, "-c", stub], env=env, timeout=STUB_EXIT_S)
    try:
        assert orphan.returncode == 1
        assert kept.poll() is None  # a stub whose parent is the recorded server keeps serving
    finally:
        kept.kill()
        kept.wait()


def test_a_stub_whose_server_dies_while_a_thread_of_it_holds_the_gil_ends(tmp_path):
    """A thread stuck in a call to the dead server with the GIL held (Triton 2.51's `Metric.set`, here libc's
    sleep called through ctypes.PyDLL, which keeps the GIL) stops every Python thread of the stub, its heartbeat
    too: the process that watches the server for the stub ends it."""
    import os

    stub = ("import ctypes, os, threading, time; from tritonforge.runtime.triton_adapter import start_heartbeat; "
            "start_heartbeat(); print(os.getpid(), flush=True); "
            "threading.Thread(target=ctypes.PyDLL(None).sleep, args=(600,)).start(); time.sleep(600)")
    parent, stub_pid = _serve_stub(stub, tmp_path)
    try:
        parent.kill()
        parent.wait()
        _assert_ends(stub_pid)
    finally:
        if _alive(stub_pid):
            os.kill(stub_pid, 9)


class _Clock:
    """triton_adapter's `time`: a clock that moves only when told to, or when slept on."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class _Sender:
    def __init__(self):
        self.sent = []

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


@pytest.fixture
def clock(monkeypatch):
    from tritonforge.runtime import triton_adapter

    clock = _Clock()
    monkeypatch.setattr(triton_adapter, "time", clock)
    return clock


def test_an_error_that_ends_a_request_waits_for_its_last_response_to_pass_the_ensembles_later_steps(clock):
    """Triton 2.51's ensemble stops counting a request's steps once one answers an error: a postprocessing step
    still running a chunk then keeps the ensemble request in flight for ever, and the server's stop waits for it
    until it is killed. The error goes out once the response before it had time to pass postprocessing."""
    from tritonforge.runtime.triton_adapter import ERROR_AFTER_RESPONSE_S, RequestRows

    sender = _Sender()
    rows = RequestRows(PB_UTILS_STAND_IN, sender, 1, None, 1.0)
    assert rows.send(rows.response(OUTPUTS))
    clock.now += 0.25
    assert rows.send(rows.error_response(ServerStopping()), row_done=True)
    assert clock.slept == [ERROR_AFTER_RESPONSE_S - 0.25]
    (first, _), (last, flags) = sender.sent
    assert first.error is None and last.error.code == "UNAVAILABLE" and flags == FINAL


@pytest.mark.parametrize("ending", ["a whole answer", "an error before any response", "an error long after"])
def test_other_last_responses_go_at_once(clock, ending):
    from tritonforge.runtime.triton_adapter import ERROR_AFTER_RESPONSE_S, RequestRows

    sender = _Sender()
    rows = RequestRows(PB_UTILS_STAND_IN, sender, 1, None, 1.0)
    if ending == "a whole answer":
        rows.send(rows.response(OUTPUTS))
        rows.send(rows.response(OUTPUTS), row_done=True)
    elif ending == "an error before any response":
        rows.send(rows.error_response(QueueFullError(8)), row_done=True)
    else:
        rows.send(rows.response(OUTPUTS))
        clock.now += ERROR_AFTER_RESPONSE_S
        rows.send(rows.error_response(ServerStopping()), row_done=True)
    assert sum(clock.slept) == 0 and sender.sent[-1][1] == FINAL

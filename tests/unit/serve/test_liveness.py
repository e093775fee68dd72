"""Liveness probes: which models get one, and a model that never answers is called wedged (a listening socket
that accepts and answers nothing stands in for a wedged server: the real one is tested in test_faults)."""

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tritonforge.serve.liveness import LivenessProbes, probed_models
from tritonforge.serve.server import TritonServer
from tritonforge.serve.supervisor import Supervisor, _alive

SOURCE_REPOSITORY = Path(__file__).resolve().parents[3]  # the committed config.pbtxt of every model
MODELS = ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm_bls"]
WEDGED_AFTER_S = 1
NOTICE_S = 9  # a probe is wedged exactly WEDGED_AFTER_S after it was sent; the rest absorbs a loaded machine


def test_each_python_model_with_a_probe_of_its_own_transaction_policy_is_probed(tmp_path):
    for model in MODELS:
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.pbtxt").write_text((SOURCE_REPOSITORY / model / "config.pbtxt").read_text())
    assert probed_models(tmp_path, MODELS) == ["postprocessing", "preprocessing", "tensorrt_llm_bls"]
    # deployed non-decoupled (--no-streaming), the BLS has no stream to probe it with
    bls = tmp_path / "tensorrt_llm_bls" / "config.pbtxt"
    bls.write_text(bls.read_text().replace("decoupled: true", "decoupled: false"))
    assert probed_models(tmp_path, MODELS) == ["postprocessing", "preprocessing"]


def test_a_model_that_never_answers_is_wedged_once_its_probe_is_older_than_the_limit():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        probes = LivenessProbes(f"127.0.0.1:{silent.getsockname()[1]}", ["preprocessing", "tensorrt_llm_bls"],
                                period_s=0.1, wedged_after_s=WEDGED_AFTER_S).start()
        try:
            assert probes.wedged() == []
            deadline = started + WEDGED_AFTER_S + NOTICE_S
            while len(probes.wedged()) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)  # polling the probes' state, which no event announces
            wedged_at = time.monotonic()
            assert probes.wedged() == ["preprocessing", "tensorrt_llm_bls"]
            # never before its limit: a probe is wedged only once it is WEDGED_AFTER_S old
            assert wedged_at - started >= WEDGED_AFTER_S
            # and for good: a probe that timed out is never sent again (a next answer would hide the wedge)
            for thread in probes._threads:
                thread.join(timeout=WEDGED_AFTER_S + NOTICE_S)
                assert not thread.is_alive(), f"{thread.name} probes again after its probe timed out"
            assert probes.wedged() == ["preprocessing", "tensorrt_llm_bls"]
        finally:
            probes.stop()


def test_a_negative_wedge_limit_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--wedged-after-s"):
        Supervisor(TritonServer(tmp_path), wedged_after_s=-1)
    Supervisor(TritonServer(tmp_path), wedged_after_s=0)  # 0 turns the checks off


@pytest.mark.parametrize("period", [0, -1])
def test_a_probe_period_that_is_not_positive_is_refused(tmp_path, period):
    with pytest.raises(ValueError, match="probe period must be > 0"):
        Supervisor(TritonServer(tmp_path), probe_period_s=period)


def test_a_stub_killed_and_not_yet_reaped_counts_as_dead():
    """A killed stub stays a zombie until the server reaps it: its pid still exists, its process does not."""
    stub = subprocess.Popen(["sleep", "60"])
    try:
        assert _alive(stub.pid)
        stub.kill()
        os.waitid(os.P_PID, stub.pid, os.WEXITED | os.WNOWAIT)  # it died; left unreaped: a zombie
        assert not _alive(stub.pid)
    finally:
        stub.kill()
        stub.wait()


def test_a_probe_is_wedged_exactly_when_it_is_as_old_as_the_limit(monkeypatch):
    """The edge of `wedged()` on a scripted clock: a probe sent at 10 s with a 2 s limit is wedged from 12 s."""
    from tritonforge.serve import liveness

    clock = [0.0]
    monkeypatch.setattr(liveness.time, "monotonic", lambda: clock[0])
    probes = LivenessProbes("127.0.0.1:1", ["preprocessing", "tensorrt_llm_bls"], period_s=0.1, wedged_after_s=2)
    probes._asked["preprocessing"] = 10.0  # its probe went out at 10 s and is unanswered; the other's was answered
    for now, wedged in [(11.9, []), (12.0, ["preprocessing"]), (30.0, ["preprocessing"])]:
        clock[0] = now
        assert probes.wedged() == wedged, now


def test_a_stub_whose_heartbeat_is_older_than_the_limit_is_silent_and_a_zero_limit_reads_none(tmp_path):
    server = TritonServer(tmp_path)
    server.heartbeat_dir = tmp_path  # each stub's last beat (time.monotonic()) in a file named by its pid
    (tmp_path / "41").write_text(str(time.monotonic() - 10))
    (tmp_path / "42").write_text(str(time.monotonic()))
    for limit, silent in [(5, ["preprocessing"]), (0, [])]:
        supervisor = Supervisor(server, wedged_after_s=limit)
        supervisor.stubs = {41: "preprocessing", 42: "postprocessing"}
        assert supervisor._silent_stubs() == silent, limit

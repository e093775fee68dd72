"""A load that Triton 2.51's Python backend wedges (a stub that misses its health check while its model
initializes is waited for forever) is found and started once more, on a real tritonserver. The stand-in for
a starved stub is a model that stops itself (SIGSTOP) in `initialize`: its health thread stops with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.serve.server import StubLaunchWedged, TritonServer

MODEL = "stops_in_initialize"
# Stops its stub in `initialize` as many times as the count in STOPS_FILE says, one fewer each load.
MODEL_PY = '''
import os
import signal
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        stops = Path(args["model_repository"]).parents[1] / "stops"
        left = int(stops.read_text())
        if left > 0:
            stops.write_text(str(left - 1))
            os.kill(os.getpid(), signal.SIGSTOP)

    def execute(self, requests):
        return []
'''


def repository(tmp_path: Path, stops: int) -> Path:
    root = tmp_path / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    config = mc.ModelConfig(name=MODEL, backend="python", max_batch_size=0)
    config.input.add(name="IN", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="OUT", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    (root / MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    (tmp_path / "stops").write_text(str(stops))
    return root


def test_a_wedged_load_is_killed_and_the_second_start_serves(tmp_path):
    server = TritonServer(repository(tmp_path, stops=1), ready_timeout_s=60)
    try:
        server.start()
        assert server.is_running() and (tmp_path / "stops").read_text() == "0"
    finally:
        server.stop()


def test_a_load_wedged_twice_fails_naming_the_model(tmp_path):
    with pytest.raises(StubLaunchWedged, match=f"^the load of {MODEL} is wedged: its stub missed"):
        TritonServer(repository(tmp_path, stops=2), ready_timeout_s=60).start()
    assert (tmp_path / "stops").read_text() == "0"  # both loads stopped: the second start was made

"""Stops between the instances of one engine model: Triton hands a `stop` to any instance, and the board lets it
reach the instance that runs the request it names."""

import time
from types import SimpleNamespace

import pytest
from google.protobuf import json_format

from tests.unit.runtime.engine.test_engine_metrics import Family
from tests.unit.runtime.engine.test_engine_responses import inputs
from tests.unit.runtime.engine.test_engine_thread_faults import PB_UTILS_STAND_IN, Request, Sender
from tritonforge.builder import model_configs as configs
from tritonforge.facts.contract import stop_request_inputs
from tritonforge.facts.environment import HEARTBEAT_DIR_ENV
from tritonforge.facts.limits import EngineLimits
from tritonforge.facts.model_parameters import EngineParameters
from tritonforge.runtime.engine import stop_board
from tritonforge.runtime.engine.replay.engine import ReplayEngine
from tritonforge.runtime.engine.service import EngineModel, EngineService, EngineSettings
from tritonforge.runtime.engine.stop_board import StopBoard

PERIOD_S = 0.1  # the engine model's cancellation check period
STOP_TAKES_S = 3.0  # generous for a stop read within a period or two of 2 ms steps, on a shared CI machine


def instance(board: StopBoard | None) -> EngineService:
    """One instance of the engine model: its own engine, 2 ms a step (5000 tokens take 10 s)."""
    limits = EngineLimits(max_batch_size=4, max_input_len=8, max_seq_len=10_000)
    engine = ReplayEngine(list(range(10, 50)), step_ms=2, limits=limits, vocab_size=100)
    return EngineService(PB_UTILS_STAND_IN, EngineSettings(limits=limits, response_lanes=0), engine, board)


def stopped_elsewhere(folder, *, shared: bool) -> tuple[bool, int, bool]:
    """A long stream on one instance and its stop sent to another: whether the stream ended (before the
    instances shut down), the responses it got, and whether the stop was answered."""
    running, other = (instance(StopBoard(folder, PERIOD_S) if shared else None) for _ in range(2))
    stream, stop = Sender(), Sender()
    try:
        running.handle(Request("r-1", stream, inputs=inputs(5000, stream=True)))
        time.sleep(0.2)
        other.handle(Request("r-1", stop, inputs=stop_request_inputs()))
        ended = stream.final.wait(STOP_TAKES_S)
        return ended, len(stream.sent), stop.final.wait(STOP_TAKES_S)
    finally:
        running.shutdown()
        other.shutdown()


def test_a_stop_that_another_instance_takes_ends_the_row_long_before_its_end(tmp_path):
    ended, responses, answered = stopped_elsewhere(tmp_path / "board", shared=True)
    assert ended and responses < 5000
    assert answered  # by the instance that took it


def test_without_a_board_a_stop_taken_by_another_instance_misses_the_row(tmp_path):
    """Why the board: Triton routes the stop to any instance."""
    ended, _, answered = stopped_elsewhere(tmp_path / "board", shared=False)
    assert answered and not ended


def test_a_stop_posted_before_a_request_arrived_does_not_stop_it(tmp_path):
    """A request id used again after its stop: the old stop names the earlier request."""
    board, reader = StopBoard(tmp_path, PERIOD_S), StopBoard(tmp_path, PERIOD_S)
    board.post("again")
    arrived = time.time_ns()
    assert reader.stopped("again", 0) and not reader.stopped("again", arrived)
    assert not reader.stopped("another", 0)


def test_a_board_reads_the_folder_at_most_once_a_period(tmp_path):
    board, reader = StopBoard(tmp_path, 3600), StopBoard(tmp_path, 3600)
    assert not reader.stopped("late", 0)
    board.post("late")
    assert not reader.stopped("late", 0)  # read again only after the period


def test_stops_kept_past_their_time_are_removed_by_the_next_post(tmp_path, monkeypatch):
    board = StopBoard(tmp_path, PERIOD_S)
    board.post("old")
    monkeypatch.setattr(stop_board, "KEPT_S", 0.0)
    time.sleep(0.01)
    board.post("new")
    assert [name.split(".")[0] for name in sorted(p.name for p in tmp_path.iterdir())] == [
        stop_board._digest("new")]


def test_the_instances_of_one_model_share_one_board_and_other_models_have_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(stop_board.tempfile, "gettempdir", lambda: str(tmp_path))
    first, second = (StopBoard.for_model(str(tmp_path / "repo" / "tensorrt_llm"), PERIOD_S) for _ in range(2))
    other = StopBoard.for_model(str(tmp_path / "elsewhere" / "tensorrt_llm"), PERIOD_S)
    assert first.folder == second.folder != other.folder


class _ReplayModel(EngineModel):
    PB_UTILS = SimpleNamespace(**vars(PB_UTILS_STAND_IN), MetricFamily=Family)
    PARAMETERS = EngineParameters

    def make_engine(self, args, parameters, settings):
        return ReplayEngine(list(range(10, 50)), step_ms=2, limits=settings.limits, vocab_size=100)


@pytest.mark.parametrize("serving, several", [(configs.ServingConfig(engine_gpus=(0, 1)), True),
                                              (configs.ServingConfig(), False)])
def test_an_engine_model_of_several_instances_shares_its_stops_and_labels_its_series(
        tmp_path, monkeypatch, serving, several):
    monkeypatch.setattr(stop_board.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    parameters = EngineParameters(max_batch_size=4, max_input_len=8, max_seq_len=64).to_config()
    config = configs.engine_config(serving, backend="python", parameters=parameters)
    model = _ReplayModel()
    model.initialize({"model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
                      "model_instance_kind": "GPU" if several else "CPU", "model_instance_device_id": "1",
                      "model_instance_name": "tensorrt_llm_0_1", "model_repository": str(tmp_path / "tensorrt_llm"),
                      "model_name": "tensorrt_llm", "model_version": "1"})
    try:
        labels = model.service.metrics.requests["active"].labels
        assert (model.service.stop_board is not None) is several
        assert ("model_instance" in labels) is several
    finally:
        model.finalize()

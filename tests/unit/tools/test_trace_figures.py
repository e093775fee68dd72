"""bench/trace.py over a trace file in Triton's format (entries as tritonserver 2.51 writes them: a trace's
model in one entry, its timestamps in others, composing models' traces naming their ensemble's as parent)."""

import importlib.util
import json
from pathlib import Path

import pytest

TRACE_SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "trace.py"


@pytest.fixture(scope="module")
def trace():
    spec = importlib.util.spec_from_file_location("bench_trace", TRACE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entries(trace_id, model, stamps_ms, parent=None, request_id="7"):
    head = {"id": trace_id, "model_name": model, "model_version": 1, "request_id": request_id}
    if parent is not None:
        head["parent_id"] = parent
    return [head, {"id": trace_id, "timestamps": [{"name": name, "ns": int(ms * 1e6)} for name, ms in stamps_ms]}]


def step(start_ms, queue_ms, compute_ms):
    done = start_ms + queue_ms + compute_ms
    return [("REQUEST_START", start_ms), ("QUEUE_START", start_ms), ("COMPUTE_START", start_ms + queue_ms),
            ("COMPUTE_OUTPUT_START", done), ("COMPUTE_END", done), ("REQUEST_END", done)]


def streamed_ensemble(trace_id, sends_ms):
    """An ensemble request read at 0 ms: preprocessing 0.1-1.1, engine from 1.2, first postprocessing at 5 ms
    (its later chunks' postprocessing at 9 ms), first response sent at `sends_ms[0]`."""
    own = [("GRPC_WAITREAD_END", 0), ("REQUEST_START", 0.01)] + [("GRPC_SEND_START", ms) for ms in sends_ms]
    return (entries(trace_id, "ensemble", own)
            + entries(trace_id + 1, "preprocessing", step(0.1, 0.2, 0.8), parent=trace_id)
            + entries(trace_id + 2, "tensorrt_llm", step(1.2, 0.0, 0.01), parent=trace_id)
            + entries(trace_id + 4, "postprocessing", step(9.0, 1.0, 1.0), parent=trace_id)
            + entries(trace_id + 3, "postprocessing", step(5.0, 1.0, 0.5), parent=trace_id))


def test_the_ensemble_stages_follow_the_first_chunk_and_add_up_to_its_send(trace, tmp_path):
    file = tmp_path / "t.json"
    (tmp_path / "t.json.0").write_text(json.dumps(streamed_ensemble(10, [12.0, 20.0])))
    paths = trace.timelines(*trace.load(file))
    stages = trace.stage_figures(paths["ensemble"], trace.ENSEMBLE_STAGES)["stages"]
    figures = {row["stage"]: row["p50_ms"] for row in stages}
    assert figures["preprocessing queue"] == pytest.approx(0.2)
    assert figures["engine to first response"] == pytest.approx(5.0 - 1.2)  # the earlier postprocessing request
    assert figures["postprocessing execution"] == pytest.approx(0.5)
    assert figures["response out of postprocessing to gRPC send"] == pytest.approx(12.0 - 6.5)
    assert figures["read to first response sent"] == pytest.approx(12.0)


def test_non_streamed_requests_and_the_bls_engine_calls_are_kept_apart(trace, tmp_path):
    direct = entries(1, "tensorrt_llm", [("REQUEST_START", 0), ("COMPUTE_START", 0.5), ("GRPC_SEND_START", 4.0),
                                         ("GRPC_SEND_START", 8.0)])
    bls_call = entries(2, "tensorrt_llm", [("REQUEST_START", 0), ("COMPUTE_START", 0.1), ("GRPC_SEND_START", 9.0),
                                           ("GRPC_SEND_START", 13.0)], request_id="ab" * 16)
    answered_once = streamed_ensemble(20, [30.0])  # a non-streamed request: its one send is its end
    (tmp_path / "t.json.0").write_text(json.dumps(direct + bls_call))
    (tmp_path / "t.json.1").write_text(json.dumps(answered_once))
    paths = trace.timelines(*trace.load(tmp_path / "t.json"))
    assert [len(paths[name]) for name in ("direct", "bls engine calls", "ensemble")] == [1, 1, 0]
    assert paths["direct"][0]["send"] - paths["direct"][0]["read"] == 4_000_000

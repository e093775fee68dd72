"""The tensorrtllm backend's gauges as our engine steps publish them, from an engine's stats: what dashboards and
autoscalers read (`nv_trt_llm_request_metrics`, `nv_trt_llm_kv_cache_block_metrics`)."""

from __future__ import annotations

from types import SimpleNamespace

from tritonforge.runtime.engine.generation import EngineStats
from tritonforge.runtime.engine.metrics import EngineMetrics


class Family:
    """A stand-in for pb_utils.MetricFamily: keeps each metric's labels and last value."""

    GAUGE = "gauge"

    def __init__(self, name, description, kind):
        self.name, self.metrics = name, []

    def Metric(self, labels):  # noqa: N802 - pb_utils' name
        metric = SimpleNamespace(labels=labels, value=None)
        metric.set = lambda value: setattr(metric, "value", value)
        self.metrics.append(metric)
        return metric


def test_the_gauges_follow_the_engines_stats():
    engine = SimpleNamespace(stats=EngineStats())
    metrics = EngineMetrics(SimpleNamespace(MetricFamily=Family), engine, model="tensorrt_llm", version="1",
                            max_batch_size=4, max_seq_len=64, period_s=3600)  # updated here, by hand
    try:
        engine.stats = EngineStats(waiting=3, scheduled=2, context=1, kv_tokens=70)
        metrics.update()
        requests = {kind: metric.value for kind, metric in metrics.requests.items()}
        blocks = {kind: metric.value for kind, metric in metrics.blocks.items()}
    finally:
        metrics.stop()
    # active: queued and running alike, as the backend counts them
    assert requests == {"waiting": 3, "scheduled": 2, "context": 1, "active": 5, "max": 4}
    # 32-token blocks: 4 sequences of 64 tokens take 8 blocks at most; 70 tokens fill 3 of them
    assert blocks == {"tokens_per": 32, "max": 8, "used": 3, "free": 5, "fraction": 3 / 8}
    assert metrics.requests["active"].labels == {"model": "tensorrt_llm", "version": "1", "request_type": "active"}


def test_each_instance_of_an_engine_on_several_gpus_publishes_series_of_its_own():
    engine = SimpleNamespace(stats=EngineStats())
    metrics = EngineMetrics(SimpleNamespace(MetricFamily=Family), engine, model="tensorrt_llm", version="1",
                            max_batch_size=4, max_seq_len=64, instance="tensorrt_llm_0_1", period_s=3600)
    metrics.stop()
    assert metrics.blocks["used"].labels == {"model": "tensorrt_llm", "version": "1",
                                             "model_instance": "tensorrt_llm_0_1", "kv_cache_block_type": "used"}

"""The `tensorrtllm` backend's Prometheus families, published by our Python engine steps on Triton's
`/metrics` (the Python backend's custom metrics), so dashboards and autoscalers read the same series
whichever engine serves.

- `nv_trt_llm_request_metrics{request_type}`: `waiting` (queued), `scheduled` (running), `context`
  (prefilled in the last step), `active` (waiting + running), `max` (max_batch_size);
- `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`: `tokens_per` (32, trtllm-build's block), `max`
  (blocks for max_batch_size sequences of max_seq_len), `used` (blocks the running sequences fill), `free`,
  `fraction` (used / max).

Every series also carries `model` and `version`, as the backend's do; an engine model of several instances (the
transformers engine on several GPUs) adds `model_instance`, one series each. The transformers engine keeps one
contiguous cache per sequence, not a paged one: its block figures are the paged cache's equivalent.
Updated every `stats_check_period_ms` (100 ms, the backend parameter of the same name) by a thread.
"""

from __future__ import annotations

import math
import threading

from ...facts.release import TOKENS_PER_BLOCK

REQUEST_TYPES = ("waiting", "scheduled", "context", "active", "max")
KV_BLOCK_TYPES = ("tokens_per", "max", "used", "free", "fraction")


class EngineMetrics:
    def __init__(self, pb_utils, engine, *, model: str, version: str, max_batch_size: int, max_seq_len: int,
                 instance: str | None = None, period_s: float = 0.1):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_blocks = max_batch_size * math.ceil(max_seq_len / TOKENS_PER_BLOCK)
        gauge = pb_utils.MetricFamily.GAUGE
        requests = pb_utils.MetricFamily(name="nv_trt_llm_request_metrics", description="TRT LLM request metrics",
                                         kind=gauge)
        blocks = pb_utils.MetricFamily(name="nv_trt_llm_kv_cache_block_metrics",
                                       description="TRT LLM KV cache block metrics", kind=gauge)
        labels = {"model": model, "version": version, **({"model_instance": instance} if instance else {})}
        self.requests = {kind: requests.Metric(labels={**labels, "request_type": kind}) for kind in REQUEST_TYPES}
        self.blocks = {kind: blocks.Metric(labels={**labels, "kv_cache_block_type": kind}) for kind in KV_BLOCK_TYPES}
        self._families = (requests, blocks)  # kept alive as long as their metrics
        self._stop = threading.Event()
        self._period_s = period_s
        self._thread = threading.Thread(target=self._run, name="engine-metrics", daemon=True)
        self.update()
        self._thread.start()

    def values(self) -> tuple[dict[str, float], dict[str, float]]:
        stats = self.engine.stats
        used = math.ceil(stats.kv_tokens / TOKENS_PER_BLOCK)
        return ({"waiting": stats.waiting, "scheduled": stats.scheduled, "context": stats.context,
                 "active": stats.waiting + stats.scheduled, "max": self.max_batch_size},
                {"tokens_per": TOKENS_PER_BLOCK, "max": self.max_blocks, "used": used,
                 "free": max(self.max_blocks - used, 0), "fraction": used / self.max_blocks})

    def update(self) -> None:
        requests, blocks = self.values()
        for kind, value in requests.items():
            self.requests[kind].set(value)
        for kind, value in blocks.items():
            self.blocks[kind].set(value)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.update()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

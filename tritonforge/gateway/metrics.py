"""The OpenAI gateway's Prometheus metrics (prometheus_client), exported on its `/metrics`.

| metric | type | what |
|---|---|---|
| `tritonforge_requests_total{endpoint, status, model}` | counter | finished requests by HTTP status and model |
| `tritonforge_requests_in_flight` | gauge | requests being answered now |
| `tritonforge_time_to_first_token_seconds` | histogram | request received → first text chunk |
| `tritonforge_inter_token_latency_seconds` | histogram | between consecutive text chunks of a stream |
| `tritonforge_prompt_tokens_total{model}`, `tritonforge_completion_tokens_total{model}` | counter | tokens |

`model` is the served model's name or the LoRA adapter's a request named (a request refused before its model
was read counts under the served model's).

Triton 2.51 itself has no time-to-first-token histogram; these are measured where the client sees them.
With several gateway worker processes (`tritonforge openai --workers N`), each writes its values into the
folder named by `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode) and `/metrics`, whichever
worker answers it, reports the sum over all of them.
"""

from __future__ import annotations

import os
import time

from .protocol import usage

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name for it

TTFT_METRIC = "tritonforge_time_to_first_token_seconds"
ITL_METRIC = "tritonforge_inter_token_latency_seconds"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


def forget_worker(pid: int) -> None:
    """A dead worker's live gauges (requests in flight) leave the sum; its counters and histograms stay."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)


class GatewayMetrics:
    def __init__(self, served_model_name: str):
        self.served_model_name = served_model_name
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("tritonforge_requests", "Finished requests by endpoint, HTTP status and model",
                                ["endpoint", "status", "model"], registry=self.registry)
        self.in_flight = Gauge("tritonforge_requests_in_flight", "Requests being answered now",
                               registry=self.registry, multiprocess_mode="livesum")
        self.ttft = Histogram(TTFT_METRIC, "Request received to first text chunk",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram(ITL_METRIC, "Time between text chunks of a stream",
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("tritonforge_prompt_tokens", "Prompt tokens of finished requests",
                                     ["model"], registry=self.registry)
        self.completion_tokens = Counter("tritonforge_completion_tokens", "Generated tokens of finished requests",
                                         ["model"], registry=self.registry)

    @property
    def content_type(self) -> str:
        from prometheus_client import CONTENT_TYPE_LATEST

        return CONTENT_TYPE_LATEST

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        if not os.environ.get(MULTIPROCESS_DIR_ENV):
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        multiprocess.MultiProcessCollector(every_worker)
        return generate_latest(every_worker)

    def timer(self) -> _ChunkTimer:
        """A request starts generating: it is in flight until `request_done(..., started=True)`."""
        self.in_flight.inc()
        return _ChunkTimer(self)

    def request_done(self, endpoint: str, status: int, generations=None, *, started: bool = True,
                     model: str | None = None) -> None:
        """One request for `model` (None: the served model) ended with `status`; its tokens counted from its
        choices' `generations` (`usage`)."""
        model = model or self.served_model_name
        self.requests.labels(endpoint=endpoint, status=str(status), model=model).inc()
        if started:
            self.in_flight.dec()
        if generations:
            counted = usage(generations)
            self.prompt_tokens.labels(model=model).inc(counted["prompt_tokens"])
            self.completion_tokens.labels(model=model).inc(counted["completion_tokens"])


class _ChunkTimer:
    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics
        self.started = self.last = time.perf_counter()
        self.chunks = 0

    def chunk(self) -> None:
        now = time.perf_counter()
        if self.chunks == 0:
            self.metrics.ttft.observe(now - self.started)
        else:
            self.metrics.itl.observe(now - self.last)
        self.chunks += 1
        self.last = now

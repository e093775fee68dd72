"""The chart's serving pod run as a kubelet runs it, against a real tritonserver, scraped by a real Prometheus.

The container's command and environment are taken from the rendered Deployment (the API key resolved from the
rendered Secret, as the kubelet resolves a secretKeyRef) and started as they are; its startup, readiness and
liveness probes are run as the kubelet runs them (httpGet on a named port, exec with its timeout, each at its
period up to its failure threshold). A real Prometheus scrapes the pod's two metrics ports with the labels a
PodMonitor adds and evaluates the chart's recording rules, and the HPA's signal (prometheus-adapter's query) is
read from it while requests queue for the engine's slots."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml

from tritonforge.builder.build import BuildOptions, build
from tritonforge.serve.ports import free_port
from tritonforge.serve.processes import all_stub_pids

from ..deploy.chart import CHART, NAMESPACE, RECORDING_RULES, render
from ..deploy.prometheus import adapter_metrics_query, adapter_rule, tool
from .conftest import MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving
from .kubelet import Pod

pytest.importorskip("helm_python", reason="helm-python-sdk (Helm's Go library for Python) is not installed: "
                                          "pip install -e .[test]")
pytestmark = pytest.mark.integration

KEY = "sk-pod-test"
POD = "llm-tritonforge-7c9d4-x2k8p"
SLOTS = 2  # the engine's batch: every stream past it waits, and shows in the HPA's signal
# A tiny model's stream of LONG_TOKENS lasts ~1.5 s on the CPU machine: 24 streams through 2 slots keep a queue
# for ~15 s, scraped every second, and more than QUEUED wait for the first half of it.
STREAMS = 24
QUEUED = 8
LONG_TOKENS = MAX_SEQ_LEN - MAX_INPUT_LEN - 8
SCRAPE_S = 1
# The supervisor's restart after a killed stub: ~15 s on an idle 2-core machine, 60-80 s while it runs other
# suites; the waits end at their event, so the wide bound costs a passing run nothing.
RESTART_S = 180
PROMETHEUS_DEADLINE_S = 60  # for a series to reach Prometheus through scrapes and rule evaluations every second
# A rolling update's termination under streams: 24 of TERMINATION_TOKENS through 2 slots answer for ~12 s on an
# idle 2-core machine, past the 10 s that open streams used to get after SIGTERM, and ~95 s on a slower machine
# running the rest of the suite (18 of 24 had ended at 70 s). A grace period of GRACE_S leaves them 160 s
# (GRACE_S - preStop 5 s - margin 5 s - reserve 10 s); serve exits once they end, so a passing run waits no longer.
TERMINATION_STREAMS = 24
TERMINATION_TOKENS = LONG_TOKENS // 2
GRACE_S = 180


class Prometheus:
    """A real Prometheus scraping the pod's metrics ports with the labels a PodMonitor adds, evaluating the
    chart's recording rules every second."""

    def __init__(self, pod: Pod, work_dir: Path):
        rules = yaml.safe_load(RECORDING_RULES.read_text())
        for group in rules["groups"]:
            group["interval"] = f"{SCRAPE_S}s"
        (work_dir / "rules.yaml").write_text(yaml.safe_dump(rules))
        labels = {"namespace": NAMESPACE, "pod": POD, "container": "tritonforge"}
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(work_dir / "rules.yaml")],
            "scrape_configs": [
                {"job_name": "triton", "static_configs": [{"targets": [f"127.0.0.1:{pod.ports['metrics']}"],
                                                           "labels": labels}]},
                {"job_name": "gateway", "authorization": {"type": "Bearer", "credentials": KEY},
                 "static_configs": [{"targets": [f"127.0.0.1:{pod.ports['openai']}"], "labels": labels}]},
            ],
        }
        (work_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = work_dir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [tool("prometheus"), f"--config.file={work_dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work_dir / 'data'}", f"--web.listen-address={self.url[7:]}"],
                stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + PROMETHEUS_DEADLINE_S
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            assert self.process.poll() is None, self.log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus never became ready"
            time.sleep(0.2)

    def query(self, expr: str) -> dict[str, float]:
        """Instant query: {a label of each series (pod, job, or the whole label set): value}."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            result = json.load(response)["data"]["result"]
        return {r["metric"].get("pod", r["metric"].get("job", json.dumps(r["metric"]))): float(r["value"][1])
                for r in result}

    def wait_for(self, expr: str, condition, what: str) -> dict[str, float]:
        deadline = time.monotonic() + PROMETHEUS_DEADLINE_S
        while True:
            values = self.query(expr)
            if condition(values):
                return values
            assert time.monotonic() < deadline, f"{what}: {expr} = {values}"
            time.sleep(SCRAPE_S / 2)  # the next scrape or rule evaluation

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def pod(tiny_models, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("pod")
    repository = build(BuildOptions(model=tiny_models["bpe"], output=work_dir / "models", max_input_len=MAX_INPUT_LEN,
                                    max_seq_len=MAX_SEQ_LEN, max_batch_size=SLOTS,
                                    serving=lean_serving()))
    values = {
        "repository": {"source": "pvc", "pvc": {"claimName": "models"}, "mountPath": str(repository)},
        "ports": {name: free_port() for name in ("http", "grpc", "metrics", "openai")},
        "apiKey": {"value": KEY},
        # Probed every second here, so that the tests wait seconds, not the defaults' tens of seconds.
        "probes": {"startup": {"periodSeconds": 1, "failureThreshold": 300},
                   "readiness": {"periodSeconds": 1, "timeoutSeconds": 3, "failureThreshold": 2},
                   "liveness": {"timeoutS": 20, "periodSeconds": 1, "failureThreshold": 3}},
        "monitoring": {"prometheusRule": {"enabled": True}},
        "terminationGracePeriodSeconds": GRACE_S,
    }
    manifests = render(values)
    pod = Pod(manifests, work_dir)
    pod.start()
    yield pod
    # The kubelet's stop: SIGTERM, SIGKILL after the grace period. Exit status 0 means it stopped by itself.
    stopped_in = pod.terminate()
    assert pod.process.returncode == 0, f"exit {pod.process.returncode} after {stopped_in:.1f} s:\n{pod.log()}"


def _client(pod: Pod, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{pod.ports['openai']}/v1", api_key=key, max_retries=0)


def test_the_pod_goes_ready_and_live_and_serves_the_keyed_openai_api(pod):
    pod.wait_until("startupProbe", True)
    assert pod.probe("readinessProbe") and pod.probe("livenessProbe")
    answer = _client(pod).completions.create(model="tritonforge", prompt="The server", max_tokens=4)
    assert answer.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        _client(pod, "sk-not-it").models.list()


def test_prometheus_sees_the_hpas_signal_rise_while_requests_queue_and_fall_when_they_are_cancelled(pod, tmp_path):
    pod.wait_until("startupProbe", True)  # whichever test runs first: readiness is probed only after startup
    pod.wait_until("readinessProbe", True)
    prometheus = Prometheus(pod, tmp_path)
    try:
        prometheus.wait_for('sum by (job) (up)', lambda up: up == {"triton": 1.0, "gateway": 1.0}, "both ports scraped")
        signal_query = adapter_metrics_query(adapter_rule("tritonforge_engine_waiting_requests"), NAMESPACE, [POD])
        assert prometheus.query(signal_query) == {POD: 0.0}
        # Raw connections, so that each can be dropped at any time, even one still queued for a slot.
        body = json.dumps({"model": "tritonforge", "prompt": "The server", "stream": True,
                           "max_tokens": LONG_TOKENS, "min_tokens": LONG_TOKENS})
        connections = []
        for _ in range(STREAMS):
            connection = http.client.HTTPConnection("127.0.0.1", pod.ports["openai"], timeout=60)
            connection.request("POST", "/v1/completions", body=body,
                               headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            connections.append(connection)
        waiting = prometheus.wait_for(signal_query, lambda v: v.get(POD, 0) >= QUEUED,
                                      "the queued requests never showed in the HPA's signal")
        recorded = prometheus.wait_for("tritonforge:engine_waiting_requests:sum",
                                       lambda v: v.get(POD, 0) >= QUEUED, "the recording rule never did")
        # What the HPA would do with it, from one replica: desired = ceil(replicas × metric / target).
        target = float(yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]["targetAverageValue"])
        assert math.ceil(1 * waiting[POD] / target) > 1 and recorded[POD] >= QUEUED
        for connection in connections:
            connection.close()  # the clients go away: the gateway cancels each generation
        prometheus.wait_for("tritonforge:engine_scheduled_requests:sum + tritonforge:engine_waiting_requests:sum",
                            lambda v: v.get(POD) == 0.0, "the dropped streams kept the engine's slots")
        # The gateway's port, scraped with the key: its TTFT histogram counts the requests so far.
        prometheus.wait_for("sum(tritonforge_time_to_first_token_seconds_count)", lambda v: sum(v.values()) >= 1,
                            "the gateway's histogram was not scraped")
    finally:
        prometheus.stop()


def test_a_killed_engine_stub_fails_the_probes_until_the_supervisor_has_the_pod_serving_again(pod):
    pod.wait_until("startupProbe", True)
    pod.wait_until("readinessProbe", True)
    engine = next(pid for pid, model in all_stub_pids(pod.process.pid).items() if model == "tensorrt_llm")
    os.kill(engine, signal.SIGKILL)
    pod.wait_until("readinessProbe", False, budget_s=RESTART_S)  # out of the Service's endpoints
    assert not pod.probe("livenessProbe")
    pod.wait_until("readinessProbe", True, budget_s=RESTART_S)
    assert pod.probe("livenessProbe")
    assert _client(pod).completions.create(model="tritonforge", prompt="Again", max_tokens=2).usage.completion_tokens


def test_a_pods_termination_lets_the_answers_in_flight_finish_whole(pod):
    """A rolling update stops the pod as the kubelet does (the preStop sleep, SIGTERM, SIGKILL at the end of the
    grace period): every stream under way, the queued ones included, ends whole, though they take far longer than
    the 10 s open streams used to get, and serve exits by itself within the grace period. Runs last: it ends the
    module's pod."""
    import threading

    pod.wait_until("startupProbe", True)
    pod.wait_until("readinessProbe", True, budget_s=RESTART_S)
    # The pod's log from here on: the module's stub kill and the supervisor's restart came before, and are not this
    # test's to report.
    log_start = pod.log_size()
    answers: list[dict] = [{} for _ in range(TERMINATION_STREAMS)]
    first_chunk = threading.Event()

    def stream(answer: dict) -> None:
        try:
            chunks = _client(pod).completions.create(
                model="tritonforge", prompt="The server", max_tokens=TERMINATION_TOKENS, stream=True,
                stream_options={"include_usage": True}, extra_body={"min_tokens": TERMINATION_TOKENS},
                timeout=GRACE_S)
            for chunk in chunks:
                first_chunk.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    answer["finish_reason"] = chunk.choices[0].finish_reason
                if chunk.usage:
                    answer["tokens"] = chunk.usage.completion_tokens
        except Exception as error:  # noqa: BLE001 - the outcome under test
            answer["error"] = repr(error)

    threads = [threading.Thread(target=stream, args=(answer,), daemon=True) for answer in answers]
    for thread in threads:
        thread.start()
    assert first_chunk.wait(RESTART_S), answers
    took = pod.terminate()
    assert pod.process.returncode == 0 and took < GRACE_S, f"exit {pod.process.returncode} after {took:.0f} s:\n" \
                                                           f"{pod.log(log_start)}"
    for thread in threads:
        thread.join(GRACE_S)
    cut = [answer for answer in answers if answer != {"finish_reason": "length", "tokens": TERMINATION_TOKENS}]
    assert not cut, f"{len(cut)} of {len(answers)} answers were not whole, serve exited after {took:.0f} s: " \
                    f"{cut[:3]}\n{pod.log(log_start)}"
    assert "killing" not in pod.log(log_start)

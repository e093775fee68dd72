"""Two replicas of the chart's pod behind a real HAProxy that spreads connections as kube-proxy does (layer 4,
each new connection to the next ready backend, readiness from the pod's own readiness probe): the API key,
streams and cancels through the load balancer reach whichever replica holds the connection.

The replay engine's fixed step makes the cancel test decisive, as in test_cancellation.py: a long generation
takes far longer than the bound on the requests that need its slot afterwards."""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import subprocess
import time
import urllib.request

import openai
import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.serve.ports import free_port

from ..deploy.chart import render
from .conftest import MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving
from .kubelet import Pod

pytest.importorskip("helm_python", reason="helm-python-sdk (Helm's Go library for Python) is not installed: "
                                          "pip install -e .[test]")
pytestmark = pytest.mark.integration

KEY = "sk-replicas"
SLOTS = 2
STEP_MS = 50
LONG_TOKENS = 900  # 45 s at one token every 50 ms: never reached by a stream the test drops
ANSWER_S = 15  # far below LONG_TOKENS × STEP_MS
DEADLINE_S = 60  # for HAProxy's health checks to see each backend


def _haproxy_config(pods: list[Pod], port: int, readiness_path: str) -> str:
    servers = "\n".join(f"    server replica{i} 127.0.0.1:{pod.ports['openai']} check inter 500ms"
                        for i, pod in enumerate(pods))
    return f"""global
    maxconn 256
defaults
    mode tcp
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend openai
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET {readiness_path}
    http-check expect status 200
{servers}
"""


@pytest.fixture(scope="module")
def replicas(tiny_models, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("replicas")
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy not found on PATH: apt-get install haproxy (Debian's package)")
    repository = build(BuildOptions(model=tiny_models["bpe"], output=work_dir / "models", engine="replay",
                                    replay_step_ms=STEP_MS, max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN,
                                    max_batch_size=SLOTS, serving=lean_serving()),
                       progress=lambda _: None)
    pods = []
    for index in range(2):
        # In a cluster both pods use the same ports on two addresses; on one host each needs ports of its own.
        values = {"repository": {"source": "pvc", "pvc": {"claimName": "models"}, "mountPath": str(repository)},
                  "ports": {name: free_port() for name in ("http", "grpc", "metrics", "openai")},
                  "apiKey": {"value": KEY},
                  "probes": {"startup": {"periodSeconds": 1, "failureThreshold": 300},
                             "readiness": {"periodSeconds": 1, "timeoutSeconds": 3, "failureThreshold": 2}}}
        pod_dir = work_dir / f"pod{index}"
        pod_dir.mkdir()
        pods.append(Pod(render(values), pod_dir))
        pods[-1].start()
    try:
        for pod in pods:
            pod.wait_until("startupProbe", True)
        port = free_port()
        readiness = pods[0].container["readinessProbe"]["httpGet"]["path"]
        (work_dir / "haproxy.cfg").write_text(_haproxy_config(pods, port, readiness))
        with open(work_dir / "haproxy.log", "wb") as log:
            balancer = subprocess.Popen(["haproxy", "-db", "-f", str(work_dir / "haproxy.cfg")], stdout=log,
                                        stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            _wait_for_both_backends(pods, base_url, balancer)
            yield pods, base_url
        finally:
            balancer.terminate()
            balancer.wait(timeout=30)
    finally:
        for pod in pods:
            pod.terminate()


def _gateway_metrics_text(pod: Pod, name: str) -> str:
    """The lines of one gateway metric of one replica (read from that replica directly)."""
    request = urllib.request.Request(f"http://127.0.0.1:{pod.ports['openai']}/metrics",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    return "\n".join(re.findall(rf"^{name}(?:\{{[^}}]*\}})? \S+$", text, re.M))


def _gateway_metric(pod: Pod, name: str) -> float:
    """A gateway metric of one replica, summed over its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in _gateway_metrics_text(pod, name).splitlines())


def _what_each_replica_saw(pods: list[Pod]) -> str:
    """For a failure message: each replica's finished requests by status, and its log."""
    return "\n".join(f"pod{i}: {_gateway_metrics_text(pod, 'tritonforge_requests_total')}\n{pod.log()}"
                     for i, pod in enumerate(pods))


def _requests_served(pod: Pod) -> float:
    return _gateway_metric(pod, "tritonforge_requests_total")


def _wait_for_both_backends(pods: list[Pod], base_url: str, balancer: subprocess.Popen) -> None:
    """Until a request through the balancer has reached each replica: HAProxy listens a moment after it starts,
    and sends nothing to a backend before its first passing health check (it closes such a connection)."""
    deadline = time.monotonic() + DEADLINE_S
    while not all(_requests_served(pod) for pod in pods):
        assert balancer.poll() is None, f"haproxy exited with {balancer.returncode}"
        assert time.monotonic() < deadline, "the balancer never sent a request to each replica"
        client = _fresh_client(base_url)  # a new connection each time: the balancer picks per connection
        try:
            client.completions.create(model="tritonforge", prompt="warm", max_tokens=1)
        except openai.APIConnectionError:
            time.sleep(0.5)  # HAProxy's health-check interval
        finally:
            client.close()


def _fresh_client(base_url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def test_the_api_key_is_required_on_every_replica_behind_the_balancer(replicas):
    pods, base_url = replicas
    before = [_requests_served(pod) for pod in pods]
    for _ in range(4):  # four connections: two for each replica, in turn
        client = _fresh_client(base_url, "sk-wrong")
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="tritonforge", prompt="Hi", max_tokens=1)
        client.close()
    for _ in range(4):
        client = _fresh_client(base_url)
        assert client.completions.create(model="tritonforge", prompt="Hi", max_tokens=1).usage.completion_tokens
        client.close()
    after = [_requests_served(pod) for pod in pods]
    assert all(a - b == 2 for a, b in zip(after, before)), (before, after)  # the 401s are not counted


def test_streams_through_the_balancer_read_the_same_text_from_either_replica(replicas):
    _, base_url = replicas
    prompt = {"model": "tritonforge", "prompt": "The server", "max_tokens": 12, "temperature": 0}

    def stream_text(_):
        client = _fresh_client(base_url)
        try:
            return "".join(c.choices[0].text for c in client.completions.create(**prompt, stream=True) if c.choices)
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(stream_text, range(4)))
    whole = _fresh_client(base_url).completions.create(**prompt).choices[0].text
    assert texts == [whole] * 4 and whole


def test_streams_dropped_at_the_balancer_free_their_slots_on_the_replicas_that_ran_them(replicas):
    pods, base_url = replicas
    streams, clients = [], []
    for _ in range(2 * SLOTS):  # every engine slot of both replicas
        client = _fresh_client(base_url)
        stream = client.completions.create(model="tritonforge", prompt="The server", max_tokens=LONG_TOKENS,
                                           stream=True)
        next(iter(stream))  # the first chunk: this stream holds a slot of one replica's engine now
        streams.append(stream)
        clients.append(client)
    in_flight = [_gateway_metric(pod, "tritonforge_requests_in_flight") for pod in pods]
    assert in_flight == [SLOTS, SLOTS], _what_each_replica_saw(pods)
    for stream, client in zip(streams, clients):
        stream.close()  # the client goes away; only the balancer knows which replica held the connection
        client.close()

    def answered_in(_) -> float:
        client = _fresh_client(base_url)
        started = time.monotonic()
        client.with_options(timeout=ANSWER_S).completions.create(model="tritonforge", prompt="Next", max_tokens=4)
        client.close()
        return time.monotonic() - started

    # As many new requests as slots, at once: each needs a slot that a dropped stream held.
    with concurrent.futures.ThreadPoolExecutor(2 * SLOTS) as pool:
        times = list(pool.map(answered_in, range(2 * SLOTS)))
    assert max(times) < ANSWER_S
    assert [_gateway_metric(pod, "tritonforge_requests_in_flight") for pod in pods] == [0, 0]

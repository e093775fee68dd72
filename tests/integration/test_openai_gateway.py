"""The OpenAI gateway with the real `openai` client (sync, async, streaming) against a real tritonserver."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tritonforge.gateway.options import GatewayThread
from tritonforge.serve.ports import free_port

MODEL = "tiny"


@pytest.fixture(scope="module", params=["ensemble", "tensorrt_llm_bls"])
def gateway(request, tiny_servers):
    server = tiny_servers("bpe")
    gateway = GatewayThread(server.grpc_url, port=free_port(), model=request.param, served_model_name=MODEL).start()
    yield gateway
    gateway.stop()


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_name(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_completion_counts_tokens_and_says_length_when_max_tokens_ended_it(client):
    completion = client.completions.create(model=MODEL, prompt="The server", max_tokens=8, temperature=0,
                                           extra_body={"min_tokens": 8})
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 8 and completion.usage.prompt_tokens > 1
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(client):
    messages = [{"role": "user", "content": "Say something"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert whole.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_streamed_completion_equals_the_whole_one_and_says_once_why_it_ended(client):
    request = {"model": MODEL, "prompt": "The server", "max_tokens": 8, "temperature": 0,
               "extra_body": {"min_tokens": 8}}
    whole = client.completions.create(**request)
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == [whole.choices[0].finish_reason] == ["length"]


def test_async_client_runs_requests_concurrently(gateway):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
        answers = await asyncio.gather(*(client.completions.create(model=MODEL, prompt=f"Prompt {i}", max_tokens=4)
                                         for i in range(4)))
        await client.close()
        return answers

    answers = asyncio.run(run())
    assert all(answer.choices[0].text is not None and answer.usage.completion_tokens >= 1 for answer in answers)


def test_unknown_fields_are_ignored(client):
    completion = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                           extra_body={"some_vendor_field": {"x": 1}, "ignore_eos": False})
    assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("fields, param", [({"n": 17}, "n"), ({"max_tokens": 0}, "max_tokens"),
                                           ({"temperature": "hot"}, "temperature"), ({"logprobs": 21}, "logprobs")])
def test_what_cannot_be_served_is_an_openai_error(client, fields, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="Hello", **{"max_tokens": 4, **fields})
    assert error.value.status_code == 400 and error.value.body["param"] == param


def post(gateway, path, body: bytes):
    request = urllib.request.Request(f"{gateway.base_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_http_error_shapes(gateway):
    status, body = post(gateway, "/v1/completions", b"{not json")
    assert status == 400 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    status, body = post(gateway, "/v1/completions", json.dumps({"prompt": "x" * 10_000_000,
                                                                "max_tokens": 4}).encode())
    error = json.loads(body)["error"]
    assert status == 400 and error["message"].startswith("prompt: ") and error["param"] == "prompt"
    assert error["type"] == "invalid_request_error"


def test_a_plain_sse_stream_ends_with_done(gateway):
    status, body = post(gateway, "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 3,
                                                                "stream": True}).encode())
    events = [line for line in body.decode().split("\n\n") if line]
    assert status == 200 and events[-1] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events)


def test_metrics_move_with_the_load(client, gateway):
    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines
                if line and not line.startswith("#")}

    before = scrape()
    client.completions.create(model=MODEL, prompt="Count", max_tokens=5, extra_body={"min_tokens": 5})
    after = scrape()
    ok = f'tritonforge_requests_total{{endpoint="/v1/completions",model="{MODEL}",status="200"}}'
    tokens = f'tritonforge_completion_tokens_total{{model="{MODEL}"}}'
    assert after[ok] == before.get(ok, 0) + 1
    assert after[tokens] == before.get(tokens, 0) + 5
    assert after["tritonforge_time_to_first_token_seconds_count"] > before.get(
        "tritonforge_time_to_first_token_seconds_count", 0)
    assert after["tritonforge_requests_in_flight"] == 0


@contextlib.contextmanager
def _gateway_workers(workers: int, url: str = "127.0.0.1:1", *options: str):
    """`tritonforge openai --workers N` (by default in front of no server: connections are what some tests
    count), once every worker takes connections: (its process, its port). Its stderr is read to the end, so a
    chatty gateway never blocks on a full pipe."""
    from tritonforge.gateway.workers import READY_MESSAGE

    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "tritonforge.cli", "openai", "--url", url, "--port", str(port),
                                "--workers", str(workers), *options],
                               start_new_session=True, stderr=subprocess.PIPE, text=True)
    ready = threading.Event()

    def drain() -> None:
        for line in gateway.stderr:
            if READY_MESSAGE in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not ready.wait(0.2):
            assert gateway.poll() is None, "the gateway exited before its workers served"
            assert time.monotonic() < deadline, "the gateway workers did not start"
        yield gateway, port
    finally:
        os.killpg(gateway.pid, signal.SIGTERM)
        gateway.wait(timeout=30)


WORKERS = 2
WORKER_REQUESTS = 8


def test_gateway_workers_share_the_port_and_their_metrics(tiny_servers, tmp_path):
    """`tritonforge openai --workers N`: every request answered, and /metrics (from whichever worker answers the
    scrape) counts the requests of all workers."""
    server = tiny_servers("bpe")
    with _gateway_workers(WORKERS, server.grpc_url, "--served-model-name", MODEL) as (_, port):
        base_url = f"http://127.0.0.1:{port}"

        async def many():
            client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
            answers = await asyncio.gather(*[client.completions.create(model=MODEL, prompt="Count", max_tokens=3)
                                             for _ in range(WORKER_REQUESTS)])
            await client.close()
            return answers

        assert all(answer.choices[0].text for answer in asyncio.run(many()))
        ok = f'tritonforge_requests_total{{endpoint="/v1/completions",model="{MODEL}",status="200"}}'
        for _ in range(2 * WORKERS):  # each scrape may reach another worker: every one must see the sum
            with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
                lines = response.read().decode().splitlines()
            assert f"{ok} {float(WORKER_REQUESTS)}" in lines


def _established_connections_by_pid(port: int) -> dict[int, int]:
    """Open TCP connections whose local port is `port`, counted by the process holding each (Linux /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                inodes.add(fields[9])
    counts: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone, or not ours
            continue
        held = sum(link[len("socket:["):-1] in inodes for link in links if link.startswith("socket:["))
        if held:
            counts[int(pid)] = held
    return counts


def _wait_for_connections(port: int, total: int) -> dict[int, int]:
    deadline = time.monotonic() + 30
    while sum((counts := _established_connections_by_pid(port)).values()) < total:
        assert time.monotonic() < deadline, f"not every connection was accepted: {counts}"
        time.sleep(0.05)
    return counts


def test_gateway_workers_take_connections_in_turn():
    """Connections opened together (as perf_analyzer's or a client pool's) are spread evenly over the workers:
    a long-lived streaming connection stays with its worker, so a worker that took most of them would serve
    most streams while the others idle."""
    workers, per_worker = 3, 4
    connections: list[socket.socket] = []
    with _gateway_workers(workers) as (_, port):
        try:
            threads = [threading.Thread(target=lambda: connections.append(
                socket.create_connection(("127.0.0.1", port)))) for _ in range(workers * per_worker)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            by_worker = sorted(_wait_for_connections(port, workers * per_worker).values())
            assert len(by_worker) == workers and max(by_worker) - min(by_worker) <= 1, by_worker
        finally:
            for connection in connections:
                connection.close()


def test_a_gateway_worker_that_dies_is_replaced():
    """A worker killed outright: its connections end, and a new worker takes its place and new connections."""
    workers = 2
    connections: list[socket.socket] = []
    with _gateway_workers(workers) as (_, port):
        try:
            connections += [socket.create_connection(("127.0.0.1", port)) for _ in range(workers)]
            first = set(_wait_for_connections(port, workers))
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not set(_established_connections_by_pid(port)) - first:  # a worker that was not there before
                assert time.monotonic() < deadline, "no worker took the dead one's place"
                connections.append(socket.create_connection(("127.0.0.1", port)))
                time.sleep(0.2)
            assert victim not in _established_connections_by_pid(port)
        finally:
            for connection in connections:
                connection.close()


def test_gateway_workers_on_a_taken_port_say_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "tritonforge.cli", "openai", "--url", "127.0.0.1:1",
                                 "--port", str(port), "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: --host/--port: 127.0.0.1:{port} is already in use "
                                                  "(another tritonserver, or a `tritonforge serve` still running?): "
                                                  "stop what holds it, or choose another port"]


def test_with_an_api_key_the_keyed_client_streams_and_a_keyless_one_gets_401(tiny_servers):
    server = tiny_servers("bpe")
    gateway = GatewayThread(server.grpc_url, port=free_port(), served_model_name=MODEL, api_key="sk-serve").start()
    try:
        keyed = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-serve", max_retries=0)
        stream = keyed.completions.create(model=MODEL, prompt="The server", max_tokens=6, temperature=0,
                                          stream=True, extra_body={"min_tokens": 6})
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        wrong = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-other", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.completions.create(model=MODEL, prompt="The server", max_tokens=6)
        assert caught.value.status_code == 401 and caught.value.body["type"] == "invalid_request_error"
        with urllib.request.urlopen(f"{gateway.base_url}/health", timeout=10) as response:  # no key needed
            assert response.status == 200
    finally:
        gateway.stop()

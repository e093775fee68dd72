"""A server that takes requests and answers nothing (a frozen engine) must not hold our clients: the stream ends
with ResponseTimeout at the client's limit, and the `stop` the client then sends the engine gives up after
STOP_TIMEOUT_S; `tritonforge probe` says so with its exit status. The frozen server is a test double of
Triton's gRPC service: a real frozen server comes only from a race
(docs/design/faults.md#a-deadlock-in-tritons-python-backend-and-why-the-bls-calls-the-engine-over-grpc)."""

import asyncio
import threading
import time

import pytest
from tritonclient.grpc import service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.clients import client as client_module
from tritonforge.clients.client import (
    AsyncGrpcClient,
    GenerateRequest,
    GrpcClient,
    ResponseTimeout,
    stop_engine_request,
)

STOP_TIMEOUT_S = 0.5  # the clients' limit for a stop's answer, shortened here: what is checked is that it ends
GIVE_UP_S = STOP_TIMEOUT_S + 10  # the client's limits plus a margin: beyond it the client hangs


class SilentTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's streaming endpoint, frozen: it reads every request and answers none until the client goes."""

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for _ in request_iterator:
            pass
        while context.is_active():  # the client closed its side; the server still owes every answer
            time.sleep(0.05)
        return iter(())


@pytest.fixture()
def silent_url(monkeypatch):
    monkeypatch.setattr(client_module, "STOP_TIMEOUT_S", STOP_TIMEOUT_S)
    with serving_grpc(SilentTriton()) as url:
        yield url


def finishes(work) -> bool:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(GIVE_UP_S)
    return not thread.is_alive()


def test_a_stop_to_a_silent_engine_gives_up(silent_url):
    assert finishes(lambda: stop_engine_request(silent_url, "a-request")), "the stop waited for ever"


@pytest.mark.parametrize("kind", ["grpc", "asyncio"])
def test_a_stream_from_a_silent_server_ends_with_a_timeout_error(silent_url, kind):
    outcome = {}
    request = GenerateRequest(text_input="The server", max_tokens=4)

    async def stream_asyncio():
        client = AsyncGrpcClient(silent_url, response_timeout_s=1)
        try:
            async for _ in client.responses(request):
                pass
        finally:
            await client.close()  # waits for the stop it sent the engine

    def stream():
        client = GrpcClient(silent_url)
        try:
            if kind == "grpc":
                list(client.stream_bytes(request, timeout_s=1))
            else:
                asyncio.run(stream_asyncio())
        except ResponseTimeout as error:
            outcome["error"] = str(error)
        finally:
            client.close()

    assert finishes(stream), "the stream (or its stop to the engine) waited for ever"
    assert outcome["error"] == "no response from ensemble in 1 s: the server may be stalled"


def test_probe_of_a_silent_server_says_not_live(silent_url, capsys):
    from tritonforge.cli import main

    outcome = {}
    assert finishes(lambda: outcome.update(code=main(["probe", "--url", silent_url, "--timeout-s", "1"])))
    assert outcome["code"] == 1
    assert "not live: no response from ensemble in 1 s" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["0", "-5", "soon", "nan"])
def test_probe_refuses_a_limit_that_is_not_a_positive_number_of_seconds(limit, capsys):
    from tritonforge.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["probe", "--timeout-s", limit])
    assert exit_.value.code == 2
    assert "--timeout-s" in capsys.readouterr().err


def test_a_benchmark_against_a_server_that_is_not_there_fails_at_once(tmp_path):
    """Not ~9,500 errors a point for two minutes: the run ends before its warm-up, naming the address."""
    from tritonforge.clients.client import ServerUnavailable
    from tritonforge.serve.ports import free_port
    from tritonforge.tools.benchmark import measure_server

    url = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match=url):
        measure_server(url, [("hi", [1, 2])], paths=("ensemble",), concurrencies=(1,), duration_s=30, work=tmp_path)
    assert time.monotonic() - started < 10


@pytest.fixture()
def silent_http_url():
    """An HTTP endpoint that reads each request and answers nothing until the client goes."""
    import socketserver

    class Silent(socketserver.BaseRequestHandler):
        def handle(self):
            while self.request.recv(65536):  # b"": the client closed its side
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_request_to_a_silent_server_ends_with_a_timeout_error(silent_http_url):
    from tritonforge.clients.client import HttpClient

    outcome = {}

    def generate():
        try:
            HttpClient(silent_http_url, timeout_s=1).generate("The server", max_tokens=4)
        except ResponseTimeout as error:
            outcome["error"] = str(error)

    assert finishes(generate), "the HTTP request waited for ever"
    assert outcome["error"] == "no response from ensemble in 1 s: the server may be stalled"


def test_an_http_url_without_a_port_means_tritons_http_port():
    from tritonforge.clients.client import HttpClient
    from tritonforge.facts.ports import HTTP_PORT

    assert (HttpClient("localhost").port, HttpClient("http://10.0.0.7").port) == (HTTP_PORT, HTTP_PORT)
    assert HttpClient("localhost:8123").port == 8123


class ManualClock:
    """An event loop's clock and timers, moved by hand: the silence watch's schedule checked without waiting."""

    def __init__(self):
        self.now, self.timers = 0.0, []

    def time(self):
        return self.now

    def call_at(self, when, callback):
        self.timers.append((when, callback))
        return threading.Timer(0, lambda: None)  # a handle with cancel()

    def call_later(self, delay, callback):
        return self.call_at(self.now + delay, callback)

    def run_due(self):
        """Advance to the next timer and run it."""
        self.timers.sort(key=lambda timer: timer[0])
        when, callback = self.timers.pop(0)
        self.now = when
        callback()


def test_the_silence_watch_expires_one_timeout_after_the_wait_began_not_after_its_next_check(monkeypatch):
    clock = ManualClock()
    monkeypatch.setattr(client_module.asyncio, "get_running_loop", lambda: clock)
    expired = []
    watch = client_module._SilenceWatch(1.0, lambda: expired.append(clock.now))
    clock.now = 0.9
    watch.wait_begins()  # just before the first check, at 1.0
    clock.run_due()
    assert not expired
    clock.run_due()
    assert expired == [1.9]
    # A response heard meanwhile: the watch waits a whole timeout from the next wait's start again.
    expired.clear()
    watch = client_module._SilenceWatch(1.0, lambda: expired.append(clock.now))
    watch.wait_begins()
    clock.now += 0.5
    watch.heard()
    clock.run_due()
    assert not expired and clock.timers[-1][0] == clock.now + 1.0

"""A gRPC client pointed at an HTTP port (Triton's own, or any web server's) says so, instead of gRPC's
"Socket closed" or "Failed parsing HTTP/2", and an HTTP client pointed at a gRPC port says that, instead of the
bytes of an HTTP/2 frame; a port nothing listens on stays "Connection refused"."""

import http.server
import socket
import socketserver
import threading
from contextlib import contextmanager

import pytest
from tritonclient.grpc import service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.clients.client import GrpcClient, HttpClient, ServerUnavailable, check_serving
from tritonforge.serve.ports import free_port


class _ClosesHttp2AnswersHttp1(socketserver.BaseRequestHandler):
    """As Triton's HTTP port does: a connection that opens with HTTP/2's preface is closed without a word; an
    HTTP/1.1 request is answered."""

    def handle(self):
        if self.request.recv(3) == b"PRI":
            return
        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


@contextmanager
def serving(server: socketserver.BaseServer):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def tritons_http_port():
    return serving(socketserver.ThreadingTCPServer(("127.0.0.1", 0), _ClosesHttp2AnswersHttp1))


def a_web_server():
    return serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler))


@pytest.mark.parametrize("listener", [tritons_http_port, a_web_server])
def test_a_check_at_an_http_port_says_it_answers_http_not_grpc(listener):
    with listener() as url, pytest.raises(ServerUnavailable) as failed:
        check_serving(url, {})
    assert str(failed.value).startswith(f"no Triton server answers at {url} (gRPC): it answers HTTP, not gRPC")
    assert failed.value.listening


def test_a_stream_to_an_http_port_says_it_answers_http_not_grpc():
    with tritons_http_port() as url:
        client = GrpcClient(url)
        try:
            with pytest.raises(ServerUnavailable, match="it answers HTTP, not gRPC"):
                client.generate("hi", max_tokens=1)
        finally:
            client.close()


def test_a_port_nothing_listens_on_is_still_refused():
    port = free_port()
    with socket.socket() as probe:  # nothing listens there: a connection is refused
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    with pytest.raises(ServerUnavailable) as failed:
        check_serving(f"127.0.0.1:{port}", {})
    assert "Connection refused" in str(failed.value) and not failed.value.listening


@pytest.mark.parametrize("stream", [False, True])
def test_an_http_request_to_a_grpc_port_says_it_is_the_grpc_port_not_its_bytes(stream):
    """A gRPC server answers an HTTP/1.1 request with HTTP/2's first frame, which http.client reads as a bad status
    line; the client once printed those raw bytes."""
    with serving_grpc(service_pb2_grpc.GRPCInferenceServiceServicer()) as url, \
            pytest.raises(ServerUnavailable) as failed:
        client = HttpClient(url)
        list(client.stream("hi", max_tokens=1)) if stream else client.generate("hi", max_tokens=1)
    message = str(failed.value)
    assert message.startswith(f"no Triton server answers at {url} (HTTP): it answers HTTP/2, as a gRPC port does")
    assert "--protocol grpc" in message and "\\x00" not in message and failed.value.listening

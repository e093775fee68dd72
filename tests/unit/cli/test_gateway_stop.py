"""`tritonforge openai` stopped with Ctrl-C: one line says what it waits for, and a response its server never ends
is cut after the grace it names (it once waited 16 s in silence). The far end is a test double of Triton's gRPC
service that holds every stream open."""

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.gateway import STOP_GRACE_S
from tritonforge.serve.ports import free_port

from ..gateway.test_gateway_faults import text_response

STARTED_WITHIN_S = 60  # the gateway's imports and start on a loaded machine
EXIT_MARGIN_S = 10  # beyond the grace: uvicorn's ticks, closing the gRPC channel, the interpreter's exit


class HoldingTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Ready; streams one chunk of every request, then holds the stream open until released."""

    def __init__(self):
        self.released = threading.Event()

    def ServerReady(self, request, context):  # noqa: N802 - the gRPC method's name
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):  # noqa: N802
        return service_pb2.ModelReadyResponse(ready=True)

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        for _ in request_iterator:
            yield text_response("Hel")
            self.released.wait()


def test_ctrl_c_says_what_the_gateway_waits_for_and_cuts_a_response_after_that_grace():
    triton = HoldingTriton()
    with serving_grpc(triton) as url:
        port = free_port()
        gateway = subprocess.Popen([sys.executable, "-m", "tritonforge.cli", "openai", "--url", url, "--port",
                                    str(port)], stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + STARTED_WITHIN_S
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline and gateway.poll() is None, "the gateway did not start"
                    time.sleep(0.2)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
                data=json.dumps({"model": "tritonforge", "prompt": "hi", "max_tokens": 8, "stream": True}).encode())
            stream = urllib.request.urlopen(request, timeout=60)
            assert stream.readline().startswith(b"data: ")  # the one chunk: the response is under way
            stopped_at = time.monotonic()
            gateway.send_signal(signal.SIGINT)
            gateway.wait(timeout=STOP_GRACE_S + EXIT_MARGIN_S)
            took = time.monotonic() - stopped_at
            said = gateway.stderr.read()
            assert f"stopping the OpenAI gateway: responses under way get up to {STOP_GRACE_S:g} s" in said, said
            assert took < STOP_GRACE_S + EXIT_MARGIN_S
            stream.close()
        finally:
            triton.released.set()
            if gateway.poll() is None:
                gateway.kill()
                gateway.wait()

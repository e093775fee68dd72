"""`tritonforge openai --workers N` when a worker cannot start: the gateway stops, naming the worker's error,
instead of starting its successor (which fails the same way) for ever. A worker killed after it served is
replaced (tests/integration/test_openai_gateway.py)."""

import signal

import pytest

from tritonforge.gateway import GatewayFailed
from tritonforge.gateway.workers import serve_workers
from tritonforge.serve.ports import free_port

# Starting two spawned workers (each imports the gateway) takes 1-3 s on the loaded 2-core machine; a gateway
# that restarts them for ever is still running at this limit.
STOPS_WITHIN_S = 60


def app_that_cannot_be_built():
    """A worker's app factory failing as a broken web framework does, at import."""
    raise ImportError("No module named 'fastapi'")


def _running_too_long(signum, frame):
    raise TimeoutError(f"the gateway was still running after {STOPS_WITHIN_S} s")


def test_a_worker_that_dies_before_it_served_stops_the_gateway_naming_its_error():
    previous = signal.signal(signal.SIGALRM, _running_too_long)
    signal.alarm(STOPS_WITHIN_S)
    try:
        with pytest.raises(GatewayFailed) as failed:
            serve_workers(app_that_cannot_be_built, host="127.0.0.1", port=free_port(), workers=2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(failed.value)
    assert "before it served: ImportError: No module named 'fastapi'" in message, message
    assert "\n" not in message

"""Where things listen by default: Triton's own ports (its `--http-port`, `--grpc-port`, `--metrics-port`
defaults, which NVIDIA's containers and clients assume) and the OpenAI gateway's. The CLI, the clients, the
BLS's engine endpoint and the build's printed commands read them from here."""

import argparse

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
OPENAI_PORT = 9000
LOOPBACK = "127.0.0.1"  # what `serve` binds and the clients call unless told otherwise
LOCAL_HTTP_URL = f"{LOOPBACK}:{HTTP_PORT}"
LOCAL_GRPC_URL = f"{LOOPBACK}:{GRPC_PORT}"


def port_number(text: str) -> int:
    """A TCP port given on the command line (an argparse `type`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65535, got {value}")
    return value

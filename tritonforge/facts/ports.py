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


def check_distinct_ports(ports: dict[str, int | None]) -> None:
    """Refuse two endpoints on one port (by their names, e.g. flags; None or 0: not served or picked later):
    tritonserver would exit with its usage text, or the second listener fail after the server loaded."""
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if not port:
            continue
        if port in seen:
            raise ValueError(f"{name} {port} is also {seen[port]}: give each its own port")
        seen[port] = name


SCHEMES = ("http", "grpc")  # what a server address may start with: the protocol is the command's own choice


def host_port(text: str) -> str:
    """A server's address given on the command line (an argparse `type`): HOST:PORT, the form gRPC and our HTTP
    client take; an http:// or grpc:// in front is dropped."""
    scheme, separator, address = text.partition("://")
    if not separator:
        address = text
    elif scheme.lower() not in SCHEMES:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. {LOCAL_GRPC_URL}, got {text!r} ({scheme}:// is "
                                         f"not served here)")
    address = address.rstrip("/")
    host, colon, port = address.rpartition(":")
    if not colon or not host or "/" in address or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. {LOCAL_GRPC_URL}, got {text!r}")
    return address

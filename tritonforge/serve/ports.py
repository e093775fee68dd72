"""The ports a tritonserver listens on: free ones picked for it, and the check that those it is given are free
and distinct before it starts."""

from __future__ import annotations

import errno
import socket

from ..facts.ports import check_distinct_ports
from .errors import ServerError


class PortInUse(ServerError):
    """A port the server must listen on is taken: starting again cannot help."""


def check_ports_free(address: str, ports: dict[str, int]) -> None:
    """Refuse to start on a port something already listens on, or on one port twice: the server would fail to
    bind, and a readiness check could reach the other server."""
    check_distinct_ports(ports)
    for name, port in ports.items():
        if not port:
            continue
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no owner
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PortInUse(f"{name}: {address}:{port} is already in use (another tritonserver, or a "
                                    f"`tritonforge serve` still running?): stop what holds it, or choose another "
                                    f"port") from None
                raise PortInUse(f"{name}: cannot listen on {address}:{port} ({error.strerror}): check the "
                                f"address") from None


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket stays bound until all are chosen (ports picked one after another
    can repeat, and a server given one port twice refuses to start)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()

"""`tritonforge probe`: a liveness check through the engine (exit 0: a one-token generation answered in
time)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from ..clients.client import STOP_TIMEOUT_S
from ..facts.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..facts.ports import LOCAL_GRPC_URL, host_port
from ..facts.settings import add_arguments, given, positive_seconds, setting


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    url: str = setting(LOCAL_GRPC_URL, "gRPC host:port", parse=host_port)
    model: str = setting(ENSEMBLE_MODEL, "which model answers", choices=(ENSEMBLE_MODEL, BLS_MODEL))
    timeout_s: float = setting(60.0, "how long a generation may take to answer, queueing included (a busy engine "
                                     f"queues the probe too); a timed-out probe then spends up to "
                                     f"{STOP_TIMEOUT_S:g} s stopping its request", parse=positive_seconds)


def probe_command(args: argparse.Namespace) -> int:
    """A liveness check through the engine, for servers that run without our supervisor: Triton's own
    /v2/health/live still says 200 when the engine is frozen
    (docs/design/faults.md#a-deadlock-in-tritons-python-backend-and-why-the-bls-calls-the-engine-over-grpc).
    Exit 0 when a one-token generation answers within --timeout-s, 1 otherwise."""
    from ..clients.client import GenerateRequest, GenerationError, GrpcClient

    options = ProbeOptions(**given(args, ProbeOptions))
    started = time.monotonic()
    try:
        with GrpcClient(options.url, model=options.model) as client:
            for _ in client.stream_bytes(GenerateRequest(text_input="ping", max_tokens=1),
                                         timeout_s=options.timeout_s):
                pass
    except GenerationError as error:
        print(f"not live: {error}", file=sys.stderr)
        return 1
    print(f"live: {options.model} at {options.url} answered a one-token generation in "
          f"{time.monotonic() - started:.2f} s")
    return 0


def add_parser(command) -> None:
    probe = command("probe", "liveness check: does a one-token generation answer in time? (exit 0: yes)")
    add_arguments(probe, ProbeOptions)
    probe.set_defaults(func=probe_command)

"""`tritonforge probe`: a liveness check through the engine (exit 0: a one-token generation answered in
time)."""

from __future__ import annotations

import argparse
import sys

from ..spec.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..spec.ports import LOCAL_GRPC_URL
from ..spec.settings import positive_seconds


def probe_command(args: argparse.Namespace) -> int:
    """A liveness check through the engine, for servers that run without our supervisor: Triton's own
    /v2/health/live still says 200 when the engine is frozen (README, Faults). Exit 0 when a one-token
    generation answers within --timeout-s, 1 otherwise."""
    from ..clients.client import GenerateRequest, GenerationError, GrpcClient

    client = GrpcClient(args.url, model=args.model)
    try:
        for _ in client.stream_bytes(GenerateRequest(text_input="ping", max_tokens=1), timeout_s=args.timeout_s):
            pass
    except GenerationError as error:
        print(f"not live: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def add_parser(command) -> None:
    probe = command("probe", "liveness check: does a one-token generation answer in time? (exit 0: yes)")
    probe.add_argument("--url", default=LOCAL_GRPC_URL, help="gRPC host:port")
    probe.add_argument("--model", default=ENSEMBLE_MODEL, choices=(ENSEMBLE_MODEL, BLS_MODEL),
                       help="which model answers")
    probe.add_argument("--timeout-s", type=positive_seconds, default=60.0,
                       help="how long a generation may take to answer, queueing included (a busy engine queues "
                            "the probe too); a timed-out probe then spends up to 5 s stopping its request")
    probe.set_defaults(func=probe_command)

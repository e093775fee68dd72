"""`tritonforge openai`: the OpenAI-compatible HTTP API in front of a served repository."""

from __future__ import annotations

import argparse
import sys

from ..clients.openai_gateway import API_KEY_HELP, SERVED_MODEL_NAME
from ..clients.openai_gateway import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL
from ..spec.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..spec.ports import GRPC_PORT, OPENAI_PORT, port_number
from .arguments import positive_int, say


def openai_command(args: argparse.Namespace) -> int:
    from ..clients.openai_gateway import api_key_from_environment, run
    from ..serve.server import check_ports_free

    check_ports_free(args.host, {"--host/--port": args.port})
    print(f"OpenAI API on http://{args.host}:{args.port}/v1 → {args.model} at {args.url}", file=sys.stderr)
    run(args.url, host=args.host, port=args.port, model=args.model, served_model_name=args.served_model_name,
        workers=args.workers, api_key=api_key_from_environment(args.api_key), on_ready=say)
    return 0


def add_parser(command) -> None:
    gateway = command("openai", "OpenAI-compatible HTTP API in front of a served repository")
    gateway.add_argument("--url", required=True, help=f"Triton's gRPC address, e.g. localhost:{GRPC_PORT}")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--port", type=port_number, default=OPENAI_PORT, help="port to listen on")
    gateway.add_argument("--model", default=OPENAI_DEFAULT_MODEL, choices=(BLS_MODEL, ENSEMBLE_MODEL),
                         help="what it calls")
    gateway.add_argument("--served-model-name", default=SERVED_MODEL_NAME,
                         help="the model name /v1/models shows, and the only one requests may name")
    gateway.add_argument("--api-key", default=None, help=API_KEY_HELP)
    gateway.add_argument("--workers", type=positive_int, default=1,
                         help="gateway processes sharing the port: one handles a few thousand streamed chunks a "
                              "second")
    gateway.set_defaults(func=openai_command)

"""`tritonforge openai`: the OpenAI-compatible HTTP API in front of a served repository."""

from __future__ import annotations

import argparse
import sys

from ..facts.settings import add_arguments, given
from ..gateway.options import GatewayOptions
from .arguments import say


def openai_command(args: argparse.Namespace) -> int:
    from ..gateway.options import run
    from ..serve.ports import check_ports_free

    options = GatewayOptions(**given(args, GatewayOptions))
    check_ports_free(options.host, {"--host/--port": options.port})
    print(f"OpenAI API on http://{options.host}:{options.port}/v1 → {options.model} at {options.url}",
          file=sys.stderr)
    run(options, on_ready=say, on_stop=say)
    return 0


def add_parser(command) -> None:
    gateway = command("openai", "OpenAI-compatible HTTP API in front of a served repository")
    add_arguments(gateway, GatewayOptions)
    gateway.set_defaults(func=openai_command)

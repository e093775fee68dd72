"""`tritonforge generate`: send a prompt to a running server and print the answer."""

from __future__ import annotations

import argparse

from ..spec.contract import (
    BLS_MODEL,
    DEFAULT_MAX_TOKENS,
    ENSEMBLE_MODEL,
    MAX_TOKENS,
    SEED,
    STOP_WORDS,
    TEMPERATURE,
    TOP_K,
    TOP_P,
)
from ..spec.ports import LOCAL_GRPC_URL, LOCAL_HTTP_URL
from ..spec.settings import positive_int


def _client(args: argparse.Namespace):
    from ..clients.client import GrpcClient, HttpClient

    if args.protocol == "http":
        return HttpClient(args.url or LOCAL_HTTP_URL, model=args.model)
    return GrpcClient(args.url or LOCAL_GRPC_URL, model=args.model)


def _parameters(args: argparse.Namespace) -> dict:
    parameters = {MAX_TOKENS: args.max_tokens}
    for name in (TEMPERATURE, TOP_K, TOP_P, SEED):
        if getattr(args, name) is not None:
            parameters[name] = getattr(args, name)
    if args.stop:
        parameters[STOP_WORDS] = args.stop
    return parameters


def generate_command(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.stream:
        for text in client.stream(args.prompt, **_parameters(args)):
            print(text, end="", flush=True)
        print()
    else:
        print(client.generate(args.prompt, **_parameters(args)))
    return 0


def add_parser(command) -> None:
    generate = command("generate", "send a prompt to a running server and print the answer")
    generate.add_argument("prompt", help="the prompt text")
    generate.add_argument("--stream", action="store_true", help="print the text as it is generated")
    generate.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="how to reach the server")
    generate.add_argument("--url", default=None,
                          help=f"host:port (default {LOCAL_GRPC_URL} gRPC, {LOCAL_HTTP_URL} HTTP)")
    generate.add_argument("--model", default=ENSEMBLE_MODEL, choices=(ENSEMBLE_MODEL, BLS_MODEL),
                          help="which model answers")
    generate.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                          help="tokens to generate at most")
    generate.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: greedy)")
    generate.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest tokens")
    generate.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of this mass")
    generate.add_argument("--seed", type=int, default=None, help="sampling seed")
    generate.add_argument("--stop", action="append", default=[], help="stop phrase (repeatable)")
    generate.set_defaults(func=generate_command)

"""`tritonforge demo`: tiny model → repository → tritonserver → a prompt over gRPC and HTTP."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..build.builder import BuildOptions, build
from ..spec.settings import positive_int
from .arguments import say


def demo_command(args: argparse.Namespace) -> int:
    """Build a tiny model and its repository, serve it, answer a prompt over gRPC and HTTP."""
    from ..tools.tiny_model import make_tiny_model

    # Its own work folder: a temporary one, removed at exit, unless --work-dir names one to keep.
    with tempfile.TemporaryDirectory(prefix="tritonforge-demo-") as temporary:
        work = Path(args.work_dir or temporary)
        model = make_tiny_model(work / "tiny-model", tokenizer_family=args.tokenizer)
        # --force replaces only the files an earlier demo or build recorded writing there.
        repository = build(BuildOptions(model=model, output=args.output or work / "model_repository",
                                        max_input_len=256, max_seq_len=512, frontends=("ensemble", "bls"),
                                        force=True))
        return _demo_serve(args, repository)


def _demo_serve(args: argparse.Namespace, repository: Path) -> int:
    from ..clients.client import GrpcClient, HttpClient
    from ..serve.server import TritonServer

    print(f"repository ready: {repository}")
    say("starting tritonserver (loading the models takes 10-60 s) ...")
    with TritonServer(repository) as server:
        print(f"tritonserver ready: HTTP {server.http_url}, gRPC {server.grpc_url}")
        grpc_client = GrpcClient(server.grpc_url)
        print(f"prompt: {args.prompt!r}")
        print("gRPC stream:   ", end="", flush=True)
        for text in grpc_client.stream(args.prompt, max_tokens=args.max_tokens):
            print(text, end="", flush=True)
        print()
        http_client = HttpClient(server.http_url)
        print(f"HTTP generate: {http_client.generate(args.prompt, max_tokens=args.max_tokens)}")
        print("HTTP stream:   " + "".join(http_client.stream(args.prompt, max_tokens=args.max_tokens)))
        grpc_client.close()
        say("stopping tritonserver (its models unload: a few seconds) ...")
    print("(random weights: the text is gibberish; the streams differ from the whole text only where a character "
          "straddles two chunks, shown as U+FFFD)")
    return 0


def add_parser(command) -> None:
    demo = command("demo", "tiny model → repository → tritonserver → a prompt over gRPC and HTTP")
    demo.add_argument("--prompt", default="The server reads a request", help="the prompt")
    demo.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate")
    demo.add_argument("--tokenizer", choices=("bpe", "sentencepiece"), default="sentencepiece",
                      help="the tiny model's tokenizer family")
    demo.add_argument("--output", type=Path, default=None,
                      help="repository folder (default: inside the demo's work folder)")
    demo.add_argument("--work-dir", default=None, help="keep the tiny model and repository here (default: a "
                                                       "temporary folder, removed at exit)")
    demo.set_defaults(func=demo_command)

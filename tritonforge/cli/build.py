"""`tritonforge build`: checkpoint → ready-to-mount model repository, then, with --accuracy-gate, the gate on it.
Its flags are generated from the fields of BuildOptions, ServingConfig and GateOptions (facts/settings.py),
which hold every default."""

from __future__ import annotations

import argparse

from ..builder import model_configs as configs
from ..builder.build import build
from ..builder.options import BuildOptions
from ..facts.settings import add_arguments, given
from ..runtime.text.tokenization import tokenizer_only_process
from ..tools.accuracy_gate import GateOptions, print_gate_commands, run_accuracy_gate
from .arguments import say

SERVING = "serving."  # where the ServingConfig options land in `args`
INSTANCE_COUNTS = ("preprocessing_instances", "postprocessing_instances", "bls_instances")


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, BuildOptions)
    add_arguments(parser.add_argument_group("accuracy gate (serves the new repository once)"), GateOptions)
    add_arguments(parser.add_argument_group("serving (Triton's batching, instances and queues)"),
                  configs.ServingConfig, prefix=SERVING)


def build_options(args: argparse.Namespace) -> BuildOptions:
    """BuildOptions from the flags the user gave; every other value is the dataclasses' default."""
    options, serving = given(args, BuildOptions), given(args, configs.ServingConfig, prefix=SERVING)
    # A TensorRT-LLM build takes the pre/post/BLS instance counts (and the BLS concurrency) from its plan only
    # when no count is given: one given on the command line turns the plan off for all three, and the counts
    # not given keep their defaults.
    return BuildOptions(**options, serving=configs.ServingConfig(**serving),
                        planned_instances=not any(name in serving for name in INSTANCE_COUNTS))


def build_command(args: argparse.Namespace) -> int:
    options, gate = build_options(args), GateOptions(**given(args, GateOptions))
    runs_gate = gate.accuracy_gate is not None and not options.dry_run
    if not runs_gate:
        # Without the gate nothing here runs a model: the build only reads the checkpoint's tokenizer, and
        # transformers would load torch for it (seconds) unless told this process needs none.
        tokenizer_only_process()
    output = build(options, progress=say)
    if gate.accuracy_gate is not None and options.dry_run:
        print_gate_commands(output, options.model, gate, say)
    elif runs_gate:
        run_accuracy_gate(output, options.model, gate, say)
    print(f"repository ready: {output}")
    return 0


def add_parser(command) -> None:
    build_parser = command("build", "checkpoint → ready-to-mount model repository")
    _add_build_arguments(build_parser)
    build_parser.set_defaults(func=build_command)

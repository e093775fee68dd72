"""`tritonforge build`: checkpoint → ready-to-mount model repository, then, with --accuracy-gate, the gate on it.
Its flags are generated from the fields of BuildOptions, ServingConfig and GateOptions (facts/settings.py),
which hold every default; `serve` takes the same flags for a checkpoint it builds first."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from ..builder import model_configs as configs
from ..builder.build import build
from ..builder.options import BuildOptions
from ..facts.release import TRITON_IMAGE
from ..facts.settings import add_arguments, given, option_flag
from ..runtime.text.tokenization import tokenizer_only_process
from ..tools.accuracy_gate import GateOptions, print_gate_commands, run_accuracy_gate
from .arguments import say

SERVING = "serving."  # where the ServingConfig options land in `args`
INSTANCE_COUNTS = ("preprocessing_instances", "postprocessing_instances", "bls_instances")
GATE_GROUP = "accuracy gate (serves the new repository once)"
SERVING_GROUP = "serving (Triton's batching, instances and queues)"


def add_build_arguments(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = (),
                        group: argparse._ArgumentGroup | None = None, retitle: Callable[[str], str] = str) -> None:
    """The build's flags, but those of the BuildOptions fields in `exclude`; those of BuildOptions that name no
    group of their own go into `group` where one is given; the other groups are titled `retitle(title)`."""
    add_arguments(parser, BuildOptions, exclude=exclude, group=group, retitle=retitle)
    add_arguments(parser.add_argument_group(retitle(GATE_GROUP)), GateOptions)
    add_arguments(parser.add_argument_group(retitle(SERVING_GROUP)), configs.ServingConfig, prefix=SERVING)


def build_options(args: argparse.Namespace, **fixed) -> BuildOptions:
    """BuildOptions from the flags the user gave, and the `fixed` fields (where the command decides them); every
    other value is the dataclasses' default."""
    options, serving = given(args, BuildOptions), given(args, configs.ServingConfig, prefix=SERVING)
    # A TensorRT-LLM build takes the pre/post/BLS instance counts (and the BLS concurrency) from its plan only
    # when no count is given: one given on the command line turns the plan off for all three, and the counts
    # not given keep their defaults.
    return BuildOptions(**options, **fixed, serving=configs.ServingConfig(**serving),
                        planned_instances=not any(name in serving for name in INSTANCE_COUNTS))


def gate_options(args: argparse.Namespace) -> GateOptions:
    return GateOptions(**given(args, GateOptions))


def build_flags_given(args: argparse.Namespace) -> list[str]:
    """The build's flags that the user gave."""
    return ([option_flag(BuildOptions, name) for name in given(args, BuildOptions)]
            + [option_flag(GateOptions, name) for name in given(args, GateOptions)]
            + [option_flag(configs.ServingConfig, name) for name in given(args, configs.ServingConfig, SERVING)])


@contextlib.contextmanager
def _tokenizer_only() -> Iterator[None]:
    """torch marked absent while the block runs (`tokenizer_only_process`), and importable again after it: the
    process may go on to need it (`serve CHECKPOINT --openai-port`'s gateway imports xgrammar, which imports
    torch, for every grammar-guided request)."""
    marked_here = "torch" not in sys.modules
    tokenizer_only_process()
    try:
        yield
    finally:
        if marked_here and "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


def build_repository(options: BuildOptions, gate: GateOptions, *, tritonserver: str | None = None) -> Path:
    """The build, then the accuracy gate where asked for (served by `tritonserver`, default: the one `serve`
    finds); a dry run prints the gate's commands instead."""
    runs_gate = gate.accuracy_gate is not None and not options.dry_run
    # Without the gate nothing here runs a model: the build only reads the checkpoint's tokenizer, and
    # transformers would load torch for it (seconds) unless told this process needs none.
    with contextlib.nullcontext() if runs_gate else _tokenizer_only():
        output = build(options, progress=say)
    if gate.accuracy_gate is not None and options.dry_run:
        print_gate_commands(output, options.model, gate, say)
    elif runs_gate:
        run_accuracy_gate(output, options.model, gate, say, executable=tritonserver)
    return output


def build_command(args: argparse.Namespace) -> int:
    options = build_options(args)
    output = build_repository(options, gate_options(args))
    if options.dry_run:
        print(f"dry run written: {output} holds the configs and the plan but no engine, so it cannot serve yet: "
              f"build without --dry-run inside {TRITON_IMAGE} to make one")
    else:
        print(f"repository ready: {output}")
    return 0


def add_parser(command) -> None:
    build_parser = command("build", "checkpoint → ready-to-mount model repository")
    add_build_arguments(build_parser)
    build_parser.set_defaults(func=build_command)

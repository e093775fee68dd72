"""`tritonforge serve`: tritonserver on a built repository, supervised (restarted when it or a model dies), with the
OpenAI API beside it on request; holds the terminal until Ctrl-C. Given a checkpoint, it builds its repository
first, as `build` does with the same flags, into the build cache (builder/cache.py), or finds it built there."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
from collections.abc import Iterator
from pathlib import Path

from ..builder.trtllm import EngineMismatch
from ..facts.paths import PATH_MODELS
from ..facts.settings import add_arguments, given
from ..serve.options import ServeOptions
from .arguments import say

# The build options `serve CHECKPOINT` does not take: the checkpoint is its argument (build's --model); the
# repository goes into the cache, in the folder of its key, which is never replaced (--output, --force); and a
# dry run builds nothing to serve.
NOT_FOR_SERVE = ("model", "output", "force", "dry_run")
SERVE_SUMMARY = ("run tritonserver on a repository (or on a checkpoint's, built first and cached), supervised "
                 "(restarted when it or a model dies); holds the terminal until Ctrl-C")
SERVE_DESCRIPTION = (
    "Run tritonserver on a repository, supervised (restarted when it or a model dies); holds the terminal until "
    "Ctrl-C. Given a Hugging Face checkpoint folder instead, first build its repository as `tritonforge build` "
    "does, with the build options below, into --cache-dir, then serve it: a later serve of the same checkpoint "
    "files with the same build options reuses that build (one line names its folder), and a change of either "
    "builds another.")
BUILD_GROUP = "build (a CHECKPOINT only: `tritonforge build`'s options, with its defaults)"
BUILD_SUBGROUP = "build, {} (a CHECKPOINT only)"  # the title of each other group of build options
BUILD_GROUP_DESCRIPTION = (
    "The checkpoint is the positional argument (build's --model). The repository goes into --cache-dir, in a "
    "folder named by a digest of the checkpoint's files and of these options, so build's --output, --force and "
    "--dry-run are not taken: to choose the folder, run `tritonforge build --output DIR` and serve DIR. The "
    "accuracy gate serves with --tritonserver; with --openai-port, --openai-model must be one of --frontends. "
    "A repository is served as built: build options given with one are refused.")


def check_repository_engine(repository: Path) -> int:
    """Refuse a repository that failed its accuracy gate, or whose engine cannot serve here (a TensorRT-LLM
    engine built for another GPU or release); return the server processes (MPI ranks) it takes."""
    from ..builder.engines import ENGINE_KINDS
    from ..builder.manifest import MANIFEST, read_manifest

    manifest = read_manifest(repository)
    if manifest is None:
        return 1
    if manifest.ready is False:
        raise EngineMismatch(f"{repository} failed its accuracy gate at build time (figures in {MANIFEST}): "
                             f"rebuild it, or rebuild without --accuracy-gate to serve it anyway")
    kind = ENGINE_KINDS.get(manifest.engine or "")
    return kind.serving_ranks(repository, manifest.build) if kind else 1


def lora_adapters_of(repository: Path) -> dict[str, int]:
    """The LoRA adapters a repository's build recorded (name → task id), which the gateway serves as models."""
    from ..builder.lora import MANIFEST_KEY
    from ..builder.manifest import read_manifest

    manifest = read_manifest(repository)
    records = manifest.engine_record.get(MANIFEST_KEY, []) if manifest is not None else []
    return {record["name"]: int(record["task_id"]) for record in records}


def tool_parser_of(repository: Path) -> str:
    """The tool-call format the repository's model writes, by the markers of its tokenizer's chat template
    (tokenizer_config.json's, or chat_template.jinja beside it)."""
    from ..builder.repository import tokenizer_dir
    from ..gateway.tool_parsers import parser_for_chat_template

    folder = tokenizer_dir(repository)
    templates = []
    with contextlib.suppress(OSError, ValueError):
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
        # A list of named templates ({"name", "template"}) is what some models ship: all are read.
        templates += [item.get("template", "") for item in template] if isinstance(template, list) else [template]
    with contextlib.suppress(OSError):
        templates.append((folder / "chat_template.jinja").read_text())
    return parser_for_chat_template("\n".join(text for text in templates if isinstance(text, str)))


def is_checkpoint(path: Path) -> bool:
    """A Hugging Face checkpoint folder (its config.json) that holds no model of a repository."""
    return path.is_dir() and (path / "config.json").is_file() and not any(path.glob("*/config.pbtxt"))


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM interrupts as Ctrl-C does (the build removes what it wrote), not the process outright."""

    def interrupt(*_) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def checkpoint_repository(checkpoint: Path, args: argparse.Namespace, options: ServeOptions) -> Path:
    """The repository of `checkpoint` built with the build flags given: found in the cache where a build of the
    same checkpoint files and options completed before, else built (and gated, where asked) into it."""
    from ..builder.cache import BuildCache, CacheOptions, cache_key, default_cache_dir
    from ..builder.engines import engine_kind
    from ..serve.ports import check_ports_free
    from ..tools.accuracy_gate import AccuracyGateFailed
    from .build import build_options, build_repository, gate_options

    build, gate = build_options(args, model=checkpoint), gate_options(args)
    if options.openai_port and options.openai_model not in {PATH_MODELS[name] for name in build.frontends}:
        raise ValueError(f"--openai-model {options.openai_model} is not built with --frontends "
                         f"{','.join(build.frontends)}: add its frontend, or choose another --openai-model")
    cache = BuildCache(CacheOptions(**given(args, CacheOptions)).cache_dir or default_cache_dir())
    if checkpoint.resolve() in (cache.root.resolve(), *cache.root.resolve().parents):
        raise ValueError(f"--cache-dir {cache.root} is inside the checkpoint {checkpoint}: choose a folder outside it")
    key = cache_key(build, extra=(gate,))
    found = cache.find(key)
    if found is not None:
        say(f"reusing {found}: built before from the same checkpoint files and build options")
        return found
    engine_kind(build.engine).check_installed()  # before a build of minutes, not after it; as the ports
    check_ports_free(options.address, options.ports())
    say(f"building the repository of {checkpoint} into {cache.entry(key)}; serving it again with the same build "
        f"options reuses it")
    try:
        with _sigterm_interrupts():
            repository, ours = cache.build(key, lambda folder: build_repository(
                dataclasses.replace(build, output=folder), gate, tritonserver=options.tritonserver))
    except AccuracyGateFailed as error:
        raise AccuracyGateFailed(f"the engine failed the accuracy gate ({'; '.join(error.failures)}); its build was "
                                 f"not kept: change the build options, or serve without --accuracy-gate",
                                 error.failures) from None
    if not ours:
        say(f"reusing {repository}: another serve built it meanwhile")
    return repository


def repository_to_serve(args: argparse.Namespace, options: ServeOptions) -> Path:
    """The repository `serve` runs: the path given, or the one built from the checkpoint given; one line names
    what else the path is."""
    from ..serve.repository import RepositoryError
    from .build import build_flags_given

    path = args.path
    wanted = "a repository `tritonforge build` wrote, or a Hugging Face checkpoint folder"
    if not path.exists():
        raise RepositoryError(f"{path} does not exist: pass {wanted}")
    if not path.is_dir():
        raise RepositoryError(f"{path} is not a folder: pass {wanted}")
    if is_checkpoint(path):
        return checkpoint_repository(path, args, options)
    if not any(path.glob("*/config.pbtxt")):
        raise RepositoryError(f"{path} is neither a model repository (no <model>/config.pbtxt) nor a Hugging Face "
                              f"checkpoint (no config.json): pass {wanted}")
    flags = build_flags_given(args) + (["--cache-dir"] if "cache_dir" in args else [])
    if flags:
        raise ValueError(f"{', '.join(flags)}: build options, for a checkpoint; {path} is a built repository, "
                         f"served as built (rebuild it with `tritonforge build`, or serve its checkpoint)")
    return path


def serve_command(args: argparse.Namespace) -> int:
    from ..serve.ports import check_ports_free
    from ..serve.repository import check_repository
    from ..serve.session import GatewaySettings, ServeSession

    options = ServeOptions(**given(args, ServeOptions))
    repository = repository_to_serve(args, options)
    models = check_repository(repository)
    world_size = check_repository_engine(repository)
    check_ports_free(options.address, options.ports())
    gateway = (GatewaySettings(tool_parser=tool_parser_of(repository), adapters=lora_adapters_of(repository))
               if options.openai_port else None)
    ServeSession(repository, options, models=models, world_size=world_size, gateway=gateway, say=say).run()
    return 0


def add_parser(command) -> None:
    from ..builder.cache import CacheOptions
    from .build import add_build_arguments

    serve = command("serve", SERVE_SUMMARY)
    serve.description = SERVE_DESCRIPTION
    serve.add_argument("path", type=Path, metavar="PATH",
                       help="a repository `tritonforge build` wrote, or a Hugging Face checkpoint folder to build one "
                            "from first")
    add_arguments(serve, ServeOptions)
    build_group = serve.add_argument_group(BUILD_GROUP, BUILD_GROUP_DESCRIPTION)
    add_arguments(build_group, CacheOptions)
    add_build_arguments(serve, exclude=NOT_FOR_SERVE, group=build_group, retitle=BUILD_SUBGROUP.format)
    serve.set_defaults(func=serve_command)

"""The engine step's kinds, one record each: what a build needs to know of an engine and nothing else.

A kind says which model serves it (a Python model folder at the top of the project, or a backend of its
own), what it needs of the checkpoint, which build options belong to it alone, how it checks them, the
`config.pbtxt` parameters it reads, and what it writes into the engine model's version folder. The build
(`builder/build.py`) runs every kind the same way: check, plan, write. Adding an engine is a new module
here, registered below, and the engine's own folder (`runtime/engine/<kind>/` and its model folder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..model_configs import ServingConfig

if TYPE_CHECKING:
    from ..options import BuildOptions

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EnginePlan:
    """What a kind decided for one build: the engine model's backend and parameters, the serving settings it
    changed (its Triton version, planned instance counts), and what it records in the manifest."""

    parameters: dict[str, str]
    serving: ServingConfig
    backend: str = "python"
    manifest: dict = field(default_factory=dict)


def _nothing_to_check(options: BuildOptions) -> None:
    pass


def _one_rank(repository: Path, build: dict) -> int:
    return 1


def _nothing_to_install() -> None:
    pass


def _no_machine_facts() -> dict[str, str]:
    return {}


def _nothing_to_write(options: BuildOptions, checkpoint_config: dict, version_dir: Path, progress: Progress) -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class EngineKind:
    name: str  # the value of --engine
    summary: str  # one line: what it is for
    model_source: str | None  # the project folder whose 1/model.py serves it; None: a backend of its own
    runtime_room: str | None  # its folder under runtime/engine/, which that model.py runs
    plan: Callable[[BuildOptions, dict, Progress], EnginePlan]  # (options, checkpoint config, progress)
    check: Callable[[BuildOptions], None] = _nothing_to_check  # its own options, beyond BuildOptions' checks
    # Into tensorrt_llm/1/ before the configs are written, inside the build's removal on failure.
    write_engine: Callable[[BuildOptions, dict, Path, Progress], None] = _nothing_to_write
    # Before `serve` starts a repository of this kind (its recorded build options given): refuse what cannot
    # serve, and say how many server processes (MPI ranks) it takes.
    serving_ranks: Callable[[Path, dict], int] = _one_rank
    # Before `serve` builds a checkpoint's repository of this kind: refuse where what serves it is not installed,
    # so that nothing is built (nor kept in the cache) for a server that cannot start.
    check_installed: Callable[[], None] = _nothing_to_install
    # What of this machine its build depends on (an engine serves only where it was built): a build kept for
    # reuse (builder/cache.py) is keyed by it, so that another GPU or release builds anew.
    machine_facts: Callable[[], dict[str, str]] = _no_machine_facts
    weight_patterns: tuple[str, ...] = ()  # the checkpoint must hold one of these files
    needs_vocab_size: bool = False  # the checkpoint's config.json must name vocab_size
    serves_checkpoint: bool = False  # the checkpoint's weights are copied under tensorrt_llm/1/checkpoint
    several_instances: bool = False  # --engine-instances > 1 applies
    # The BuildOptions fields this kind reads that some other kind ignores (several kinds may list one): a build
    # for a kind that does not list a field refuses it given (a --tp-size the transformers engine would ignore).
    own_options: tuple[str, ...] = ()


# The BuildOptions fields TensorRT-LLM reads whichever way it serves: its engine build and its LLM API.
TENSORRT_LLM_OPTIONS = ("tp_size", "pp_size", "kv_cache_dtype", "max_num_tokens", "kv_cache_free_gpu_mem_fraction",
                        "enable_kv_cache_reuse", "enable_chunked_context", "target_triton")


def _registry() -> dict[str, EngineKind]:
    from . import llmapi, replay, tensorrtllm, transformers

    kinds = (transformers.KIND, tensorrtllm.KIND, llmapi.KIND, replay.KIND)
    return {kind.name: kind for kind in kinds}


ENGINE_KINDS = _registry()
ENGINE_NAMES = tuple(ENGINE_KINDS)
DEFAULT_ENGINE = "transformers"


def engine_kind(name: str) -> EngineKind:
    try:
        return ENGINE_KINDS[name]
    except KeyError:
        raise ValueError(f"--engine must be one of {ENGINE_NAMES}, got {name!r}") from None

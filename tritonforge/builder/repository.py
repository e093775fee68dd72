"""Assemble a ready-to-mount model repository: model sources, configs, tokenizer and weights.

Every path inside a config is relative to its model's directory, so the folder can be mounted anywhere
(`-v $PWD/model_repository:/models`). A `tritonforge.json` manifest at the root records how it was built.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..facts.contract import (
    BLS_MODEL,
    COALESCER_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
)
from ..facts.limits import EngineLimits
from . import model_configs as configs
from . import native

logger = logging.getLogger(__name__)

# The Triton model sources live at the top of the project (docs/design/layers.md); an engine kind names its
# own (builder/engines/).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
MODEL_SOURCES = {
    PREPROCESSING_MODEL: "preprocessing",
    POSTPROCESSING_MODEL: "postprocessing",
    BLS_MODEL: "tensorrt_llm_bls",
}
TOKENIZER_SUBDIR = "tokenizer"  # under preprocessing/
CHECKPOINT_SUBDIR = "checkpoint"  # under tensorrt_llm/1/ for the engines that serve the checkpoint itself
ENGINE_SUBDIR = "engine"  # under tensorrt_llm/1/ for the TensorRT-LLM engine
REPLAY_TOKENS = "replay_tokens.json"  # under tensorrt_llm/1/ for the replay (benchmarking) engine
# hf_quant_config.json: how ModelOpt quantized a checkpoint, which the LLM API reads from the checkpoint.
CHECKPOINT_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                       "hf_quant_config.json")
# The tokenizer's files, copied as the checkpoint has them: re-saving would write them in the format of the
# transformers installed here, which an older one (NVIDIA's container) may not read. config.json tells
# AutoTokenizer the model type where tokenizer_config.json names no class.
TOKENIZER_PATTERNS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                      "chat_template.json", "config.json", "generation_config.json")


@dataclass(frozen=True, kw_only=True)
class RepositoryPlan:
    """What `write_repository` writes: every model's config and where its code comes from. Recorded in the
    manifest, so a built repository's configs can be rendered again (`tritonforge tune`)."""

    output: Path
    engine: str  # the engine kind's name (builder/engines/)
    frontends: tuple[str, ...]  # ensemble and/or bls
    serving: configs.ServingConfig
    limits: EngineLimits
    engine_parameters: dict[str, str]
    engine_backend: str = "python"  # "python", "tensorrtllm" or one of our C++ backends (builder/native.py)
    engine_source: str | None = None  # the project folder whose 1/model.py is the Python engine model
    serves_checkpoint: bool = False  # the checkpoint's weights go under tensorrt_llm/1/checkpoint
    postprocessing_backend: str = "python"  # or the C++ detokenizer's backend (builder/native.py)
    bls_backend: str = "python"  # or the C++ BLS's backend (builder/native.py)

    def __post_init__(self):
        if self.engine_backend == "python" and self.engine_source is None:
            raise ValueError(f"the {self.engine} engine on the python backend needs its model source")
        unknown = set(self.frontends) - set(configs.FRONTENDS)
        if unknown or not self.frontends:
            raise ValueError(f"frontends must be a non-empty subset of {configs.FRONTENDS}, got {self.frontends}")


def model_source(folder: str) -> Path:
    path = SOURCE_ROOT / folder / "1" / "model.py"
    if not path.is_file():
        raise FileNotFoundError(f"model source {path} is missing: install tritonforge from its source tree "
                                f"(pip install -e .)")
    return path


def tokenizer_dir(repository: Path) -> Path:
    """Where a built repository keeps its tokenizer (preprocessing's; the other models point to it)."""
    return repository / PREPROCESSING_MODEL / TOKENIZER_SUBDIR


def build_configs(plan: RepositoryPlan) -> dict[str, mc.ModelConfig]:
    tokenizer = TOKENIZER_SUBDIR
    shared_tokenizer = f"../{PREPROCESSING_MODEL}/{TOKENIZER_SUBDIR}"
    out = {
        PREPROCESSING_MODEL: configs.preprocessing_config(plan.serving, plan.limits, tokenizer),
        POSTPROCESSING_MODEL: configs.postprocessing_config(plan.serving, shared_tokenizer,
                                                            backend=plan.postprocessing_backend),
        ENGINE_MODEL: configs.engine_config(plan.serving, backend=plan.engine_backend,
                                            parameters=plan.engine_parameters),
    }
    if "ensemble" in plan.frontends:
        out[ENSEMBLE_MODEL] = configs.ensemble_config(plan.serving)
        if configs.coalesces(plan.serving):
            out[COALESCER_MODEL] = configs.coalescer_config(plan.serving, native.COALESCER.name)
    if "bls" in plan.frontends:
        out[BLS_MODEL] = configs.bls_config(plan.serving, plan.limits, shared_tokenizer, backend=plan.bls_backend)
    return out


def replay_tokens(tokenizer_source: Path) -> list[int]:
    """What the replay engine streams: the shipped corpus in the model's own tokens, so detokenizing it
    costs what real text costs (multi-byte characters, word boundaries)."""
    from ..runtime.text.tokenization import load_tokenizer
    from .corpus import corpus_lines

    tokenizer = load_tokenizer(tokenizer_source)
    return tokenizer(" ".join(corpus_lines()), add_special_tokens=False).input_ids


def _files_under(folder: Path) -> set[str]:
    """Every file under `folder` (symbolic links included, never followed), relative to it."""
    found = set()
    for root, _, files in os.walk(folder):
        for name in files:
            found.add(str((Path(root) / name).relative_to(folder)))
    return found


def _folders_under(folder: Path) -> set[Path]:
    return {Path(root) / name for root, names, _ in os.walk(folder) for name in names} if folder.is_dir() else set()


def _refuse_dangerous_output(output: Path, checkpoint: Path | None) -> None:
    """An output that is, holds or sits inside the checkpoint, or is / or a home directory, is never written."""
    resolved = output.resolve()
    homes = {Path.home().resolve(), Path("/root"), *(Path("/home").glob("*") if Path("/home").is_dir() else [])}
    if resolved == Path("/") or resolved in homes or resolved == Path("/home"):
        raise ValueError(f"--output {output} is {'/' if resolved == Path('/') else 'a home directory'}: choose a "
                         f"folder of its own, e.g. {output / 'model_repository'}")
    if checkpoint is not None:
        model = checkpoint.resolve()
        if resolved == model or model in resolved.parents or resolved in model.parents:
            raise ValueError(f"--output {output} is, contains or sits inside the checkpoint {checkpoint}: the "
                             f"repository needs a folder of its own")


def prepare_output(output: Path, *, force: bool, checkpoint: Path | None = None,
                   written: list[str] | None = None) -> set[str]:
    """Make `output` ready to write; return the files already there that are not ours (left alone).

    Deletes only what an earlier build recorded as `written` (the manifest's files, with the manifest's own
    name last), and only with --force; a non-empty folder without that record is never touched."""
    _refuse_dangerous_output(output, checkpoint)
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise FileExistsError(f"--output {output} is not a folder")
    if output.exists() and any(output.iterdir()):
        if written is None:
            raise FileExistsError(f"{output} is not empty and holds no record of files tritonforge wrote there; "
                                  f"choose an empty or new folder (nothing is deleted for you)")
        if not force:
            raise FileExistsError(f"{output} holds a repository tritonforge built; pass --force to replace the "
                                  f"files it wrote there")
        _remove_written(output, written)
    output.mkdir(parents=True, exist_ok=True)
    return _files_under(output)


def _remove_written(output: Path, relative_paths: list[str]) -> None:
    """Remove the recorded files that are still inside `output`, then the folders they leave empty."""
    root = output.resolve()
    folders = set()
    for relative in relative_paths:
        path = output / relative
        if not (path.is_file() or path.is_symlink()):
            continue
        if path.parent.resolve() != root and root not in path.parent.resolve().parents:
            continue  # a record pointing outside the repository is ignored, never followed
        path.unlink()
        folders.update(parent for parent in path.parents if parent != output and output in parent.parents)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


@contextlib.contextmanager
def removed_on_failure(output: Path, existing: set[str]) -> Iterator[None]:
    """Whatever fails inside removes the files written into `output` since `prepare_output` (all but the
    `existing` ones), the folders they leave empty, and `output` itself when it is left empty: a failed build
    leaves no half-written repository that a retry would refuse to replace."""
    folders_before = _folders_under(output)
    try:
        yield
    except BaseException:
        written = sorted(_files_under(output) - existing) if output.is_dir() else []
        _remove_written(output, written)
        for folder in sorted(_folders_under(output) - folders_before, key=lambda p: len(p.parts), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()  # made by the build (e.g. an engine folder the failed build never filled)
        if output.is_dir() and not any(output.iterdir()):
            output.rmdir()
        if written:
            logger.warning("the build failed: removed the %d files it had written into %s", len(written), output)
        raise


def write_repository(plan: RepositoryPlan, *, tokenizer_source: Path, checkpoint: Path | None,
                     existing: set[str]) -> list[str]:
    """Write every model of the plan into plan.output, made ready by `prepare_output` (which returned the
    `existing` files); return every file written since (the engine kind's own files included), which the
    manifest records for the next --force."""
    from ..runtime.text.detokenization import TokenBytes
    from ..runtime.text.tokenization import load_tokenizer

    output = plan.output
    model_configs = build_configs(plan)
    for name, config in model_configs.items():
        version_dir = output / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        source = plan.engine_source if name == ENGINE_MODEL else MODEL_SOURCES.get(name)
        if config.backend == "python" and source is not None:
            shutil.copy2(model_source(source), version_dir / "model.py")
        elif name == POSTPROCESSING_MODEL:
            native.compile_backend(native.POSTPROCESSING, version_dir)
        elif name == BLS_MODEL:
            native.compile_backend(native.BLS, version_dir)
        elif name == COALESCER_MODEL:
            native.compile_backend(native.COALESCER, version_dir)
        (output / name / "config.pbtxt").write_text(configs.to_text(config))

    tokenizer = tokenizer_dir(output)
    tokenizer.mkdir(parents=True, exist_ok=True)
    for pattern in TOKENIZER_PATTERNS:
        for file in sorted(tokenizer_source.glob(pattern)):
            shutil.copy2(file, tokenizer / file.name)
    # Loaded here to fail the build, not the server's load, if a file is missing; its byte table saved for
    # postprocessing, which then starts without transformers.
    TokenBytes(load_tokenizer(tokenizer)).save(tokenizer)
    if plan.serves_checkpoint:
        target = output / ENGINE_MODEL / "1" / CHECKPOINT_SUBDIR
        target.mkdir(parents=True, exist_ok=True)
        for pattern in CHECKPOINT_PATTERNS:
            for file in sorted(checkpoint.glob(pattern)):
                shutil.copy2(file, target / file.name)  # a copy: the server may never write into the checkpoint
        if not any(target.glob("*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors weights in {checkpoint}")
    logger.info("wrote %s: %s", output, ", ".join(sorted(model_configs)))
    return sorted(_files_under(output) - existing)

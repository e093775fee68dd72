"""`tritonforge build` / `build_engine.py`: a checkpoint in, a ready-to-mount model repository out.

One path for every engine kind (`builder/engines/`): check the checkpoint against what the kind needs, let
the kind plan its engine model (and, for TensorRT-LLM, build the engine), then write every model's config,
the tokenizer and the manifest. A build that fails removes what it wrote. Serving the result (the accuracy
gate, tuning) is not the build's: `tools/` does it on the repository the build leaves.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ..facts.contract import ENGINE_MODEL
from ..facts.limits import EngineLimits
from . import native
from .checkpoint import check_checkpoint
from .engines import engine_kind
from .manifest import MANIFEST, Manifest, options_record, written_files
from .options import BuildOptions
from .repository import RepositoryPlan, prepare_output, removed_on_failure, write_repository

logger = logging.getLogger(__name__)


def _limits(options: BuildOptions, checkpoint_config: dict) -> EngineLimits:
    max_positions = checkpoint_config.get("max_position_embeddings")
    if max_positions and options.max_seq_len > max_positions:
        raise ValueError(f"--max-seq-len {options.max_seq_len} exceeds the model's max_position_embeddings "
                         f"{max_positions}")
    return EngineLimits(max_batch_size=options.max_batch_size, max_input_len=options.max_input_len,
                        max_seq_len=options.max_seq_len)


def build(options: BuildOptions, progress=logger.info) -> Path:
    """Check the checkpoint, then write the repository; a build that fails removes what it wrote."""
    kind = engine_kind(options.engine)
    checkpoint_config = check_checkpoint(options, kind)
    limits = _limits(options, checkpoint_config)
    engine = kind.plan(options, checkpoint_config, progress)
    text_backend = native.text_backend(options.text_backend, progress)
    serving = engine.serving
    if not native.coalescer_available(serving.coalescer and "ensemble" in options.frontends, progress):
        serving = dataclasses.replace(serving, coalescer=False)
    plan = RepositoryPlan(output=options.output, engine=kind.name, frontends=options.frontends,
                          serving=serving, limits=limits, engine_parameters=engine.parameters,
                          engine_backend=engine.backend, engine_source=kind.model_source,
                          serves_checkpoint=kind.serves_checkpoint,
                          postprocessing_backend=text_backend, bls_backend=native.bls_backend(text_backend))
    recorded = written_files(options.output)
    existing = prepare_output(options.output, force=options.force, checkpoint=options.model,
                              written=None if recorded is None else [*recorded, MANIFEST])
    copying = "; copying the checkpoint's weights" if kind.serves_checkpoint else ""
    progress(f"writing {options.output} ({kind.name} engine{copying})")
    with removed_on_failure(options.output, existing):
        version_dir = options.output / ENGINE_MODEL / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        kind.write_engine(options, checkpoint_config, version_dir, progress)
        files = write_repository(plan, tokenizer_source=options.model,
                                 checkpoint=options.model if kind.serves_checkpoint else None, existing=existing)
        Manifest(build=options_record(options), plan=plan, engine_record=engine.manifest,
                 files=tuple(files)).write(options.output)
    return options.output

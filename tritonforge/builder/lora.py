"""`build --lora NAME=PATH` (repeatable): PEFT LoRA adapters served beside the base model, each checked against
the checkpoint (its layers exist there with the shapes its factors fit) and given a task id, 1, 2, ... in the
order given: the `lora_task_id` a request selects it with, and the `model` name the gateway knows it by.

The engine kinds that read adapters (`own_options` "lora") turn these into what their engine loads: the
transformers engine copies each folder under `tensorrt_llm/1/lora/NAME/` and names them in its `lora_adapters`
parameter."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..runtime.engine.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterRecord,
    PeftAdapter,
    check_against_base,
    check_name,
    checkpoint_shapes,
    read_adapter,
)

LORA_SUBDIR = "lora"  # under the engine model's version folder
MANIFEST_KEY = "lora_adapters"  # the manifest's list of {"name", "task_id"}: what serve tells the gateway


@dataclass(frozen=True)
class BuiltAdapter:
    record: AdapterRecord  # path: relative to the engine model's folder (1/lora/NAME)
    adapter: PeftAdapter  # as read from the folder given


def parse_spec(text: str) -> tuple[str, Path]:
    """NAME=PATH → (name, path); the name checked."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora {text!r}: expected NAME=PATH (a name for the adapter, then its PEFT folder)")
    check_name(name.strip())
    return name.strip(), Path(path.strip()).expanduser()


def check_specs(specs: tuple[str, ...]) -> list[tuple[str, Path]]:
    """The specs parsed, names unique: what can be said without the checkpoint."""
    parsed = [parse_spec(spec) for spec in specs]
    names = [name for name, _ in parsed]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--lora names {', '.join(repeated)} more than once: each adapter needs its own name")
    return parsed


def plan_adapters(specs: tuple[str, ...], checkpoint: Path) -> list[BuiltAdapter]:
    """Each adapter read and checked against the checkpoint's layers; task ids 1, 2, ... in order."""
    built = []
    shapes = checkpoint_shapes(checkpoint) if specs else {}
    for task_id, (name, folder) in enumerate(check_specs(specs), start=1):
        adapter = read_adapter(name, folder)
        check_against_base(adapter, shapes)
        built.append(BuiltAdapter(record=AdapterRecord(name=name, task_id=task_id,
                                                       path=f"1/{LORA_SUBDIR}/{name}"), adapter=adapter))
    return built


def copy_adapters(adapters: list[BuiltAdapter], version_dir: Path) -> None:
    """Each adapter's two files under version_dir/lora/NAME/ (a repository carries what it serves)."""
    for built in adapters:
        target = version_dir / LORA_SUBDIR / built.record.name
        target.mkdir(parents=True, exist_ok=True)
        for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copyfile(built.adapter.folder / file, target / file)


def manifest_record(adapters: list[BuiltAdapter]) -> dict:
    return {MANIFEST_KEY: [{"name": built.record.name, "task_id": built.record.task_id} for built in adapters]}

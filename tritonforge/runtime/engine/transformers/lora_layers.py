"""LoRA adapters applied per row inside the in-flight batch: requests for different adapters and for the base model
share one forward pass.

Each adapted linear layer keeps the base layer and every adapter's factors stacked, padded to the largest rank:
A [adapters + 1, rank, in] and B [adapters + 1, out, rank], index 0 being the base model (zeros) and B already
scaled by PEFT's factor. A forward pass adds, to every row, its own adapter's update x A[i]ᵀ B[i]ᵀ, the factors
gathered by the row's adapter index (`AdapterBank.rows`): a gathered low-rank update per row, no merged copy of
the weights and no pass per adapter. The indices live on the device at fixed addresses (one per slot), so a
decode step captured as a CUDA graph reads the slots' current adapters when it is replayed; a step none of whose
rows has an adapter skips the updates (`AdapterBank.on`, part of the step's flags)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ....facts.contract import LORA_TASK_ID
from ....facts.errors import RequestError
from ..lora import ADAPTER_WEIGHTS, AdapterRecord, PeftAdapter, check_against_base, read_adapter


class AdapterBank:
    """Every adapter of an engine, by task id, and the adapter index of each row of the next forward pass."""

    def __init__(self, model: torch.nn.Module, adapters: list[tuple[AdapterRecord, PeftAdapter]], slots: int):
        self.index_of_task = {record.task_id: index for index, (record, _) in enumerate(adapters, start=1)}
        self.names = {record.task_id: record.name for record, _ in adapters}
        parameter = next(model.parameters())
        device, dtype = parameter.device, parameter.dtype
        # The slots' adapter indices (0: none), at a fixed address; `rows` is what the next pass reads.
        self.slot_rows = torch.zeros(slots, dtype=torch.long, device=device)
        self.rows = self.slot_rows
        self.on = False
        paths = sorted({path for _, adapter in adapters for path in adapter.modules})
        weights = [load_file(str(adapter.folder / ADAPTER_WEIGHTS)) for _, adapter in adapters]
        for path in paths:
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            base = getattr(parent, child)
            rank = max(adapter.modules[path].rank for _, adapter in adapters if path in adapter.modules)
            a = torch.zeros(len(adapters) + 1, rank, base.in_features, dtype=dtype, device=device)
            b = torch.zeros(len(adapters) + 1, base.out_features, rank, dtype=dtype, device=device)
            for index, ((_, adapter), tensors) in enumerate(zip(adapters, weights), start=1):
                module = adapter.modules.get(path)
                if module is None:
                    continue
                key = f"base_model.model.{path}"
                a[index, :module.rank] = tensors[f"{key}.lora_A.weight"].to(device, dtype)
                b[index, :, :module.rank] = (tensors[f"{key}.lora_B.weight"].float() * module.scaling).to(device,
                                                                                                         dtype)
            setattr(parent, child, LoraLinear(base, a, b, self))

    def task_index(self, task_id: int) -> int:
        index = self.index_of_task.get(task_id)
        if index is None:
            known = ", ".join(f"{task} ({name})" for task, name in sorted(self.names.items())) or "none"
            raise RequestError(LORA_TASK_ID, f"no LoRA adapter has task id {task_id} in this engine; its adapters: "
                                             f"{known}")
        return index

    def admit(self, slot: int, index: int) -> None:
        self.slot_rows[slot] = index

    def for_rows(self, indices: list[int]) -> None:
        """The next pass is a prefill of these rows (their adapter indices in order)."""
        self.rows = torch.tensor(indices, dtype=torch.long, device=self.slot_rows.device)
        self.on = any(indices)

    def for_slots(self, on: bool) -> None:
        """The next pass decodes slots [0, rows)."""
        self.rows = self.slot_rows
        self.on = on


class LoraLinear(torch.nn.Module):
    """A base linear layer plus each row's own adapter update."""

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, bank: AdapterBank):
        super().__init__()
        self.base, self.bank = base, bank
        self.register_buffer("lora_a", a, persistent=False)
        self.register_buffer("lora_b", b, persistent=False)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if not self.bank.on:
            return out
        rows = self.bank.rows[: x.shape[0]]
        low = torch.matmul(x, self.lora_a[rows].transpose(1, 2))  # [rows, tokens, rank]
        return out + torch.matmul(low, self.lora_b[rows].transpose(1, 2))


def load_adapters(model: torch.nn.Module, records: list[AdapterRecord], slots: int,
                  base_shapes: dict[str, list[int]]) -> AdapterBank | None:
    """The engine's adapters (records with absolute paths), checked against the base as the build checked them,
    installed in `model`; None where there are none."""
    if not records:
        return None
    adapters = []
    for record in records:
        adapter = read_adapter(record.name, Path(record.path))
        check_against_base(adapter, base_shapes)
        adapters.append((record, adapter))
    return AdapterBank(model, adapters, slots)

"""LoRA adapters applied per row inside the in-flight batch: requests for different adapters and for the base model
share one forward pass.

Each adapted linear layer keeps the base layer and every adapter's factors side by side, padded to the largest
rank r: A [adapters × r, in] and B [adapters × r, out], B already scaled by PEFT's factor. A forward pass runs x
through every adapter's A at once (one thin matrix product: adapters × r columns), keeps in each row only the
block of its own adapter (a one-hot mask by the row's adapter index, `AdapterBank.rows`; all zeros for a row on
the base model), and adds that times B: each row gets exactly its own adapter's update x A[i]ᵀ B[i]ᵀ in one
batched pass, with no merged copy of the weights, no pass per adapter and no per-row copy of the factors (which
cost a 1B model half its rate at 128 rows on an H100). The work grows with adapters × r, small beside the base
layer's for tens of adapters. The indices live on the device at fixed addresses (one per slot), so a decode step
captured as a CUDA graph reads the slots' current adapters when it is replayed; a step none of whose rows has an
adapter skips the updates (`AdapterBank.on`, part of the step's flags)."""

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
        self.count = len(adapters)
        parameter = next(model.parameters())
        device, dtype = parameter.device, parameter.dtype
        self.dtype = dtype
        # The slots' adapter indices (0: none), at a fixed address; `rows` is what the next pass reads.
        self.slot_rows = torch.zeros(slots, dtype=torch.long, device=device)
        self.rows = self.slot_rows
        self.on = False
        self._masks: dict[int, torch.Tensor] = {}  # by rank: the rows' one-hot blocks, made once a pass
        self._adapter_indices = torch.arange(1, self.count + 1, device=device)
        paths = sorted({path for _, adapter in adapters for path in adapter.modules})
        weights = [load_file(str(adapter.folder / ADAPTER_WEIGHTS)) for _, adapter in adapters]
        for path in paths:
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            base = getattr(parent, child)
            rank = max(adapter.modules[path].rank for _, adapter in adapters if path in adapter.modules)
            a = torch.zeros(len(adapters), rank, base.in_features, dtype=dtype, device=device)
            b = torch.zeros(len(adapters), rank, base.out_features, dtype=dtype, device=device)
            for index, ((_, adapter), tensors) in enumerate(zip(adapters, weights)):
                module = adapter.modules.get(path)
                if module is None:
                    continue
                key = f"base_model.model.{path}"
                a[index, :module.rank] = tensors[f"{key}.lora_A.weight"].to(device, dtype)
                b[index, :module.rank] = (tensors[f"{key}.lora_B.weight"].float() * module.scaling).T.to(device,
                                                                                                        dtype)
            setattr(parent, child, LoraLinear(base, a.flatten(0, 1), b.flatten(0, 1), rank, self))

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
        self._masks = {}

    def for_slots(self, on: bool) -> None:
        """The next pass decodes slots [0, rows)."""
        self.rows = self.slot_rows
        self.on = on
        self._masks = {}

    def mask(self, rows: int, rank: int) -> torch.Tensor:
        """[rows, 1, adapters × rank]: ones over each row's own adapter's block, zeros elsewhere (and all zeros for
        a row on the base model); made from `rows` on the device, so a captured step reads its current indices."""
        mask = self._masks.get(rank)
        if mask is None or mask.shape[0] < rows:
            # A comparison, not one_hot, which checks its indices on the host (no sync may run in a captured step).
            chosen = self.rows[:, None] == self._adapter_indices[None, :]  # index 0, the base, matches no block
            mask = chosen.to(self.dtype).repeat_interleave(rank, dim=1)[:, None, :]
            self._masks[rank] = mask
        return mask[:rows]


class LoraLinear(torch.nn.Module):
    """A base linear layer plus each row's own adapter update."""

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, rank: int, bank: AdapterBank):
        super().__init__()
        self.base, self.bank, self.rank = base, bank, rank
        self.register_buffer("lora_a", a, persistent=False)  # [adapters × rank, in]
        self.register_buffer("lora_b", b, persistent=False)  # [adapters × rank, out]

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
        low = torch.matmul(x, self.lora_a.T) * self.bank.mask(x.shape[0], self.rank)  # [rows, tokens, adapters × r]
        return out + torch.matmul(low, self.lora_b)


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

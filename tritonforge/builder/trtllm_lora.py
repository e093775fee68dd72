"""`build --lora` for `--engine tensorrtllm`: PEFT adapters turned into what TensorRT-LLM's engine and C++ backend load.

- the engine: `trtllm-build` gets the LoRA plugin, the largest adapter's rank and the modules any adapter adapts
  (`engine_lora`; the flags themselves are `trtllm.build_command`'s);
- each adapter: NVIDIA's two LoRA tensors (`convert`), as `examples/hf_lora_convert.py` writes them: `lora_weights`
  [1, rows, width], a row per adapted (layer, module) holding lora_A [rank, in] flattened, then lora_B [out, rank]
  times PEFT's scale flattened, zero-padded to the longest row; `lora_config` [1, rows, 3] int32 = (module id,
  layer, rank). lora_manager.py's `load_from_hf` lays out its own copy alike (A as stored, B scaled, no transpose);
- the backend loads them at start from `lora_prefetch_dir`: one folder per task id holding
  `model.lora_weights.npy` and `model.lora_config.npy` (PeftCacheManager::prefetchLoraWeights, which skips a folder
  whose name is not all digits), so a request names its adapter by `lora_task_id` alone;
- `lora_cache_*`: the host cache sized to hold every adapter at once (`cache_parameters`).

Read in NVIDIA/TensorRT-LLM as stored (the v1.2.1 tag itself could not be resolved): examples/hf_lora_convert.py
@05316d33, tensorrt_llm/lora_manager.py @007e181b, cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp @0cedd9a0
(prefetch, page sizing, `configureDataType`: the weights must be the engine's dtype), runtime/loraCache.cpp
@063e02f7 (`determineNumPages`, `copyToPages`), runtime/loraUtils.cpp @2a9abd95 (3- or 4-value config rows),
runtime/utils/numpyUtils.cpp @05316d33 (`typeFromNumpyDesc`: f2 and f4 are its only float types, no bfloat16),
triton_backend/inflight_batcher_llm/src/model_instance_state.cc @0c8de69a (`getPeftCacheConfigFromParams`).
Nothing here needs torch: the factors are read from the safetensors file with numpy.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..facts.trtllm_lora import HF_TO_TRTLLM, MODULE_IDS, ROW_PARALLEL, target_modules, trtllm_module
from ..runtime.engine.lora import ADAPTER_WEIGHTS, AdapterError, PeftAdapter
from .lora import LORA_SUBDIR, BuiltAdapter

WEIGHTS_FILE = "model.lora_weights.npy"
CONFIG_FILE = "model.lora_config.npy"
# The engine dtypes whose LoRA tensors the backend reads: the prefetch loader knows float16 and float32 .npy only,
# the weights must match the engine's dtype, and the `lora_weights` input of NVIDIA's config is TYPE_FP16.
NUMPY_DTYPES = {"float16": np.float16}
DTYPE_BYTES = {"float16": 2}
# PeftCacheManagerConfig::kDefaultHostCacheSize: the host cache the backend takes when the parameter is unset.
DEFAULT_HOST_CACHE_BYTES = 1 << 30
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class EngineLora:
    """What the engine is built for: TensorRT-LLM's modules (q/k/v completed) and the largest rank."""

    target_modules: tuple[str, ...]
    max_rank: int


def engine_lora(adapters: list[BuiltAdapter]) -> EngineLora | None:
    """The engine's LoRA settings for these adapters (None: no adapters, no LoRA plugin); an adapter of a layer
    TensorRT-LLM cannot adapt is refused in one line."""
    if not adapters:
        return None
    modules = {trtllm_module(built.record.name, name) for built in adapters for name in built.adapter.target_modules}
    return EngineLora(target_modules=tuple(target_modules(modules)),
                      max_rank=max(built.adapter.max_rank for built in adapters))


def check_dtype(dtype: str) -> None:
    if dtype not in NUMPY_DTYPES:
        raise ValueError(f"--lora with --engine tensorrtllm needs a float16 engine, and this one is {dtype}: the "
                         f"backend reads LoRA weights (its prefetched .npy files and the lora_weights input) as "
                         f"float16 only, in the engine's dtype; pass --dtype float16")


def read_factors(adapter: PeftAdapter) -> dict[str, np.ndarray]:
    """Every tensor of the adapter's safetensors file as float32 (bfloat16 widened by hand: numpy has none)."""
    path = adapter.folder / ADAPTER_WEIGHTS
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
        data = file.read()
    tensors = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        raw = data[start:end]
        if entry["dtype"] == "BF16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif entry["dtype"] in ("F16", "F32", "F64"):
            values = np.frombuffer(raw, dtype={"F16": "<f2", "F32": "<f4", "F64": "<f8"}[entry["dtype"]])
        else:
            raise AdapterError(f"LoRA adapter {adapter.name}: {key} is {entry['dtype']}, not a float tensor")
        tensors[key] = values.astype(np.float32).reshape(entry["shape"])
    return tensors


def layer_of(adapter: str, module_path: str) -> int:
    match = _LAYER.search(module_path)
    if match is None:
        raise AdapterError(f"LoRA adapter {adapter}: {module_path} has no layer index (layers.N.), which "
                           f"TensorRT-LLM's LoRA tensors name each row by")
    return int(match[1])


def convert(adapter: PeftAdapter, dtype: str = "float16") -> tuple[np.ndarray, np.ndarray]:
    """The adapter as NVIDIA's (lora_weights [1, rows, width], lora_config [1, rows, 3] int32), rows in (layer,
    module id) order. B carries PEFT's scale of its module (lora_alpha or its alpha_pattern's over the rank, or
    its square root with rsLoRA), as hf_lora_convert.py multiplies the out factor by alpha / r."""
    check_dtype(dtype)
    factors = read_factors(adapter)
    rows = []
    for path, module in adapter.modules.items():
        module_id = MODULE_IDS[trtllm_module(adapter.name, path.rsplit(".", 1)[-1])]
        lora_a = factors[f"base_model.model.{path}.lora_A.weight"]  # [rank, in]
        lora_b = factors[f"base_model.model.{path}.lora_B.weight"] * module.scaling  # [out, rank]
        rows.append((layer_of(adapter.name, path), module_id, module.rank,
                     np.concatenate([lora_a.ravel(), lora_b.ravel()])))
    rows.sort(key=lambda row: row[:2])
    width = max(len(row[3]) for row in rows)
    weights = np.zeros((1, len(rows), width), dtype=NUMPY_DTYPES[dtype])
    config = np.zeros((1, len(rows), 3), dtype=np.int32)
    for index, (layer, module_id, rank, values) in enumerate(rows):
        weights[0, index, :len(values)] = values
        config[0, index] = (module_id, layer, rank)
    if not np.isfinite(weights).all():
        raise AdapterError(f"LoRA adapter {adapter.name}: its scaled factors exceed {dtype}'s range, which the engine "
                           f"computes LoRA in")
    return weights, config


def write_prefetch(adapters: list[BuiltAdapter], version_dir: Path, dtype: str) -> Path:
    """Each adapter's tensors under version_dir/lora/<task id>/, the folder `lora_prefetch_dir` names."""
    folder = version_dir / LORA_SUBDIR
    for built in adapters:
        weights, config = convert(built.adapter, dtype)
        task = folder / str(built.record.task_id)
        task.mkdir(parents=True, exist_ok=True)
        np.save(task / WEIGHTS_FILE, weights)
        np.save(task / CONFIG_FILE, config)
    return folder


def module_dims(targets: tuple[str, ...], base_shapes: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    """(in, out) of each target module, from the base checkpoint's first layer."""
    to_hf = {trtllm: hf for hf, trtllm in HF_TO_TRTLLM.items()}
    dims = {}
    for target in targets:
        pattern = re.compile(rf"(?:^|\.)layers\.0\.(?:.+\.)?{to_hf[target]}\.weight$")
        shape = next((shape for key, shape in base_shapes.items() if pattern.search(key)), None)
        if shape is None or len(shape) != 2:
            raise ValueError(f"--lora: the checkpoint has no {to_hf[target]} weight in its first layer, which the "
                             f"engine's LoRA module {target} adapts")
        dims[target] = (shape[1], shape[0])
    return dims


def host_cache_bytes(lora: EngineLora, dims: dict[str, tuple[int, int]], *, adapters: int, num_layers: int,
                     tp_size: int, pp_size: int, dtype: str) -> int:
    """Bytes of host LoRA cache that hold every adapter at once, with the optimal and max adapter size both the
    largest rank. Mirrors PeftCacheManager::getPageManagerConfig: a page is `slots` slots of `width` values, sized
    so one adapter of the optimal size fills one page; an adapter takes whole pages (LoraCache::determineNumPages),
    and one of rank <= the optimal, on the engine's modules, fits one page. One spare page on top."""
    def local(target: str) -> int:  # a rank's share of one rank-1 row: in + out, one of them split by tp
        in_dim, out_dim = dims[target]
        if target in ROW_PARALLEL:
            return math.ceil(in_dim / tp_size) + out_dim
        return in_dim + math.ceil(out_dim / tp_size)

    sizes = [local(target) for target in lora.target_modules]
    width = min(sizes)
    layers = math.ceil(num_layers / pp_size)
    slots = max(lora.max_rank * sum(math.ceil(size / width) for size in sizes) * layers,
                math.ceil(lora.max_rank * max(sizes) / width))
    return (adapters + 1) * slots * width * DTYPE_BYTES[dtype]


def cache_parameters(adapters: list[BuiltAdapter], lora: EngineLora, *, prefetch_dir: str, base_shapes: dict,
                     num_layers: int, tp_size: int, pp_size: int, dtype: str) -> dict[str, str]:
    """The backend's `lora_*` parameters; the GPU cache keeps the backend's default share of free memory (5 %):
    it needs to hold only the adapters of the running batch."""
    host = host_cache_bytes(lora, module_dims(lora.target_modules, base_shapes), adapters=len(adapters),
                            num_layers=num_layers, tp_size=tp_size, pp_size=pp_size, dtype=dtype)
    return {
        "lora_prefetch_dir": prefetch_dir,
        "lora_cache_optimal_adapter_size": str(lora.max_rank),
        "lora_cache_max_adapter_size": str(lora.max_rank),
        "lora_cache_host_memory_bytes": str(max(host, DEFAULT_HOST_CACHE_BYTES)),
    }

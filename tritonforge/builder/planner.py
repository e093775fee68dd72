"""Plan GPU memory before building: weights per GPU, KV cache per token, and how many sequences fit.

The TensorRT-LLM executor sizes its KV cache at load as `fraction × free memory after the engine loads`, and
fails or silently shortens `max_seq_len` when not one sequence fits. This planner does the same arithmetic
up front and refuses such a plan with what to change:

    weights/GPU      = (linear params × weight bytes + embedding, lm_head and norm params × dtype bytes) / (tp·pp)
    linear params    = layers × (attention + experts × MLP + router)   (experts = 1, router = 0 for dense models)
    KV bytes/token   = 2 (K and V) × layers/pp × max(kv_heads/tp, 1) × head_dim × KV dtype bytes
    KV memory        = (GPU memory (GiB) − weights/GPU − runtime reserve) × kv_cache_free_gpu_mem_fraction
    KV tokens        = floor(KV memory / KV bytes per token / tokens_per_block) × tokens_per_block
    sequences        = floor(KV tokens / tokens_per_block / ceil(max_seq_len / tokens_per_block))

The runtime reserve (CUDA context, TensorRT activations and runtime buffers) is a stated assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..facts.release import TOKENS_PER_BLOCK
from .trtllm import DTYPE_BYTES, WEIGHT_BYTES

GIB = 1024**3
DEFAULT_RUNTIME_RESERVE_GIB = 2.0


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    # Mixture of experts: every expert's MLP is stored (all are resident, only the routed ones run).
    num_experts: int = 1  # 1 = a dense model
    expert_intermediate_size: int = 0  # 0 = intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen-MoE's always-on expert

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        heads = config["num_attention_heads"]
        # Mixtral names the expert count num_local_experts; Qwen-MoE num_experts, with its own expert width.
        experts = config.get("num_local_experts") or config.get("num_experts") or 1
        return cls(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                   intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
                   num_heads=heads, num_kv_heads=config.get("num_key_value_heads", heads),
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   num_experts=experts,
                   expert_intermediate_size=config.get("moe_intermediate_size") or 0,
                   shared_expert_intermediate_size=config.get("shared_expert_intermediate_size") or 0)

    @property
    def linear_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.num_experts == 1:
            return self.num_layers * (attention + 3 * h * self.intermediate_size)  # gate, up, down
        width = self.expert_intermediate_size or self.intermediate_size
        experts = self.num_experts * 3 * h * width + h * self.num_experts  # the experts and the router
        shared = 3 * h * self.shared_expert_intermediate_size + (h if self.shared_expert_intermediate_size else 0)
        return self.num_layers * (attention + experts + shared)

    @property
    def other_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return embeddings + norms


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_memory_bytes: int
    kv_tokens: int
    max_sequences: int  # max_seq_len-long sequences that fit at once
    # Serving defaults derived from the plan.
    preprocessing_instances: int
    postprocessing_instances: int
    bls_instances: int
    bls_max_concurrency: int
    max_queue_size: int
    max_queue_delay_microseconds: int

    def table(self, *, gpu_memory_gib: float, fraction: float, max_seq_len: int, max_batch_size: int) -> str:
        rows = [
            ("GPU memory", f"{gpu_memory_gib:.1f} GiB"),
            ("weights per GPU", f"{self.weight_bytes_per_gpu / GIB:.2f} GiB"),
            ("KV cache per token (per GPU)", f"{self.kv_bytes_per_token / 1024:.1f} KiB"),
            (f"KV cache at fraction {fraction}", f"{self.kv_memory_bytes / GIB:.2f} GiB"),
            ("KV tokens available", f"{self.kv_tokens:,}"),
            (f"sequences of {max_seq_len} tokens that fit", f"{self.max_sequences:,}"),
            ("engine max batch size", f"{max_batch_size}"),
            ("preprocessing / postprocessing / BLS instances",
             f"{self.preprocessing_instances} / {self.postprocessing_instances} / {self.bls_instances}"),
            ("BLS concurrency per instance", f"{self.bls_max_concurrency}"),
            ("engine queue size / queue delay", f"{self.max_queue_size} / {self.max_queue_delay_microseconds} µs"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


class PlanRefused(ValueError):
    pass


def plan_memory(shape: ModelShape, *, gpu_memory_gib: float, dtype: str = "float16", quantization: str = "none",
                kv_cache_dtype: str = "auto", tp_size: int = 1, pp_size: int = 1, max_seq_len: int,
                max_batch_size: int, kv_cache_free_gpu_mem_fraction: float = 0.9,
                runtime_reserve_gib: float = DEFAULT_RUNTIME_RESERVE_GIB) -> MemoryPlan:
    if not 0 < kv_cache_free_gpu_mem_fraction < 1:
        raise PlanRefused(f"kv_cache_free_gpu_mem_fraction must be in (0, 1), got {kv_cache_free_gpu_mem_fraction}")
    if shape.num_layers % pp_size:
        raise PlanRefused(f"{shape.num_layers} layers do not split into {pp_size} pipeline stages")
    if shape.num_heads % tp_size:
        raise PlanRefused(f"{shape.num_heads} attention heads do not split over tp={tp_size}")
    dtype_bytes = DTYPE_BYTES[dtype]
    weight_bytes = WEIGHT_BYTES[quantization] or dtype_bytes
    total_weights = shape.linear_params * weight_bytes + shape.other_params * dtype_bytes
    weights_per_gpu = int(total_weights / (tp_size * pp_size))
    kv_element = 1 if kv_cache_dtype in ("fp8", "int8") else dtype_bytes
    kv_per_token = (2 * (shape.num_layers // pp_size) * max(shape.num_kv_heads // tp_size, 1) * shape.head_dim
                    * kv_element)
    free = gpu_memory_gib * GIB - weights_per_gpu - runtime_reserve_gib * GIB
    if free <= 0:
        raise PlanRefused(
            f"the weights ({weights_per_gpu / GIB:.1f} GiB per GPU) and the runtime reserve "
            f"({runtime_reserve_gib} GiB) do not fit in {gpu_memory_gib} GiB: use more tensor parallelism "
            f"(--tp-size), pipeline parallelism (--pp-size), or quantize (--quantization fp8 / int4_awq)")
    kv_memory = int(free * kv_cache_free_gpu_mem_fraction)
    blocks = kv_memory // kv_per_token // TOKENS_PER_BLOCK
    kv_tokens = blocks * TOKENS_PER_BLOCK
    blocks_per_sequence = math.ceil(max_seq_len / TOKENS_PER_BLOCK)
    sequences = blocks // blocks_per_sequence
    if sequences < 1:
        raise PlanRefused(
            f"not one sequence of {max_seq_len} tokens fits: the KV cache holds {kv_tokens:,} tokens "
            f"({kv_memory / GIB:.2f} GiB at {kv_per_token / 1024:.0f} KiB per token). Lower --max-seq-len, raise "
            f"--kv-cache-free-gpu-mem-fraction, use --kv-cache-dtype fp8, quantize the weights, or add GPUs "
            f"(--tp-size)")
    return MemoryPlan(
        weight_bytes_per_gpu=weights_per_gpu, kv_bytes_per_token=kv_per_token, kv_memory_bytes=kv_memory,
        kv_tokens=kv_tokens, max_sequences=sequences, **frontend_instances(min(max_batch_size, sequences)),
        bls_max_concurrency=2 * max_batch_size, max_queue_size=4 * max_batch_size,
        max_queue_delay_microseconds=0)


def frontend_instances(concurrency: int) -> dict[str, int]:
    """The Python instances for `concurrency` streams that the engines run at once (all the instances of the
    engine together).

    Scaled with the streams, as measured on a 16-core H200 host at 128 streams: 8 preprocessing (one call per
    request: 128 streams ending in one engine step start their next requests together, and 4 instances made them
    wait; bench/results/gpu-ensemble-defaults/), 8 postprocessing (one call per response), 8 BLS (one response
    round trip per chunk; with its engine calls on one gRPC stream per instance, 8 kept more of the engine's
    rate than 16 at 128 and 256 streams; docs/performance.md#at-a-real-engines-rate-the-h200-machine)."""
    share = math.ceil(concurrency / 16)
    return {"preprocessing_instances": max(2, min(8, share)), "postprocessing_instances": max(2, min(8, share)),
            "bls_instances": max(1, min(8, share))}

"""TEST DOUBLE of `tensorrt_llm.lora_manager` at TensorRT-LLM 1.2: `LoraConfig` alone, its fields as
`tensorrt_llm/lora_helper.py` defines them (lora_manager.py imports it from there)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraConfig:
    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    trtllm_modules_to_hf_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    swap_gate_up_proj: bool = True

    def __post_init__(self):
        assert self.lora_ckpt_source in ["hf", "nemo"], (
            f"lora_ckpt_source must be one of 'hf' or 'nemo', got {self.lora_ckpt_source}")

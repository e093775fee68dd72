"""TensorRT-LLM's names for LoRA: its module for each Hugging Face linear layer, the ids its LoRA tensors carry,
and its rule that q, k and v are adapted together. The engine build (`builder/trtllm_lora.py`) and the LLM-API
engine (`runtime/engine/llmapi/`) both name modules by these.

Read in NVIDIA/TensorRT-LLM as stored (the v1.2.1 tag itself could not be resolved):
`tensorrt_llm/lora_helper.py` @037d4ba1 (`get_default_trtllm_modules_to_hf_modules`,
`get_missing_qkv_modules_from_lora_modules`), `tensorrt_llm/lora_manager.py` @007e181b (`LoraManager.LORA_MODULE_IDS`,
the same map in its older home) and `examples/hf_lora_convert.py` @05316d33 (`hf_modules_to_trtllm_modules`).
"""

from __future__ import annotations

# Hugging Face's Llama-family linear layers → TensorRT-LLM's LoRA modules. Its gated MLP computes
# act(fc(x)) * gate(x) with fc = gate_proj and gate = up_proj: gate_proj is mlp_h_to_4h and up_proj mlp_gate, not the
# other way round.
HF_TO_TRTLLM = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h", "up_proj": "mlp_gate", "down_proj": "mlp_4h_to_h",
}
# The module id in a row of `lora_config` (LoraManager.LORA_MODULE_IDS, the C++ LoraModule::ModuleType).
MODULE_IDS = {"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5,
              "mlp_4h_to_h": 6, "mlp_gate": 7}
# TensorRT-LLM adapts q, k and v together: a target list with one of them gets the others too (an adapter without
# them leaves them at rank 0).
QKV = ("attn_q", "attn_k", "attn_v")
# The layers a tensor-parallel rank splits along its input (the others split their output): LoraCache::copyToPages
# splits `lora_A` of these, `lora_B` of the rest.
ROW_PARALLEL = ("attn_dense", "mlp_4h_to_h")


def trtllm_module(adapter: str, hf_module: str) -> str:
    """TensorRT-LLM's module for a layer an adapter adapts, or one line saying it has none."""
    try:
        return HF_TO_TRTLLM[hf_module]
    except KeyError:
        raise ValueError(f"LoRA adapter {adapter}: TensorRT-LLM has no LoRA module for {hf_module} here (it adapts "
                         f"{', '.join(HF_TO_TRTLLM)})") from None


def target_modules(trtllm_modules) -> list[str]:
    """The modules an engine (or an LLM) adapts, q/k/v completed, in module-id order."""
    targets = set(trtllm_modules)
    if targets & set(QKV):
        targets |= set(QKV)
    return sorted(targets, key=MODULE_IDS.__getitem__)

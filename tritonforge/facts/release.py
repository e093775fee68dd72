"""The TensorRT-LLM release this project pins, the container that ships it, and the one engine fact that the
build and the runtime both read (the KV-cache block size)."""

# The one place naming the pinned release and the container that ships it: the newest pair that still serves
# engines through the `tensorrtllm` backend. After 1.2, NVIDIA/TensorRT-LLM#15907 (merged 2026-07-03) deletes the
# C++ backend and every engine model template from triton_backend/, keeping only the LLM-API model, and
# tensorrtllm_backend#858 drops the engine instructions from its README.
TRTLLM_VERSION = "1.2.1"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
TOKENS_PER_BLOCK = 32  # trtllm-build's default KV-cache block

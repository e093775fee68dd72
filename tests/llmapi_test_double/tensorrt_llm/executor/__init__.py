"""TEST DOUBLE of `tensorrt_llm.executor` (tests/llmapi_test_double/README.md): not TensorRT-LLM."""

"""TEST DOUBLE of the `tensorrt_llm` package (tests/llmapi_test_double/README.md): not TensorRT-LLM."""

IS_TEST_DOUBLE = True
__version__ = "1.2.1+test-double"

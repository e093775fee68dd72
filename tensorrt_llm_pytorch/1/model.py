"""The engine step on TensorRT-LLM's PyTorch workflow, served as the `tensorrt_llm` model (Python backend).

`tensorrt_llm.LLM` runs the Hugging Face checkpoint in `1/checkpoint` (no engine build); the tensors,
response flags and cancellation are those of NVIDIA's `tensorrtllm` backend
(docs/reference/tensors.md#tensorrt_llm-the-engine-step), decoupled: one response per streamed output when
`streaming` (`stream_interval` tokens each), else one per row.

| input | dtype | dims | |
|---|---|---|---|
| input_ids | INT32 | [-1] | prompt ids, rows right-padded |
| input_lengths, request_output_len | INT32 | [1] | required |
| end_id, pad_id, runtime_top_k, min_tokens, beam_width, num_return_sequences | INT32 | [1] | optional |
| temperature, runtime_top_p, len_penalty, repetition/presence/frequency_penalty | FP32 | [1] | optional |
| seed | UINT64 | [1] | optional |
| streaming, stop, exclude_input_in_output, return_log_probs | BOOL | [1] | optional |
| stop_words_list, bad_words_list | INT32 | [2, -1] | optional; bad words of one token each |
| guided_decoding_guide_type, guided_decoding_guide | STRING | [1] | optional: the grammar the answer follows |

| output | dtype | dims | |
|---|---|---|---|
| output_ids | INT32 | [-1, -1] | [beams, tokens] |
| sequence_length | INT32 | [-1] | per beam |
| cum_log_probs / output_log_probs | FP32 | [-1] / [-1, -1] | |
| batch_index, sequence_index | INT32 | [1] | |
"""

import triton_python_backend_utils as pb_utils

from tritonforge.facts.model_parameters import PyTorchEngineParameters
from tritonforge.runtime.engine.llmapi.engine import LlmApiEngine
from tritonforge.runtime.engine.service import EngineModel


class TritonPythonModel(EngineModel):
    PB_UTILS = pb_utils
    PARAMETERS = PyTorchEngineParameters

    def make_engine(self, args, parameters, settings):
        return LlmApiEngine.for_model(parameters, settings)

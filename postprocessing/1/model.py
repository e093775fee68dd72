"""Detokenizer (Python backend): token ids in, the exact UTF-8 bytes of their text out.

| input | dtype | dims | |
|---|---|---|---|
| TOKENS_BATCH | INT32 | [-1, -1] | [beams, tokens] |
| SEQUENCE_LENGTH | INT32 | [-1] | valid tokens per beam |

| output | dtype | dims | |
|---|---|---|---|
| OUTPUT | STRING | [-1] | one byte string per beam; special tokens skipped |

Stateless: streamed chunks may go to any instance. One response per request.
"""

import triton_python_backend_utils as pb_utils

from tritonforge.postprocess import Postprocessor
from tritonforge.triton_adapter import (
    model_parameters,
    output_tensors,
    request_inputs,
    requested_outputs,
    resolve_path,
    to_triton_error,
)


class TritonPythonModel:
    def initialize(self, args):
        self.postprocessor = Postprocessor(resolve_path(args, model_parameters(args)["tokenizer_dir"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = request_inputs(request)
                text = self.postprocessor(inputs["TOKENS_BATCH"], inputs["SEQUENCE_LENGTH"])
                tensors = output_tensors(pb_utils, {"OUTPUT": text}, requested_outputs(request))
                responses.append(pb_utils.InferenceResponse(tensors))
            except Exception as error:  # noqa: BLE001 - one bad request must not fail the batch
                responses.append(pb_utils.InferenceResponse(error=to_triton_error(pb_utils, error)))
        return responses

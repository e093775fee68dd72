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

from tritonforge.facts.contract import POST_OUTPUT, POST_SEQUENCE_LENGTH, POST_TOKENS_BATCH
from tritonforge.facts.model_parameters import PostprocessingParameters
from tritonforge.runtime.text.postprocess import Postprocessor
from tritonforge.runtime.text.tokenization import tokenizer_only_process
from tritonforge.runtime.triton_adapter import answer_each, resolve_path, start_heartbeat


class TritonPythonModel:
    def initialize(self, args):
        tokenizer_only_process()
        start_heartbeat()
        parameters = PostprocessingParameters.from_model_args(args)
        self.postprocessor = Postprocessor(resolve_path(args, parameters.tokenizer_dir))

    def execute(self, requests):
        return answer_each(pb_utils, requests, lambda inputs: {
            POST_OUTPUT: self.postprocessor(inputs[POST_TOKENS_BATCH], inputs[POST_SEQUENCE_LENGTH])})

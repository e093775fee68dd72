"""Detokenizer (Python backend): token ids in, the exact UTF-8 bytes of their text out.

| input | dtype | dims | |
|---|---|---|---|
| TOKENS_BATCH | INT32 | [-1, -1] | [beams, tokens] |
| SEQUENCE_LENGTH | INT32 | [-1] | valid tokens per beam |

| top_token_ids | INT32 | [-1, -1, -1] | ours, optional: [beams, tokens, k], the likeliest tokens beside each |

| output | dtype | dims | |
|---|---|---|---|
| OUTPUT | STRING | [-1] | one byte string per beam; special tokens skipped |
| token_bytes | STRING | [-1, -1] | ours, with top_token_ids: each token's bytes |
| top_token_bytes | STRING | [-1, -1, -1] | ours, with top_token_ids: each of those's bytes |

Stateless: streamed chunks may go to any instance. One response per request.
"""

import triton_python_backend_utils as pb_utils

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
        return answer_each(pb_utils, requests, self.postprocessor.answer)

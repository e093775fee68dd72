"""Tokenizer (Python backend): prompts or chat messages in, engine tensors out.

| input | dtype | dims | |
|---|---|---|---|
| QUERY | STRING | [1] | the prompt, UTF-8 (or send MESSAGES) |
| MESSAGES | STRING | [1] | chat messages, a JSON list of {"role", "content"} |
| REQUEST_OUTPUT_LEN | INT32 | [1] | max new tokens |
| BAD_WORDS_DICT, STOP_WORDS_DICT | STRING | [-1] | one phrase per element, optional |
| END_ID, PAD_ID | INT32 | [1] | optional overrides of the tokenizer's ids |

| output | dtype | dims | |
|---|---|---|---|
| INPUT_ID | INT32 | [-1] | rows right-padded with the pad id |
| REQUEST_INPUT_LEN, OUT_END_ID, OUT_PAD_ID | INT32 | [1] | |
| REQUEST_OUTPUT_LEN | INT32 | [-1] | |
| BAD_WORDS_IDS, STOP_WORDS_IDS | INT32 | [2, -1] | word-list format |

One response per request; a bad request gets its own INVALID_ARG error naming the field.
"""

import triton_python_backend_utils as pb_utils

from tritonforge.facts.limits import EngineLimits
from tritonforge.facts.model_parameters import PreprocessingParameters
from tritonforge.runtime.text.preprocess import Preprocessor
from tritonforge.runtime.text.tokenization import tokenizer_only_process
from tritonforge.runtime.triton_adapter import answer_each, resolve_path, start_heartbeat


class TritonPythonModel:
    def initialize(self, args):
        tokenizer_only_process()
        start_heartbeat()
        parameters = PreprocessingParameters.from_model_args(args)
        self.preprocessor = Preprocessor(
            resolve_path(args, parameters.tokenizer_dir),
            EngineLimits(max_input_len=parameters.max_input_len, max_seq_len=parameters.max_seq_len),
            add_special_tokens=parameters.add_special_tokens)

    def execute(self, requests):
        return answer_each(pb_utils, requests, self.preprocessor)

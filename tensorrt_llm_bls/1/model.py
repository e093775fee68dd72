"""tokenize → engine → detokenize in one decoupled model (BLS), the alternative to the ensemble.

Inputs and outputs are the ensemble's (text_input or messages, max_tokens, stop_words, sampling, stream,
...; text_output, batch_index, sequence_index, log probs). Differences that matter to clients:
every streamed chunk is complete UTF-8 characters; stop phrases are matched on text and never emitted;
a client's cancel and a stop phrase both stop the engine's request. One instance serves up to
`max_concurrency` requests at once.
"""

import os

import triton_python_backend_utils as pb_utils

from tritonforge.facts.environment import ENGINE_GRPC_URL_ENV
from tritonforge.facts.limits import EngineLimits
from tritonforge.facts.model_parameters import BlsParameters
from tritonforge.runtime.bls.orchestrator import BlsOrchestrator, BlsSettings
from tritonforge.runtime.text.tokenization import tokenizer_only_process
from tritonforge.runtime.triton_adapter import is_decoupled, resolve_path, start_heartbeat


class TritonPythonModel:
    def initialize(self, args):
        tokenizer_only_process()
        parameters = BlsParameters.from_model_args(args)
        self.orchestrator = BlsOrchestrator(pb_utils, BlsSettings(
            tokenizer_dir=resolve_path(args, parameters.tokenizer_dir),
            limits=EngineLimits(max_input_len=parameters.max_input_len, max_seq_len=parameters.max_seq_len),
            engine_model=parameters.tensorrt_llm_model_name,
            engine_url=os.environ.get(ENGINE_GRPC_URL_ENV) or parameters.engine_grpc_url,
            max_concurrency=parameters.max_concurrency,
            add_special_tokens=parameters.add_special_tokens, decoupled=is_decoupled(args)))
        start_heartbeat(drain=self.orchestrator.drain)

    def execute(self, requests):
        for request in requests:
            self.orchestrator.submit(request)
        return None

    def finalize(self):
        self.orchestrator.shutdown()

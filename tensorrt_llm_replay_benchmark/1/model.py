"""FOR BENCHMARKING ONLY: a replay engine served as the `tensorrt_llm` model (Python backend).

Same tensors and behaviour as `tensorrt_llm_transformers` (see its docstring), but it computes nothing: it
streams token ids tokenized at build time (`replay_tokens`) at one token per running request every
`replay_step_ms`, so the pipeline around the engine can be measured at a TensorRT-LLM token rate.
Built by `tritonforge build --engine replay`; never serve it to users.
"""

import json
import logging

import triton_python_backend_utils as pb_utils

from tritonforge.runtime.engine_service import EngineService, EngineSettings
from tritonforge.runtime.replay_engine import ReplayEngine, SharedBatch
from tritonforge.runtime.triton_adapter import resolve_path, start_heartbeat
from tritonforge.spec.model_parameters import ReplayEngineParameters


class TritonPythonModel:
    def initialize(self, args):
        parameters = ReplayEngineParameters.from_model_args(args)
        settings = EngineSettings.from_model_args(args, parameters)
        with open(resolve_path(args, parameters.replay_tokens), encoding="utf-8") as file:
            token_ids = json.load(file)
        # Several instances share one batch (the build sets shared_batch when it writes more than one).
        self.shared_batch = None
        if parameters.shared_batch:
            self.shared_batch = SharedBatch.for_model(args["model_repository"], settings.limits.max_batch_size)
        engine = ReplayEngine(token_ids, step_ms=parameters.replay_step_ms, limits=settings.limits,
                              vocab_size=parameters.vocab_size, shared_batch=self.shared_batch)
        logging.getLogger(__name__).warning("tensorrt_llm is the REPLAY engine (benchmarking only): it "
                                            "streams pre-set tokens every %s ms", parameters.replay_step_ms)
        self.service = EngineService(pb_utils, settings, engine)
        start_heartbeat(drain=self.service.drain)

    def execute(self, requests):
        for request in requests:
            self.service.handle(request)
        return None

    def finalize(self):
        self.service.shutdown()
        if self.shared_batch is not None:
            self.shared_batch.close()

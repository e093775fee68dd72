"""FOR BENCHMARKING ONLY: a replay engine served as the `tensorrt_llm` model (Python backend).

Same tensors and behaviour as `tensorrt_llm_transformers` (see its docstring), but it computes nothing: it
streams token ids tokenized at build time (`replay_tokens`) at one token per running request every
`replay_step_ms`, so the pipeline around the engine can be measured at a TensorRT-LLM token rate.
Built by `tritonforge build --engine replay`; never serve it to users.
"""

import json
import logging

import triton_python_backend_utils as pb_utils

from tritonforge.facts.model_parameters import ReplayEngineParameters
from tritonforge.runtime.engine.replay.engine import ReplayEngine, SharedBatch
from tritonforge.runtime.engine.service import EngineModel
from tritonforge.runtime.triton_adapter import resolve_path


class TritonPythonModel(EngineModel):
    PB_UTILS = pb_utils
    PARAMETERS = ReplayEngineParameters
    METRICS = False

    def make_engine(self, args, parameters, settings):
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
        return engine

    def finalize(self):
        super().finalize()
        if self.shared_batch is not None:
            self.shared_batch.close()

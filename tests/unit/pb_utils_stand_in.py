"""A stand-in for `triton_python_backend_utils` (pb_utils), which exists only inside a server's Python stub: just
what the runtime's adapter and engine service call. Named as the test double it is."""

from types import SimpleNamespace

FINAL = 1  # pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonErrorStandIn:
    """pb_utils.TritonError: its codes and what it was made with."""

    INVALID_ARG, UNAVAILABLE, INTERNAL, UNSUPPORTED = "INVALID_ARG", "UNAVAILABLE", "INTERNAL", "UNSUPPORTED"

    def __init__(self, message, code):
        self.message, self.code = message, code


PB_UTILS_STAND_IN = SimpleNamespace(
    Tensor=lambda name, value: (name, value), TritonError=TritonErrorStandIn,
    InferenceResponse=lambda tensors=None, error=None: SimpleNamespace(tensors=tensors, error=error),
    TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL)

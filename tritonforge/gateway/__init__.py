"""An OpenAI-compatible HTTP gateway in front of a served repository (the BLS, or the ensemble, over gRPC).

`tritonforge openai --url HOST:GRPC_PORT --port PORT` (in front of any Triton serving the repository,
NVIDIA's container included) or `tritonforge serve REPO --openai-port PORT` (beside the server it starts).
Cut as vLLM's OpenAI entrypoint is:

- `protocol`: OpenAI's request and response shapes, as the gateway accepts and emits them;
- `serving`: an OpenAI request through the repository and back, errors mapped by `facts/errors.py`;
- `routes`: the FastAPI app (routes, API key, metrics);
- `options`: `tritonforge openai`'s options, and running the app from them;
- `workers`: several gateway processes sharing one port; `metrics`: its Prometheus metrics.
"""


class GatewayFailed(RuntimeError):
    """The gateway could not start (a worker that died before it served, a listener that never came up): the
    message names the cause."""

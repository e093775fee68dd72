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

# At a stop (Ctrl-C, SIGTERM) the responses under way get this long to end before they are cut: an idle gateway
# stops at once, and one under a stream its server never ends does not wait for ever.
STOP_GRACE_S = 10.0


def stop_line() -> str:
    return (f"stopping the OpenAI gateway: responses under way get up to {STOP_GRACE_S:g} s to end "
            f"(Ctrl-C again: stop at once)")


class GatewayFailed(RuntimeError):
    """The gateway could not start (a worker that died before it served, a listener that never came up): the
    message names the cause."""

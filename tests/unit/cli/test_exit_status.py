"""The `tritonforge` command's exit status for a request's error, by its kind (facts/errors.py's table): 2 where
the command line must change (a bad request, a model the server does not serve), 1 where the server is at
fault or away (tests/integration/test_user_mistakes.py runs the command itself)."""

import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.cli.main import _exit_status
from tritonforge.clients.client import GenerationError, ResponseTimeout, ServerUnavailable, _rpc_failure, check_serving
from tritonforge.facts.errors import ErrorKind


@pytest.mark.parametrize("error, status", [
    (GenerationError("in ensemble 'ensemble', max_tokens: must be in [1, 255], got 0"), 2),
    (GenerationError("--paths bls: the server does not serve 'tensorrt_llm_bls'", ErrorKind.CLIENT), 2),
    (_rpc_failure("127.0.0.1:8001", "INVALID_ARGUMENT", "unexpected inference input"), 2),
    (GenerationError("unavailable: the engine queue is full (8 waiting)"), 1),
    (ServerUnavailable("127.0.0.1:8001", "gRPC", "Connection refused"), 1),
    (ResponseTimeout("ensemble", 300), 1),
    (GenerationError("Stub process 'tensorrt_llm_0_0' is not healthy."), 1),
    (GenerationError("note: an answer of no kind we know"), 1)])
def test_a_requests_error_exits_with_its_kinds_status(error, status):
    assert _exit_status(error) == status


class TritonWithoutTheBls(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A stand-in for a ready server that serves every model but the BLS."""

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=request.name != "tensorrt_llm_bls")


def test_a_model_the_command_line_names_and_the_server_does_not_serve_is_a_usage_error():
    with serving_grpc(TritonWithoutTheBls()) as url:
        check_serving(url, {"ensemble": "--paths ensemble"})
        with pytest.raises(GenerationError, match="^--paths bls: the server at .* does not serve") as refused:
            check_serving(url, {"tensorrt_llm_bls": "--paths bls"})
    assert _exit_status(refused.value) == 2


@pytest.mark.parametrize(("errors", "status"), [((0, 0), 0), ((0, 3), 1)])
def test_bench_exits_1_when_any_point_had_failed_requests(tiny_models, tmp_path, monkeypatch, capsys, errors,
                                                          status):
    from tritonforge.builder.build import BuildOptions, build
    from tritonforge.cli import main
    from tritonforge.clients import client as client_module
    from tritonforge.tools import benchmark

    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                                    max_seq_len=256))
    rows = [{"engine": "repo", "concurrency": 1, "path": path, "errors": failed, "output_tokens_per_s": 100.0}
            for path, failed in zip(("direct", "ensemble"), errors)]
    monkeypatch.setattr(client_module, "check_serving", lambda url, models: None)  # the server: a stand-in
    monkeypatch.setattr(benchmark, "measure_server", lambda *args, **kwargs: rows)
    monkeypatch.setattr(benchmark, "markdown", lambda result: "the table")
    assert main(["bench", str(repository), "--paths", "direct,ensemble", "--concurrency", "1"]) == status


@pytest.mark.parametrize("message, line", [
    ("tritonserver crashed while loading (Aborted):\nterminate called after throwing\nSignal (6) received.",
     "tritonserver crashed while loading (Aborted): terminate called after throwing"),
    ("tritonserver exited with code 1: the reason\nthe log lines", "tritonserver exited with code 1: the reason"),
    ("", "ServerError"),
])
def test_an_error_is_one_line_that_keeps_the_reason_its_first_line_announces(message, line):
    from tritonforge.cli.main import one_line
    from tritonforge.serve.errors import ServerError

    assert one_line(ServerError(message)) == line

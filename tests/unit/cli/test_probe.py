"""`tritonforge probe` says what it found in one line: live (on stdout, exit 0) or not (on stderr, exit 1). The
server is a test double of Triton's streaming endpoint."""

from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import serving_grpc
from tritonforge.cli import main
from tritonforge.facts.contract import FINAL_RESPONSE_PARAMETER
from tritonforge.serve.ports import free_port


class AnsweringTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers every streamed request with its final response at once."""

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        for request in request_iterator:
            final = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            final.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=final)


def test_a_probe_that_is_answered_says_so_in_one_line(capsys):
    with serving_grpc(AnsweringTriton()) as url:
        assert main(["probe", "--url", url]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"live: ensemble at {url} answered a one-token generation in ") and not said.err


def test_a_probe_that_nothing_answers_says_not_live(capsys):
    assert main(["probe", "--url", f"127.0.0.1:{free_port()}", "--timeout-s", "5"]) == 1
    said = capsys.readouterr()
    assert said.err.startswith("not live: ") and not said.out

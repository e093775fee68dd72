"""`tritonforge serve`'s flags come from ServeOptions' fields: one default for each, whatever reads it."""

import dataclasses

import pytest

from tritonforge.cli import make_parser
from tritonforge.facts.settings import given
from tritonforge.serve.options import ServeOptions


def test_serve_options_not_given_keep_the_dataclass_defaults_and_given_ones_are_parsed():
    args = make_parser().parse_args(["serve", "repo", "--grpc-port", "9001", "--open-apis",
                                     "--openai-model", "ensemble"])
    options = ServeOptions(**given(args, ServeOptions))
    assert options == dataclasses.replace(ServeOptions(), grpc_port=9001, open_apis=True, openai_model="ensemble")
    assert set(given(args, ServeOptions)) == {"grpc_port", "open_apis", "openai_model"}


@pytest.mark.parametrize("flags", [["--http-port", "70000"], ["--metrics-port", "x"], ["--openai-model", "other"]])
def test_a_bad_serve_flag_is_refused_by_the_parser(flags, capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "repo", *flags])
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize(("text", "port"), [("1", 1), ("65535", 65535)])
def test_the_ends_of_the_port_range_are_ports(text, port):
    assert make_parser().parse_args(["serve", "repo", "--http-port", text]).http_port == port


@pytest.mark.parametrize("text", ["0", "65536", "-1"])
def test_a_number_outside_the_port_range_is_refused_in_one_line(text, capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "repo", "--http-port", text])
    assert f"--http-port: expected a port in 1..65535, got {text}" in capsys.readouterr().err


@pytest.mark.parametrize("flags, line", [
    (["--http-port", "8100", "--grpc-port", "8100"], "--grpc-port 8100 is also --http-port"),
    (["--metrics-port", "8000"], "--metrics-port 8000 is also --http-port"),
    (["--openai-port", "8001"], "--openai-port 8001 is also --grpc-port"),
])
def test_two_endpoints_on_one_port_are_refused_naming_both_flags(flags, line):
    """Before anything starts: tritonserver would exit with its usage text, the OpenAI gateway after the load."""
    with pytest.raises(ValueError, match=f"^{line}: give each its own port$"):
        ServeOptions(**given(make_parser().parse_args(["serve", "repo", *flags]), ServeOptions))


def test_a_server_started_from_python_on_one_port_twice_is_refused_before_it_runs(tmp_path):
    from tritonforge.serve.server import TritonServer

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.pbtxt").write_text("")
    server = TritonServer(tmp_path, http_port=8100, grpc_port=8100, metrics_port=8102)
    with pytest.raises(ValueError, match="gRPC port 8100 is also HTTP port"):
        server.start()
    assert server.pid is None

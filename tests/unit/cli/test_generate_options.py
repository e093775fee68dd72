"""`tritonforge generate`'s flags come from GenerateOptions' fields; what it sends follows from them."""

import dataclasses

import pytest

from tritonforge.cli import make_parser
from tritonforge.cli.generate import GenerateOptions
from tritonforge.facts.contract import DEFAULT_MAX_TOKENS, MAX_TOKENS, SEED, STOP_WORDS, TEMPERATURE, TOP_K, TOP_P
from tritonforge.facts.settings import given


def options_of(*flags: str) -> GenerateOptions:
    return GenerateOptions(**given(make_parser().parse_args(["generate", "hi", *flags]), GenerateOptions))


def test_a_bare_generate_sends_only_the_default_max_tokens():
    assert options_of() == GenerateOptions()
    assert options_of().parameters() == {MAX_TOKENS: DEFAULT_MAX_TOKENS}


def test_repeated_stop_phrases_are_all_sent_in_order_and_sampling_only_where_given():
    options = options_of("--stop", "END", "--stop", "\n\n", "--temperature", "0.7", "--top-k", "5", "--stream")
    assert options == dataclasses.replace(GenerateOptions(), stop=("END", "\n\n"), temperature=0.7, top_k=5,
                                          stream=True)
    assert options.parameters() == {MAX_TOKENS: DEFAULT_MAX_TOKENS, STOP_WORDS: ["END", "\n\n"], TEMPERATURE: 0.7,
                                    TOP_K: 5}


def test_every_sampling_flag_is_sent():
    options = options_of("--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "42")
    assert options.parameters() == {MAX_TOKENS: DEFAULT_MAX_TOKENS, TEMPERATURE: 0.7, TOP_K: 5, TOP_P: 0.9, SEED: 42}


def test_sampling_flags_given_as_zero_are_sent():
    # --seed 0 is a seed and --temperature 0 is greedy: given, they are sent, not read as absent
    options = options_of("--temperature", "0", "--top-k", "0", "--top-p", "0", "--seed", "0")
    assert options.parameters() == {MAX_TOKENS: DEFAULT_MAX_TOKENS, TEMPERATURE: 0.0, TOP_K: 0, TOP_P: 0.0, SEED: 0}


@pytest.mark.parametrize("flags", [["--max-tokens", "0"], ["--protocol", "udp"], ["--top-k", "many"]])
def test_a_bad_generate_flag_is_refused_by_the_parser(flags, capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["generate", "hi", *flags])
    assert flags[0] in capsys.readouterr().err


def test_help_says_a_temperature_alone_stays_greedy(capsys):
    """The engine samples only with top_k or top_p (runtime/engine/sampling.py): the flag's help says so."""
    with pytest.raises(SystemExit):
        make_parser().parse_args(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--temperature TEMPERATURE sampling temperature (default: none). TensorRT-LLM's semantics: the engine " \
           "samples only with --top-k > 1 or --top-p < 1, so --temperature alone stays greedy" in help_text


@pytest.mark.parametrize("command", [["generate", "hi"], ["probe"], ["bench", "repo"], ["openai"],
                                     ["eval", "--reference", "ckpt"]])
@pytest.mark.parametrize("url, address", [("http://127.0.0.1:8001", "127.0.0.1:8001"),
                                          ("grpc://localhost:8001/", "localhost:8001"), ("[::1]:8001", "[::1]:8001")])
def test_a_url_with_a_scheme_is_taken_as_its_address(command, url, address):
    assert make_parser().parse_args([*command, "--url", url]).url == address


@pytest.mark.parametrize("url", ["https://127.0.0.1:8001", "localhost", "127.0.0.1:8001/v2", "127.0.0.1:port"])
def test_an_address_that_is_not_host_and_port_is_refused_in_one_line(url, capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["generate", "hi", "--url", url])
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"argument --url: expected HOST:PORT, e.g. 127.0.0.1:8001, got {url!r}" in error


@pytest.mark.parametrize(("flags", "greedy"), [(("--temperature", "0.7"), True),
                                              (("--temperature", "0.7", "--top-k", "1"), True),
                                              (("--temperature", "0.7", "--top-p", "1"), True),
                                              (("--temperature", "0.7", "--top-k", "40"), False),
                                              (("--temperature", "0.7", "--top-p", "0.9"), False),
                                              (("--temperature", "0"), False),  # asked for greedy: nothing to say
                                              ((), False)])
def test_a_temperature_that_leaves_the_engine_greedy_is_known_as_such(flags, greedy):
    assert options_of(*flags).stays_greedy() is greedy


def test_generate_with_a_temperature_alone_says_on_stderr_that_it_stays_greedy(monkeypatch, capsys):
    from tritonforge.cli import generate as generate_module
    from tritonforge.cli import main

    class ClientDouble:  # a test double: answers without a server, and records that the command closed it
        closed = False

        def generate(self, prompt, **parameters):
            return "answer"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            ClientDouble.closed = True

    monkeypatch.setattr(generate_module.GenerateOptions, "client", lambda self: ClientDouble())
    assert main(["generate", "hi", "--temperature", "0.7"]) == 0
    assert ClientDouble.closed  # a gRPC channel left open to the interpreter's exit can hold the process there
    said = capsys.readouterr()
    assert said.out == "answer\n"
    assert said.err.startswith("note: --temperature 0.7 alone stays greedy (TensorRT-LLM's semantics)")
    assert "--top-k" in said.err and len(said.err.splitlines()) == 1

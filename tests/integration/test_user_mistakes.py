"""A newcomer's mistakes, made as a user makes them (the `tritonforge` command in a subprocess): each is answered
with one line on stderr that names the problem, exit status 2 (usage) or 1 (runtime), no traceback, within
seconds. None of these needs a running server (tests/integration/test_serve_lifecycle.py has those that do)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.serve.ports import free_port

# Seconds a mistake may take to be answered: starting Python and importing tritonforge and its clients take
# most of it (2-4 s on the loaded 2-core CI machine); a loop or a wait for a server would take far longer.
ANSWER_WITHIN_S = 30
# A failure of the gRPC client to reach a server came out as a traceback in about 4 runs of 5 (a race in its
# error path): this many runs make a regression show.
RACE_RUNS = 5


def tritonforge(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command's result; one that hangs is stopped with SIGABRT, which Python's fault handler (turned on
    here) answers with every thread's stack, so the failure says where it hung."""
    started = time.monotonic()
    command = [sys.executable, "-X", "faulthandler", "-m", "tritonforge.cli", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as process:
        try:
            stdout, stderr = process.communicate(timeout=ANSWER_WITHIN_S * 4)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            stdout, stderr = process.communicate()
            pytest.fail(f"`tritonforge {' '.join(args)}` hung; its threads:\n{stderr}")
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    result.seconds = time.monotonic() - started
    return result


def assert_one_line(result: subprocess.CompletedProcess, status: int, *words: str) -> str:
    """The mistake's answer: `status`, one line on stderr holding `words`, no traceback, in time."""
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert result.seconds < ANSWER_WITHIN_S, result.seconds
    return lines[0]


def without_perf_analyzer() -> str:
    """PATH without the folders that hold perf_analyzer (the server's stubs still need the rest, bash first)."""
    return os.pathsep.join(folder for folder in os.environ.get("PATH", "").split(os.pathsep)
                           if folder and not (Path(folder) / "perf_analyzer").exists())


def closed_port() -> int:
    return free_port()  # nothing listens there (free_port closes its socket)


@pytest.mark.parametrize("flags", [(), ("--stream",), ("--protocol", "http")],
                         ids=["grpc", "grpc-stream", "http"])
def test_generate_without_a_server_says_none_answers_every_time(flags):
    port = closed_port()
    for _ in range(RACE_RUNS if flags != ("--protocol", "http") else 1):
        result = tritonforge("generate", "hi", "--url", f"127.0.0.1:{port}", *flags)
        assert_one_line(result, 1, f"no Triton server answers at 127.0.0.1:{port}", "tritonforge serve", "--url")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_generate_at_a_port_where_something_else_answers_says_it_is_not_triton(protocol):
    """The usual slip: the HTTP port given to the gRPC client, or any other web server's port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        result = tritonforge("generate", "hi", "--protocol", protocol, "--url", url)
    finally:
        server.shutdown()
    assert_one_line(result, 1, f"no Triton server answers at {url}")


def test_probe_without_a_server_is_not_live_naming_the_address():
    port = closed_port()
    result = tritonforge("probe", "--url", f"127.0.0.1:{port}")
    assert_one_line(result, 1, "not live", f"no Triton server answers at 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def repository(tiny_models, tmp_path_factory) -> Path:
    # The replay engine: no mistake here depends on the tokens, and its server starts without loading torch.
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("mistakes") / "repo",
                              engine="replay", max_input_len=64, max_seq_len=256))


def test_bench_against_a_server_that_is_down_fails_at_once(repository):
    result = tritonforge("bench", str(repository), "--url", f"127.0.0.1:{closed_port()}", "--duration-s", "2")
    assert_one_line(result, 1, "no Triton server answers")


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_perf_analyzer_that_is_not_installed_is_named_before_anything_runs(repository, command):
    before = {path: path.read_text() for path in repository.glob("*/config.pbtxt")}
    environment = {**os.environ, "PATH": without_perf_analyzer()}
    result = tritonforge(command, str(repository), "--tool", "perf_analyzer", env=environment)
    assert_one_line(result, 1, "perf_analyzer is not on PATH", "--tool asyncio")
    assert {path: path.read_text() for path in repository.glob("*/config.pbtxt")} == before


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_serve_refuses_a_path_that_is_neither_repository_nor_checkpoint(tiny_models, tmp_path, kind):
    path = {"missing": tmp_path / "no-such-folder", "empty": tmp_path, "file": tiny_models["bpe"] / "config.json"}[kind]
    result = tritonforge("serve", str(path), "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                         "--metrics-port", str(free_port()))
    assert_one_line(result, 2, str(path))


def test_serve_on_a_port_in_use_says_which_before_starting_anything(repository):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tritonforge("serve", str(repository), "--grpc-port", str(port), "--http-port", str(free_port()),
                             "--metrics-port", str(free_port()))
    assert_one_line(result, 2, f"--grpc-port: 127.0.0.1:{port} is already in use")


@pytest.mark.parametrize("flags, line", [
    (("--http-port", "{a}", "--grpc-port", "{a}", "--metrics-port", "{b}"), "--grpc-port {a} is also --http-port"),
    (("--http-port", "{a}", "--grpc-port", "{b}", "--metrics-port", "{a}"), "--metrics-port {a} is also --http-port"),
    (("--http-port", "{a}", "--grpc-port", "{b}", "--metrics-port", "{c}", "--openai-port", "{a}"),
     "--openai-port {a} is also --http-port"),
], ids=["grpc", "metrics", "openai"])
def test_serve_with_two_endpoints_on_one_port_is_refused_before_anything_starts(repository, flags, line):
    """tritonserver itself exits with its usage text (the reason last); the OpenAI gateway would fail only after
    the server loaded. One stderr line: no "starting tritonserver" before it."""
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    result = tritonforge("serve", str(repository), *(flag.format(**ports) for flag in flags))
    assert_one_line(result, 2, line.format(**ports))


@pytest.fixture(scope="module")
def pytorch_workflow_repository(tiny_models, tmp_path_factory) -> Path:
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("llmapi") / "repo",
                              engine="tensorrtllm-pytorch", max_input_len=64, max_seq_len=256))


def test_serve_of_a_pytorch_workflow_repository_without_tensorrt_llm_says_so_before_starting(
        pytorch_workflow_repository):
    result = tritonforge("serve", str(pytorch_workflow_repository), "--http-port", str(free_port()), "--grpc-port",
                         str(free_port()), "--metrics-port", str(free_port()))
    assert_one_line(result, 1, "tensorrtllm-pytorch engine, and TensorRT-LLM is not installed here",
                    "26.07-trtllm-python-py3")


def test_bench_of_a_checkpoint_suggests_a_build_that_works(tiny_models, tmp_path):
    """`serve` builds a checkpoint's repository itself (test_serve_lifecycle.py); the commands that measure a
    repository name the build that makes one."""
    checkpoint = tiny_models["bpe"]
    line = assert_one_line(tritonforge("bench", str(checkpoint)), 2, "is a Hugging Face checkpoint")
    suggested = line.split("`")[1].split()
    assert suggested[:2] == ["tritonforge", "build"], line
    started = time.monotonic()
    built = subprocess.run([sys.executable, "-m", "tritonforge.cli", *suggested[1:]], cwd=tmp_path,
                           capture_output=True, text=True, timeout=ANSWER_WITHIN_S * 4)
    assert built.returncode == 0, (line, built.stderr, time.monotonic() - started)
    from tritonforge.serve.repository import check_repository

    assert check_repository(tmp_path / suggested[suggested.index("--output") + 1])


def test_eval_without_a_server_says_none_answers_before_loading_the_reference(tiny_models):
    port = closed_port()
    result = tritonforge("eval", "--url", f"127.0.0.1:{port}", "--reference", str(tiny_models["bpe"]))
    assert_one_line(result, 1, f"no Triton server answers at 127.0.0.1:{port}", "tritonforge serve")


def test_eval_names_a_missing_or_malformed_prompt_file_and_its_line(tiny_models, tmp_path):
    reference = str(tiny_models["bpe"])
    missing = tmp_path / "missing.jsonl"
    assert_one_line(tritonforge("eval", "--url", "127.0.0.1:1", "--reference", reference, "--prompts", str(missing)),
                    2, f"{missing}: no such file")
    malformed = tmp_path / "prompts.jsonl"
    malformed.write_text('{"prompt": "The server"}\n{"prompt": "The"\n')
    assert_one_line(tritonforge("eval", "--url", "127.0.0.1:1", "--reference", reference, "--prompts",
                                str(malformed)), 2, f"{malformed}:2: not JSON")


def test_demo_into_a_folder_of_other_files_is_refused_before_it_makes_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("not the demo's")
    result = tritonforge("demo", "--output", str(tmp_path))
    assert_one_line(result, 2, f"{tmp_path} is not empty")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_bad_flag_values_are_one_line_usage_errors(repository):
    assert_one_line(tritonforge("serve", str(repository), "--http-port", "99999"), 2, "--http-port")
    assert_one_line(tritonforge("generate", "hi", "--max-tokens", "0"), 2, "--max-tokens")
    assert_one_line(tritonforge("bench", str(repository), "--paths", "nope"), 2, "--paths")
    assert_one_line(tritonforge("generate", "hi", "--protocol", "http", "--url", "localhost:http"), 2, "localhost:http")
    assert_one_line(tritonforge(), 2, "COMMAND")


@pytest.mark.parametrize("missing", ["weights", "tokenizer", "config"])
def test_build_checks_the_checkpoint_before_it_writes_and_a_fixed_one_builds(tiny_models, tmp_path, missing):
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "repo"
    checkpoint.mkdir()
    patterns = {"weights": ("*.safetensors",), "tokenizer": ("tokenizer*", "special_tokens_map.json", "*.model",
                                                              "vocab.json", "merges.txt"),
                "config": ("config.json",)}[missing]
    left_out = {path.name for pattern in patterns for path in tiny_models["bpe"].glob(pattern)}
    for file in tiny_models["bpe"].iterdir():
        if file.name not in left_out:
            (checkpoint / file.name).write_bytes(file.read_bytes())
    result = tritonforge("build", "--model", str(checkpoint), "--output", str(output))
    assert_one_line(result, 2, str(checkpoint), {"weights": "weights", "tokenizer": "tokenizer",
                                                 "config": "config.json"}[missing])
    assert not output.exists(), "a refused build wrote something"
    for name in left_out:
        (checkpoint / name).write_bytes((tiny_models["bpe"] / name).read_bytes())
    result = tritonforge("build", "--model", str(checkpoint), "--output", str(output), "--max-input-len", "64",
                         "--max-seq-len", "256")
    assert result.returncode == 0, result.stderr
    assert json.loads((output / "tritonforge.json").read_text())["files"]


def test_a_build_that_fails_while_writing_removes_what_it_wrote(tiny_models, tmp_path, monkeypatch):
    """The disk filling up while the weights are copied: nothing of the build is left, so a retry needs no
    --force and is not refused."""
    import shutil

    from tritonforge.builder import repository as repository_module

    output = tmp_path / "repo"
    real_copy = shutil.copy2

    def copy_until_the_weights(source, target):
        if str(source).endswith(".safetensors"):
            raise OSError(28, "No space left on device")
        return real_copy(source, target)

    monkeypatch.setattr(repository_module.shutil, "copy2", copy_until_the_weights)
    with pytest.raises(OSError, match="No space left"):
        build(BuildOptions(model=tiny_models["bpe"], output=output, max_input_len=64, max_seq_len=256))
    assert not output.exists()
    monkeypatch.setattr(repository_module.shutil, "copy2", real_copy)
    build(BuildOptions(model=tiny_models["bpe"], output=output, max_input_len=64, max_seq_len=256))
    assert (output / "tensorrt_llm" / "1" / "checkpoint").is_dir()


def test_a_failed_build_keeps_what_was_in_the_folder_before(tiny_models, tmp_path, monkeypatch):
    from tritonforge.builder import repository as repository_module

    output = tmp_path / "repo"
    output.mkdir()
    (output / "README.txt").write_text("not the build's")

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repository_module.shutil, "copy2", fail)
    with pytest.raises(OSError):
        build(BuildOptions(model=tiny_models["bpe"], output=output, max_input_len=64, max_seq_len=256))
    assert sorted(path.name for path in output.iterdir()) == ["README.txt"]


def test_version_and_every_option_has_help_with_its_default():
    result = tritonforge("--version")
    assert result.returncode == 0 and result.stdout.startswith("tritonforge "), result
    from tritonforge.cli import make_parser

    parser = make_parser()
    subcommands = next(action for action in parser._actions if action.dest == "command").choices
    for name, subparser in subcommands.items():
        for action in subparser._actions:
            if action.dest == "help":
                continue
            assert action.help, f"tritonforge {name} {action.option_strings or action.dest} has no help"
    serve_help = tritonforge("serve", "--help").stdout
    for default in ("(default: 127.0.0.1)", "(default: 8000)", "(default: 8001)", "(default: 8002)",
                    "(default: 0)"):
        assert default in " ".join(serve_help.split()), default


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_gateway_in_front_of_a_triton_that_is_down_answers_503_and_another_model_404():
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "tritonforge.cli", "openai", "--url",
                                f"127.0.0.1:{closed_port()}", "--port", str(port)],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert "OpenAI API on" in gateway.stderr.readline()  # printed before uvicorn starts listening
        deadline = time.monotonic() + ANSWER_WITHIN_S
        while True:  # until it listens: each attempt is refused at once before then
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the gateway did not listen"
                time.sleep(0.05)  # polling for the port to open, not a wait for an event that has no signal
        base = f"http://127.0.0.1:{port}/v1"
        for body in ({"model": "tritonforge", "prompt": "hi", "max_tokens": 2},
                     {"model": "tritonforge", "prompt": "hi", "max_tokens": 2, "stream": True}):
            status, answer = post(f"{base}/completions", body)
            assert status == 503, answer
            assert answer["error"]["type"] == "server_error", answer
            assert "no Triton server answers" in answer["error"]["message"], answer
        status, answer = post(f"{base}/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user",
                                                                                           "content": "hi"}]})
        assert status == 404 and answer["error"]["code"] == "model_not_found" and answer["error"]["param"] == "model"
    finally:
        gateway.terminate()
        log = gateway.communicate(timeout=30)[1]
    assert "Traceback" not in log, log
    assert log.count("answering 503") == 2, log  # one line per request


def test_build_engine_py_under_a_python_without_the_packages_says_which_python_to_use():
    """`python build_engine.py` with the system's Python (-S: without this environment's packages)."""
    script = Path(__file__).resolve().parents[2] / "build_engine.py"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-S", str(script), "--help"], capture_output=True, text=True,
                            timeout=ANSWER_WITHIN_S)
    result.seconds = time.monotonic() - started
    assert_one_line(result, 1, ".venv/bin/python build_engine.py", "scripts/bootstrap.sh")


def test_tune_puts_the_configs_back_when_a_measurement_fails(repository, monkeypatch):
    """The issue's run, through the library (which does not check the tool first): the first candidate is
    written and served, then perf_analyzer is not found; the configs are the repository's again, not the
    candidate's."""
    from tritonforge.tools.tuning import Candidate, current, tune

    monkeypatch.setenv("PATH", without_perf_analyzer())
    before = {path: path.read_text() for path in repository.glob("*/config.pbtxt")}
    # Other counts than the repository's (2 / 2 / 1), and few instances, so that the server starts soon.
    candidate = Candidate(preprocessing=1, postprocessing=1, bls=1, postprocessing_delay_us=0)
    assert current(repository) != candidate
    with pytest.raises(FileNotFoundError, match="perf_analyzer"):
        tune(repository, [candidate], concurrency=1, duration_s=0.2, tool="perf_analyzer")
    assert {path: path.read_text() for path in repository.glob("*/config.pbtxt")} == before


def test_make_tiny_model_never_writes_over_a_folder_that_holds_files(tiny_models):
    checkpoint = tiny_models["bpe"]
    before = {path.name: path.read_bytes() for path in checkpoint.iterdir()}
    assert_one_line(tritonforge("make-tiny-model", str(checkpoint)), 2, str(checkpoint), "new folder")
    assert {path.name: path.read_bytes() for path in checkpoint.iterdir()} == before

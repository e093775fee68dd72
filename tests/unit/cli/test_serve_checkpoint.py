"""`tritonforge serve CHECKPOINT`: it takes `build`'s flags (but those the cache decides), builds once into the
cache and reuses that build, keeps no build that failed its gate, and refuses what cannot work before it builds.
The build and the server are stand-ins here; tests/integration/test_serve_lifecycle.py runs both for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.builder.manifest import MANIFEST
from tritonforge.cli import build as build_module
from tritonforge.cli import main, make_parser
from tritonforge.cli import serve as serve_module
from tritonforge.cli.build import build_options, gate_options
from tritonforge.cli.reference_docs import subcommands
from tritonforge.serve.ports import free_port
from tritonforge.tools.accuracy_gate import AccuracyGateFailed


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 300}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def ports() -> list[str]:
    return ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]


def one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def flags_of(command: str) -> set[str]:
    commands, _ = subcommands(make_parser())
    return {flag for action in commands[command]._actions for flag in action.option_strings}


def test_serve_takes_every_build_flag_but_those_the_cache_decides():
    build, serve = flags_of("build"), flags_of("serve")
    assert build - serve == {"--model", "--output", "--force", "--dry-run"}
    assert "--cache-dir" in serve


def test_a_build_flag_given_to_serve_lands_on_the_field_it_does_for_build(checkpoint):
    flags = ["--engine", "replay", "--replay-step-ms", "20", "--max-input-len", "64", "--frontends", "bls",
             "--triton-max-batch-size", "16", "--preprocessing-instances", "1", "--accuracy-gate", "prompts.jsonl"]
    served = make_parser().parse_args(["serve", str(checkpoint), *flags])
    built = make_parser().parse_args(["build", "--model", str(checkpoint), *flags])
    assert build_options(served, model=checkpoint) == build_options(built)
    assert gate_options(served) == gate_options(built)


class StandIns:
    """The build and the server replaced: records each build, stops `serve` once it knows its repository."""

    def __init__(self, monkeypatch, *, gate_fails: bool = False):
        self.builds, self.served = [], []
        self.gate_fails = gate_fails
        monkeypatch.setattr(build_module, "build_repository", self.build)
        monkeypatch.setattr(serve_module, "check_repository_engine", self.serve)

    def build(self, options, gate, *, tritonserver=None):
        self.builds.append((options, gate, tritonserver))
        (options.output / "ensemble").mkdir()
        (options.output / "ensemble" / "config.pbtxt").write_text("")
        (options.output / MANIFEST).write_text("{}")  # written last, as the build does
        if self.gate_fails:
            raise AccuracyGateFailed("the engine failed the accuracy gate (...); the repository is marked not ready",
                                     ("greedy agreement 0.500 < 0.9",))
        return options.output

    def serve(self, repository):
        self.served.append(repository)
        raise KeyboardInterrupt  # where the server would start


def test_a_checkpoint_is_built_into_the_cache_once_and_the_next_serve_says_it_reuses_that_folder(
        checkpoint, tmp_path, monkeypatch, capsys):
    stand_ins = StandIns(monkeypatch)
    command = ["serve", str(checkpoint), "--cache-dir", str(tmp_path / "cache"), "--engine", "replay",
               "--tritonserver", "/opt/tritonserver/bin/tritonserver", *ports()]
    assert main(command) == 130
    [(options, _, tritonserver)] = stand_ins.builds
    [repository] = stand_ins.served
    assert repository.parent == tmp_path / "cache" and (repository / MANIFEST).is_file()
    assert options.output.parent == repository.parent and options.output.name.startswith(f".{repository.name}.")
    assert options.engine == "replay" and options.model == checkpoint
    assert tritonserver == "/opt/tritonserver/bin/tritonserver"  # the gate serves with serve's tritonserver
    assert "building the repository of" in capsys.readouterr().err

    assert main(command) == 130
    assert len(stand_ins.builds) == 1 and stand_ins.served == [repository, repository]
    said = capsys.readouterr().err
    assert f"reusing {repository}:" in said and "building" not in said

    assert main([*command, "--max-batch-size", "4"]) == 130  # another option: another build, another folder
    assert len(stand_ins.builds) == 2 and stand_ins.served[-1] != repository


def test_a_build_that_fails_its_gate_is_not_kept_and_the_line_says_so(checkpoint, tmp_path, monkeypatch, capsys):
    stand_ins = StandIns(monkeypatch, gate_fails=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The"}\n')
    cache = tmp_path / "cache"
    assert main(["serve", str(checkpoint), "--cache-dir", str(cache), "--accuracy-gate", str(prompts),
                 *ports()]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the engine failed the accuracy gate (greedy agreement 0.500 < 0.9); its build was " \
        "not kept" in errors[0], errors
    assert list(cache.iterdir()) == [] and not stand_ins.served


@pytest.mark.parametrize("flags", [["--engine", "replay"], ["--cache-dir", "somewhere"],
                                   ["--preprocessing-instances", "1"], ["--accuracy-gate", "prompts.jsonl"]])
def test_a_repository_given_build_flags_is_refused_naming_them(tmp_path, capsys, flags):
    (tmp_path / "ensemble").mkdir()
    (tmp_path / "ensemble" / "config.pbtxt").write_text("")
    assert main(["serve", str(tmp_path), *flags, *ports()]) == 2
    line = one_line(capsys)
    assert line.startswith(f"error: {flags[0]}: build options, for a checkpoint; {tmp_path} is a built repository")


@pytest.mark.parametrize(("kind", "problem"), [("missing", "does not exist"), ("file", "is not a folder"),
                                               ("empty", "is neither a model repository"),
                                               ("other files", "is neither a model repository")])
def test_a_path_that_is_neither_repository_nor_checkpoint_gets_one_line_naming_it(tmp_path, capsys, kind, problem):
    path = tmp_path / "path"
    if kind == "file":
        path.write_text("")
    elif kind != "missing":
        path.mkdir()
    if kind == "other files":
        (path / "notes.txt").write_text("")
    assert main(["serve", str(path), *ports()]) == 2
    line = one_line(capsys)
    assert line.startswith(f"error: {path} {problem}") and "a Hugging Face checkpoint" in line, line


def test_an_openai_model_the_build_leaves_out_is_refused_before_building(checkpoint, tmp_path, monkeypatch, capsys):
    stand_ins = StandIns(monkeypatch)
    assert main(["serve", str(checkpoint), "--cache-dir", str(tmp_path / "cache"), "--frontends", "ensemble",
                 "--openai-port", str(free_port()), *ports()]) == 2
    assert "--openai-model tensorrt_llm_bls is not built with --frontends ensemble" in one_line(capsys)
    assert not stand_ins.builds and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("engine", ["tensorrtllm-pytorch", "tensorrtllm"])
def test_an_engine_whose_tensorrt_llm_is_missing_is_refused_before_building(engine, checkpoint, tmp_path,
                                                                            monkeypatch, capsys):
    """Both TensorRT-LLM engines need it to serve (and the engine build to build): a serve of the checkpoint says so
    first, and builds nothing into the cache (it once built for half a minute, kept the folder, then refused)."""
    stand_ins = StandIns(monkeypatch)
    assert main(["serve", str(checkpoint), "--cache-dir", str(tmp_path / "cache"), "--engine", engine,
                 *ports()]) == 1
    line = one_line(capsys)
    assert "TensorRT-LLM" in line and "not installed here" in line and "26.07-trtllm-python-py3" in line, line
    assert not stand_ins.builds and not (tmp_path / "cache").exists()


def test_a_cache_dir_inside_the_checkpoint_is_refused(checkpoint, monkeypatch, capsys):
    stand_ins = StandIns(monkeypatch)
    assert main(["serve", str(checkpoint), "--cache-dir", str(checkpoint / "cache"), *ports()]) == 2
    assert f"--cache-dir {checkpoint / 'cache'} is inside the checkpoint" in one_line(capsys)
    assert not stand_ins.builds and not (checkpoint / "cache").exists()


# Run in a process of its own: the test process has torch loaded, where marking it absent changes nothing.
BUILD_THEN_IMPORT_XGRAMMAR = """
import sys
from pathlib import Path
from tritonforge.builder.options import BuildOptions
from tritonforge.cli.build import build_repository
from tritonforge.tools.accuracy_gate import GateOptions
build_repository(BuildOptions(model=Path(sys.argv[1]), output=Path(sys.argv[2])), GateOptions())
assert "torch" not in sys.modules, "the build loaded torch, or left it marked absent"
import xgrammar  # the gateway's grammars: xgrammar imports torch
print(xgrammar.Grammar.from_json_schema('{"type": "object"}') is not None)
"""


def test_a_process_that_built_a_repository_imports_torch_afterwards(tiny_models, tmp_path):
    """`serve CHECKPOINT --openai-port` builds in its own process, then its gateway writes grammars with xgrammar:
    the build marks torch absent (it only tokenizes) and must not leave it so, or every guided request failed."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", BUILD_THEN_IMPORT_XGRAMMAR, str(tiny_models["bpe"]),
                             str(tmp_path / "repo")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("True"), result.stderr[-2000:]

"""Every command the README and the docs print uses only flags its program has.

The shell lines are read from whatever README.md and docs/ hold now: indented code lines, fenced bash blocks
(continuation lines joined) and inline code spans that start with one of our commands. Each command is checked
against the parser that would run it: a `tritonforge` subcommand's (also behind `python build_engine.py`,
`bash scripts/demo.sh` and the Docker image, whose entry point is `tritonforge`), a bench script's (from its
`--help`), and `bench/gpu.sh`'s own flags plus those of the bench script it forwards the rest to.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tritonforge.builder.repository import SOURCE_ROOT
from tritonforge.cli import make_parser
from tritonforge.cli.reference_docs import subcommands

DOCUMENTS = [SOURCE_ROOT / "README.md", *sorted((SOURCE_ROOT / "docs").rglob("*.md"))]
COMMAND_START = re.compile(r"^(\.venv/bin/tritonforge|tritonforge|\.venv/bin/python3?|python3?|bash|docker) ")
FENCE = re.compile(r"^\s*```(\w*)")
SHELL_FENCES = {"bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", "|", ";"}
GPU_SH = "bench/gpu.sh"
# Scripts that hand their arguments to a tritonforge command; scripts/test.sh hands them to pytest (not checked).
SCRIPT_COMMANDS = {"scripts/demo.sh": "demo", "build_engine.py": "build"}
UNCHECKED_SCRIPTS = {"scripts/test.sh"}
PYTHON_OPTIONS = {"-u", "-B", "-O"}  # the interpreter's own, before the script


# --- reading commands out of Markdown ----------------------------------------------------------------------------

def _join_continuations(lines: list[str]) -> list[str]:
    joined, pending = [], ""
    for line in lines:
        line = line.strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    return joined


def shell_commands(markdown: str) -> list[str]:
    """The commands of `markdown` that start with one of ours, continuation lines joined, in order."""
    blocks: list[list[str]] = []  # runs of consecutive code lines
    prose: list[str] = []
    fence: str | None = None
    prose_since_block = True
    for line in markdown.splitlines():
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
                blocks.append([])
            else:
                fence = None
            continue
        if fence is not None:
            if fence in SHELL_FENCES:
                blocks[-1].append(line)
        elif line.startswith("    ") and line.strip():
            if not blocks or prose_since_block:
                blocks.append([])
            blocks[-1].append(line)
            prose_since_block = False
            continue
        else:
            prose.append(line)
        prose_since_block = True
    commands = [command.removeprefix("$ ") for block in blocks for command in _join_continuations(block)]
    spans = re.findall(r"`([^`]+)`", "\n".join(prose))
    commands += [" ".join(span.split()) for span in spans]
    return [command for command in commands if COMMAND_START.match(command)]


def _split(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at && || | ;), each a list of words, comments dropped."""
    words = shlex.split(command, comments=True)
    parts: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def _flags(words: list[str]) -> list[str]:
    """The long flags among `words`, as written (`[--prompts` → `--prompts`, `--x=1` → `--x`)."""
    flags = []
    for word in words:
        word = word.strip("[]")
        if word == "--":
            break
        if word.startswith("--"):
            flags.append(word.split("=", 1)[0])
    return flags


# --- the flags each program has ----------------------------------------------------------------------------------

@functools.cache
def _tritonforge() -> tuple[set[str], dict[str, set[str]]]:
    parser = make_parser()
    commands, _ = subcommands(parser)
    return _option_strings(parser), {name: _option_strings(command) for name, command in commands.items()}


def _option_strings(parser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@functools.cache
def script_flags(script: str) -> frozenset[str]:
    """The flags a bench script's argparse parser has, read from its `--help`; a script without argparse has none."""
    path = SOURCE_ROOT / script
    if "argparse" not in path.read_text():
        return frozenset()  # --help would run it
    result = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120,
                            cwd=SOURCE_ROOT)
    assert result.returncode == 0, f"{script} --help failed:\n{result.stderr}"
    flags = set()
    for line in result.stdout.splitlines():
        if line.startswith("  ") and line.strip().startswith("-"):
            invocation = re.split(r"\s{2,}", line.strip())[0]  # "--name NAME" before the help text
            flags.update(re.findall(r"--[\w-]+", invocation))
    return frozenset(flags)


GPU_SH_GATEWAY = "--gateway"  # gpu.sh's mode that runs bench/gateway.py instead of bench/pipeline.py


@functools.cache
def gpu_sh_flags(gateway: bool = False) -> tuple[frozenset[str], str]:
    """bench/gpu.sh's own flags (the ones it tests `$1` for) and the bench script it forwards the others to:
    bench/gateway.py in its --gateway mode, bench/pipeline.py otherwise."""
    source = (SOURCE_ROOT / GPU_SH).read_text()
    own = frozenset(re.findall(r'"\$\{1:-\}" = "(--[\w-]+)"', source))
    forwarded = set(re.findall(r"python3? -u (bench/\w+\.py)", source))
    assert GPU_SH_GATEWAY in own and forwarded == {"bench/gateway.py", "bench/pipeline.py"}, (
        f"{GPU_SH}: cannot tell its flags or the scripts it runs")
    return own, "bench/gateway.py" if gateway else "bench/pipeline.py"


# Other GPU scripts that take flags of their own (tested as `$1`) and hand the rest to one bench script.
FORWARDING_SCRIPTS = {"bench/gpu_text_backends.sh": "bench/pipeline.py"}
# GPU scripts that take positional arguments and hand the rest to bench/gpu.sh (each run of it).
GPU_SH_WRAPPERS = {"bench/gpu_coalescer.sh"}


@functools.cache
def forwarding_flags(script: str) -> frozenset[str]:
    source = (SOURCE_ROOT / script).read_text()
    own = frozenset(re.findall(r'"\$\{1:-\}" = "(--[\w-]+)"', source))
    assert own and f"python3 -u {FORWARDING_SCRIPTS[script]}" in source, f"{script}: cannot tell its flags"
    return own


def problems(command: str) -> list[str]:
    """What is wrong with one documented command: unknown commands and flags."""
    try:
        parts = _split(command)
    except ValueError as error:
        return [f"not a shell command ({error})"]
    found = []
    for words in parts:
        found += _check(words)
    return found


def _check(words: list[str]) -> list[str]:
    program, args = words[0], words[1:]
    global_flags, commands = _tritonforge()
    if Path(program).name == "tritonforge" and program in ("tritonforge", ".venv/bin/tritonforge"):
        return _check_tritonforge(args)
    if Path(program).name.startswith("python") and args:
        while len(args) > 1 and args[0] in PYTHON_OPTIONS:
            args = args[1:]
        script, rest = args[0], args[1:]
        if script in SCRIPT_COMMANDS:
            return _check_tritonforge([SCRIPT_COMMANDS[script], *rest])
        if script.startswith("bench/"):
            return [f"{script}: no {flag}" for flag in _flags(rest) if flag not in script_flags(script)]
        return []
    if program == "bash" and args:
        script, rest = args[0], args[1:]
        if script == GPU_SH:
            own, forwarded = gpu_sh_flags(GPU_SH_GATEWAY in rest)
            return [f"{script}: no {flag} (nor {forwarded})" for flag in _flags(rest)
                    if flag not in own | script_flags(forwarded)]
        if script in GPU_SH_WRAPPERS:
            assert f"bash {GPU_SH} " in (SOURCE_ROOT / script).read_text(), f"{script}: does not run {GPU_SH}"
            own, forwarded = gpu_sh_flags(False)
            return [f"{script}: no {flag} (nor {GPU_SH}, {forwarded})" for flag in _flags(rest)
                    if flag not in own | script_flags(forwarded)]
        if script in FORWARDING_SCRIPTS:
            forwarded = FORWARDING_SCRIPTS[script]
            return [f"{script}: no {flag} (nor {forwarded})" for flag in _flags(rest)
                    if flag not in forwarding_flags(script) | script_flags(forwarded)]
        if script in SCRIPT_COMMANDS:
            return _check_tritonforge([SCRIPT_COMMANDS[script], *rest])
        if script in UNCHECKED_SCRIPTS:
            return []
        return [f"{script}: takes no {flag}" for flag in _flags(rest)]
    if program == "docker" and "tritonforge" in args:
        # `docker run ... tritonforge COMMAND ...`: the image's entry point is tritonforge
        after = args[args.index("tritonforge") + 1:]
        if after and after[0] in commands:
            return _check_tritonforge(after)
    return []


def _check_tritonforge(args: list[str]) -> list[str]:
    global_flags, commands = _tritonforge()
    while args and args[0] in global_flags:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        return []
    name = args[0]
    if name not in commands:
        return [f"tritonforge has no command {name!r}"]
    return [f"tritonforge {name}: no {flag}" for flag in _flags(args[1:]) if flag not in commands[name]]


# --- the tests ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(SOURCE_ROOT)))
def test_every_flag_of_a_documented_command_exists(document):
    wrong = {command: found for command in shell_commands(document.read_text()) if (found := problems(command))}
    assert not wrong, "\n".join(f"{command}\n    {'; '.join(found)}" for command, found in wrong.items())


def test_the_readme_has_commands_to_check():
    commands = shell_commands((SOURCE_ROOT / "README.md").read_text())
    assert any(command.split()[0].endswith("tritonforge") for command in commands), commands


SECOND_TERMINAL = "from a second terminal:"


def _second_terminal_block(markdown: str) -> list[str]:
    """The indented lines right after the prose that sends the reader to a second terminal."""
    block = []
    for line in markdown.split(SECOND_TERMINAL, 1)[1].splitlines()[1:]:
        if line.startswith("    "):
            block.append(line.strip())
        elif line.strip() or block:
            break
    return block


@pytest.mark.parametrize("document", ["README.md", "docs/guides/quickstart.md"])
def test_the_second_terminal_talks_to_the_serve_the_first_started(document):
    """A second `serve` there would find the first one's ports taken."""
    block = _second_terminal_block((SOURCE_ROOT / document).read_text())
    assert block and not [line for line in block if re.search(r"tritonforge serve\b", line)], block


SAMPLE = """\
Run it:

    .venv/bin/tritonforge serve model_repository --open-apis   # a comment --not-a-flag
    python build_engine.py --model /m \\
        --engine tensorrtllm --dry-run

```bash
$ bash bench/gpu.sh "$OUT" --step-ms 4.25 --concurrency 128,256
docker run --rm --gpus all -v "$PWD:/models" tritonforge \\
    serve /models --address 0.0.0.0
```

```python
tritonforge serve --not-shell
```

Inline, `tritonforge probe --url
localhost:8001` and `serve --log-file` (no program), and a layout line:

    tritonforge/runtime/engine/replay/        replay_backend.cc     the build's
"""


def test_commands_are_read_from_indented_lines_fenced_bash_and_inline_spans():
    assert shell_commands(SAMPLE) == [
        ".venv/bin/tritonforge serve model_repository --open-apis   # a comment --not-a-flag",
        "python build_engine.py --model /m --engine tensorrtllm --dry-run",
        'bash bench/gpu.sh "$OUT" --step-ms 4.25 --concurrency 128,256',
        'docker run --rm --gpus all -v "$PWD:/models" tritonforge serve /models --address 0.0.0.0',
        "tritonforge probe --url localhost:8001",
    ]
    assert [problems(command) for command in shell_commands(SAMPLE)] == [[]] * 5


def test_a_flag_no_parser_has_is_reported_for_each_kind_of_command():
    assert problems("tritonforge serve repo --open-api") == ["tritonforge serve: no --open-api"]
    assert problems("tritonforge frobnicate") == ["tritonforge has no command 'frobnicate'"]
    assert problems("python build_engine.py --model m --tp 2") == ["tritonforge build: no --tp"]
    assert problems("bash scripts/demo.sh --promt hi") == ["tritonforge demo: no --promt"]
    assert problems("bash bench/gpu.sh out --step 4.25") == ["bench/gpu.sh: no --step (nor bench/pipeline.py)"]
    assert problems(".venv/bin/python bench/gateway.py --gateway-modle ensemble") == [
        "bench/gateway.py: no --gateway-modle"]
    assert problems("python3 -u bench/pipeline.py --engine replay") == ["bench/pipeline.py: no --engine"]
    assert problems("docker run --rm img:1 tritonforge build --model /m --tpsize 2") == [
        "tritonforge build: no --tpsize"]
    assert problems("bash scripts/bootstrap.sh --fast") == ["scripts/bootstrap.sh: takes no --fast"]


def test_gpu_sh_accepts_its_own_flags_and_the_pipeline_scripts():
    own, forwarded = gpu_sh_flags()
    assert {"--step-ms", "--unordered"} <= own and forwarded == "bench/pipeline.py"
    assert problems("bash bench/gpu.sh out --unordered --stream-interval 3 --name x") == []
    assert problems("bash bench/gpu.sh out --gateway --gateway-model ensemble") == []
    assert problems('bash bench/gpu_coalescer.sh out 2.125 --stream-interval 3') == []
    assert problems('bash bench/gpu_coalescer.sh out 2.125 --streams 3') == [
        "bench/gpu_coalescer.sh: no --streams (nor bench/gpu.sh, bench/pipeline.py)"]
    assert problems("bash bench/gpu.sh out --gateway --paths bls") == [
        "bench/gpu.sh: no --paths (nor bench/gateway.py)"]

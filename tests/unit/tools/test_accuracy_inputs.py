"""What `tritonforge eval` checks before it loads the reference model: its prompt files (a mistake named by file
and line) and the server (no server, or not a gRPC one, named at once)."""

from pathlib import Path

import pytest

from tritonforge.clients.client import ServerUnavailable
from tritonforge.serve.ports import free_port
from tritonforge.tools.accuracy import load_jsonl, run_eval


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "a"}\n{"prompt": "b"\n', r"^{path}:2: not JSON \(Expecting ',' delimiter, column 15\)$"),
    ('{"prompt": "a"}\n\n["prompt"]\n', r"^{path}:3: expected a JSON object with \['prompt'\], got list$"),
    ('{"text": "a"}\n', r"^{path}:1: missing \['prompt'\]$"),
    ("\n\n", r"^{path} holds no rows$"),
])
def test_a_malformed_prompt_file_is_named_with_its_line(tmp_path, text, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message.format(path=path)):
        load_jsonl(path, ("prompt",))


def test_a_missing_prompt_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'missing.jsonl'}: no such file"):
        load_jsonl(tmp_path / "missing.jsonl", ("prompt",))


def test_eval_without_a_server_says_so_before_it_loads_the_reference(tmp_path):
    """The reference here does not exist: loading it would fail otherwise, after seconds of loading torch."""
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=f"^no Triton server answers at {url}"):
        run_eval(url, tmp_path / "no-checkpoint", Path(tmp_path / "no-tokenizer"))

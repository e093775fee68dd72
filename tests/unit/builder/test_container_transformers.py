"""The tokenizer a build writes, read by the transformers of NVIDIA's container the way NVIDIA's models read it.

The build runs on transformers 5; NVIDIA's preprocessing and postprocessing load the repository's tokenizer
with `AutoTokenizer.from_pretrained(tokenizer_dir, legacy=False, padding_side="left", trust_remote_code=True)`
under the container's transformers 4.56. scripts/test.sh installs those packages beside .venv and names the
folder in TRITONFORGE_CONTAINER_TRANSFORMERS.
"""

import json
import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import TOKENIZER_SUBDIR

OVERLAY = os.environ.get("TRITONFORGE_CONTAINER_TRANSFORMERS")
TEXTS = ["Hello world, this is a test.", "naïve café — 東京 🙂", "  spaces  and\nnewlines\t"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]

READ_AS_NVIDIA = """
import json, sys, transformers
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], legacy=False, padding_side="left", trust_remote_code=True)
texts, messages = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({"version": transformers.__version__,
                  "ids": [tokenizer.encode(text, add_special_tokens=False) for text in texts],
                  "chat": tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                  "eos": tokenizer.eos_token_id}))
"""


@pytest.mark.skipif(not OVERLAY, reason="needs transformers 4.56 (NVIDIA's container's), installed by scripts/test.sh")
@pytest.mark.parametrize("family", ["bpe", "sentencepiece"])
def test_the_container_transformers_reads_the_built_tokenizer_as_ours_does(tiny_models, tmp_path, family):
    repo = build(BuildOptions(model=tiny_models[family], output=tmp_path / "repo", max_input_len=64,
                              max_seq_len=256))
    tokenizer_dir = repo / "preprocessing" / TOKENIZER_SUBDIR
    result = subprocess.run([sys.executable, "-c", READ_AS_NVIDIA, str(tokenizer_dir), json.dumps(TEXTS),
                             json.dumps(MESSAGES)], env={**os.environ, "PYTHONPATH": OVERLAY},
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    theirs = json.loads(result.stdout.splitlines()[-1])
    assert theirs["version"].startswith("4.56")
    ours = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert theirs["ids"] == [ours.encode(text, add_special_tokens=False) for text in TEXTS]
    assert theirs["chat"] == ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert theirs["eos"] == ours.eos_token_id

"""What a tokenizer-only Python instance (preprocessing, postprocessing, the BLS) costs to start, with and
without torch loaded beside transformers (`tokenization.tokenizer_only_process`); and what postprocessing
alone costs with the byte table the build saves beside the tokenizer, against building it from the tokenizer.

Each sample is a fresh Python process that loads, as a stub's `initialize` does, the preprocessor and the
postprocessor of a tiny model (the first two settings) or the postprocessor alone (the last two); the settings
alternate, so the machine's load falls on all alike. Prints the median load time and peak memory of each, and
the ratios. Run: .venv/bin/python bench/tokenizer_process.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tritonforge.facts.settings import positive_int
from tritonforge.runtime.text.detokenization import TokenBytes
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.tools.tiny_model import make_tiny_model

# One stub's start, timed inside a fresh process; prints its seconds and peak memory as JSON.
SAMPLE = """
import json, sys, time
start = time.perf_counter()
if sys.argv[2] != "with-torch":
    from tritonforge.runtime.text.tokenization import tokenizer_only_process
    tokenizer_only_process()
from tritonforge.runtime.text.postprocess import Postprocessor
if not sys.argv[2].startswith("postprocessing"):
    from tritonforge.runtime.text.preprocess import Preprocessor
    from tritonforge.facts.limits import EngineLimits
    Preprocessor(sys.argv[1], EngineLimits(max_input_len=64, max_seq_len=256))
Postprocessor(sys.argv[1])
# VmHWM: this program's peak resident memory (getrusage's would count the parent's, kept across exec).
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.perf_counter() - start, "torch": sys.modules.get("torch") is not None,
                  "peak_mb": peak_kb / 1024}))
"""
# setting -> whether its tokenizer folder holds the saved byte table
SETTINGS = {"with-torch": False, "tokenizer-only": False, "postprocessing, table built": False,
            "postprocessing, table saved": True}


def sample(model_dir: Path, setting: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", SAMPLE, str(model_dir), setting], capture_output=True,
                               text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=5, help="processes per setting (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model_dir = make_tiny_model(Path(work) / "tiny", tokenizer_family="sentencepiece")
        with_table = Path(work) / "tiny-with-table"
        shutil.copytree(model_dir, with_table)
        TokenBytes(load_tokenizer(with_table)).save(with_table)
        samples: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
        for _ in range(args.repeats):
            for setting, saved in SETTINGS.items():
                samples[setting].append(sample(with_table if saved else model_dir, setting))
    print("| setting | torch loaded | load s (median) | peak MB (median) |")
    print("|---|---|---:|---:|")
    medians = {}
    for setting, rows in samples.items():
        medians[setting] = (statistics.median(r["seconds"] for r in rows),
                            statistics.median(r["peak_mb"] for r in rows))
        print(f"| {setting} | {rows[0]['torch']} | {medians[setting][0]:.2f} | {medians[setting][1]:.0f} |")
    for faster, slower in (("tokenizer-only", "with-torch"),
                           ("postprocessing, table saved", "postprocessing, table built")):
        (new_s, new_mb), (old_s, old_mb) = medians[faster], medians[slower]
        print(f"{faster}: {new_s / old_s:.2f}x the load time, {new_mb / old_mb:.2f}x the memory of {slower}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a tokenizer-only Python instance (preprocessing, postprocessing, the BLS) costs to start, with and
without torch loaded beside transformers (`tokenization.tokenizer_only_process`).

Each sample is a fresh Python process that loads the preprocessor and the postprocessor of a tiny model, as
a stub's `initialize` does; the two settings alternate, so the machine's load falls on both alike. Prints
the median load time and peak memory of each, and their ratio. Run: .venv/bin/python bench/tokenizer_process.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tritonforge.spec.settings import positive_int
from tritonforge.tools.tiny_model import make_tiny_model

# One stub's start, timed inside a fresh process; prints its seconds and peak memory as JSON.
SAMPLE = """
import json, sys, time
start = time.perf_counter()
if sys.argv[2] == "tokenizer-only":
    from tritonforge.runtime.tokenization import tokenizer_only_process
    tokenizer_only_process()
from tritonforge.runtime.postprocess import Postprocessor
from tritonforge.runtime.preprocess import Preprocessor
from tritonforge.spec.limits import EngineLimits
Preprocessor(sys.argv[1], EngineLimits(max_input_len=64, max_seq_len=256))
Postprocessor(sys.argv[1])
# VmHWM: this program's peak resident memory (getrusage's would count the parent's, kept across exec).
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.perf_counter() - start, "torch": sys.modules.get("torch") is not None,
                  "peak_mb": peak_kb / 1024}))
"""
SETTINGS = ("with-torch", "tokenizer-only")


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
        samples: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
        for _ in range(args.repeats):
            for setting in SETTINGS:
                samples[setting].append(sample(model_dir, setting))
    print("| setting | torch loaded | load s (median) | peak MB (median) |")
    print("|---|---|---:|---:|")
    medians = {}
    for setting, rows in samples.items():
        medians[setting] = (statistics.median(r["seconds"] for r in rows),
                            statistics.median(r["peak_mb"] for r in rows))
        print(f"| {setting} | {rows[0]['torch']} | {medians[setting][0]:.2f} | {medians[setting][1]:.0f} |")
    (with_s, with_mb), (without_s, without_mb) = medians["with-torch"], medians["tokenizer-only"]
    print(f"tokenizer-only: {without_s / with_s:.2f}x the load time, {without_mb / with_mb:.2f}x the memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""lm-evaluation-harness against the gateway, beside transformers' own model in lm-eval, on one task.

Serves a checkpoint with `tritonforge serve CHECKPOINT --openai-port`, runs lm-eval's `local-completions` model
against it (loglikelihood tasks score each choice by the echoed prompt's log probabilities: `echo`, `logprobs`,
`max_tokens` 1), then lm-eval's `hf` model on the same checkpoint, and prints both scores; `--results` writes them
as JSON and Markdown. lm-eval needs numpy 2, which the Python backend's stub cannot load, so it runs from a venv of
its own (`--lm-eval-venv`, made on first use with `pip install lm-eval transformers torch`).

    python bench/lm_eval.py          # the real model (tritonforge make-model smollm2), both tasks
    python bench/lm_eval.py --checkpoint DIR --tasks everyday_facts --results bench/results/lm-eval-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "bench" / "eval_tasks"
LM_EVAL = "lm-eval[api,hf]==0.4.13"  # api: local-completions' client; hf: lm-eval's transformers model
DATA = TASKS / "everyday_facts.jsonl"  # questions, their choices, the right one's index
# The two tasks on it, as lm-eval configs: each choice scored by its log-likelihood after the question (what
# `echo` with `logprobs` serves), and the answer generated greedily up to a comma, full stop or line end.
COMMON = """dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{question}}}}"
"""
TASK_CONFIGS = {
    "everyday_facts": COMMON + """output_type: multiple_choice
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""",
    "everyday_facts_gen": COMMON + """output_type: generate_until
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: [",", ".", "\\n"]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""",
}
METRICS = {"everyday_facts": "acc,none", "everyday_facts_gen": "exact_match,strip"}
READY_S = 900  # a first serve builds the repository and loads the model


def lm_eval_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making {venv} for lm-eval ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LM_EVAL, "transformers", "torch==2.13.0"],
                       check=True)
    return python


def wait_ready(base_url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"tritonforge serve exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"the gateway at {base_url} was not ready in {READY_S} s")


def run_lm_eval(python: Path, model: str, model_args: str, tasks: list[str], include: Path, output: Path,
                limit: int | None) -> dict:
    """lm-eval's results by task."""
    command = [str(python), "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks",
               ",".join(tasks), "--include_path", str(include), "--output_path", str(output), "--batch_size", "1"]
    if limit:
        command += ["--limit", str(limit)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "0"})
    found = sorted(output.rglob("results_*.json"), key=lambda path: path.stat().st_mtime)
    return json.loads(found[-1].read_text())["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint (default: the real model, "
                                                        "made by `tritonforge make-model smollm2`)")
    parser.add_argument("--tasks", default=",".join(TASK_CONFIGS), help="of TASK_CONFIGS (default: %(default)s)")
    parser.add_argument("--lm-eval-venv", type=Path, default=ROOT / ".venv-lm-eval", help="default: %(default)s")
    parser.add_argument("--port", type=int, default=9300, help="the gateway's port (default: %(default)s)")
    parser.add_argument("--limit", type=int, help="questions to ask (default: all)")
    parser.add_argument("--results", type=Path, help="write RESULTS.json and RESULTS.md")
    options = parser.parse_args()
    tasks = options.tasks.split(",")
    unknown = sorted(set(tasks) - set(TASK_CONFIGS))
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)}; known: {', '.join(TASK_CONFIGS)}")

    tritonforge = [sys.executable, "-m", "tritonforge.cli"]
    checkpoint = options.checkpoint
    if checkpoint is None:
        made = subprocess.run([*tritonforge, "make-model", "smollm2"], check=True, capture_output=True, text=True)
        checkpoint = Path(made.stdout.strip().splitlines()[-1].split()[-1])
    python = lm_eval_python(options.lm_eval_venv)
    base_url = f"http://127.0.0.1:{options.port}"
    with tempfile.TemporaryDirectory(prefix="lm-eval-") as work:
        work = Path(work)
        for task in tasks:
            (work / f"{task}.yaml").write_text(f"task: {task}\n" + TASK_CONFIGS[task].format(data=DATA))
        server = subprocess.Popen([*tritonforge, "serve", str(checkpoint), "--openai-port", str(options.port),
                                   "--served-model-name", "model"], cwd=work)
        try:
            wait_ready(base_url, server)
            gateway = run_lm_eval(python, "local-completions",
                                  f"model=model,base_url={base_url}/v1/completions,tokenizer_backend=huggingface,"
                                  f"tokenizer={checkpoint},tokenized_requests=False,max_retries=1",
                                  tasks, work, work / "gateway", options.limit)
        finally:
            server.terminate()
            server.wait(120)
        own = run_lm_eval(python, "hf", f"pretrained={checkpoint},dtype=float32", tasks, work, work / "hf",
                          options.limit)
    table = ["| task | metric | the gateway (local-completions) | transformers (lm-eval's hf) |",
             "| --- | --- | --- | --- |"]
    for task in tasks:
        metric = METRICS[task]
        stderr = metric.replace(",", "_stderr,")
        table.append(f"| {task} | {metric.split(',')[0]} | {gateway[task][metric]:.3f} ± {gateway[task][stderr]:.3f} "
                     f"| {own[task][metric]:.3f} ± {own[task][stderr]:.3f} |")
    print("\n".join(table))
    if options.results:
        options.results.parent.mkdir(parents=True, exist_ok=True)
        options.results.with_suffix(".json").write_text(json.dumps(
            {"checkpoint": str(checkpoint), "gateway": gateway, "hf": own}, indent=2) + "\n")
        command = "python bench/lm_eval.py" + (f" --limit {options.limit}" if options.limit else "")
        options.results.with_suffix(".md").write_text(
            f"# lm-eval on {checkpoint.name}, {time.strftime('%Y-%m-%d')}, 2-core CPU machine\n\n"
            + "\n".join(table) + f"\n\n`{command}`\n")


if __name__ == "__main__":
    main()

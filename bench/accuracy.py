"""How the accuracy gate grades degradation: a tiny model served against itself, then copies with its
matrices rounded to int8 or perturbed with Gaussian noise of growing size (× each matrix's own standard
deviation); greedy agreement, first-divergence position and log-prob error for each, with a plot.

  .venv/bin/python bench/accuracy.py            # writes bench/results/accuracy-gate.{json,md,png}
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.serve.server import TritonServer
from tritonforge.tools.accuracy import run_eval
from tritonforge.tools.benchmark import machine_description, with_extension
from tritonforge.tools.tiny_model import degraded_copy, make_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noise", default="0,0.01,0.03,0.1,0.3,1.0", help="noise sizes, comma-separated")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        reference = make_tiny_model(work / "reference")
        variants = [(f"noise {size}", {"noise": float(size)}) for size in args.noise.split(",")]
        variants.append(("int8 (per-row absmax)", {"int8": True}))
        for index, (name, degradation) in enumerate(variants):
            model = reference if degradation == {"noise": 0.0} else degraded_copy(
                reference, work / f"model-{index}", **degradation)
            repository = build(BuildOptions(model=model, output=work / f"repo-{index}", max_input_len=64,
                                            max_seq_len=256), progress=lambda _: None)
            with TritonServer(repository) as server:
                report = run_eval(server.grpc_url, reference, tokenizer_dir(repository),
                                  tokens=args.tokens)
            rows.append({"variant": name, **degradation, **report.record()})
            print(f"{name:24} agreement {report.greedy_agreement:.3f}  first divergence "
                  f"{report.mean_first_divergence:5.1f}  log-prob MAE {report.logprob_mae:.4f}  "
                  f"{'PASS' if report.passed else 'FAIL'}", file=sys.stderr, flush=True)
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "tokens": args.tokens, "model": "tiny Llama (random weights), transformers engine"},
              "rows": rows}
    stem = args.results_dir / "accuracy-gate"
    stem.parent.mkdir(parents=True, exist_ok=True)
    with_extension(stem, ".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"Accuracy gate against degradation — {result['meta']['machine']}, {result['meta']['date']}, "
             f"{args.tokens} greedy tokens × the built-in prompts", "",
             "| variant | greedy agreement | mean first divergence | log-prob MAE | tokens off > 0.1 | gate |",
             "|---|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['greedy_agreement']:.3f} | {row['mean_first_divergence']:.1f} | "
                     f"{row['logprob_mae']:.4f} | {row['logprob_off_share']:.3f} | "
                     f"{'pass' if row['passed'] else 'FAIL'} |")
    with_extension(stem, ".md").write_text("\n".join(lines) + "\n")
    plot(rows, with_extension(stem, ".png"), result["meta"])
    print("\n".join(lines))
    return 0


def plot(rows: list[dict], png: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noisy = [row for row in rows if "noise" in row and row["noise"] > 0]
    figure, left = plt.subplots(figsize=(7, 4.5))
    left.plot([r["noise"] for r in noisy], [r["greedy_agreement"] for r in noisy], marker="o", label="greedy agreement")
    left.plot([r["noise"] for r in noisy], [r["mean_first_divergence"] / meta["tokens"] for r in noisy], marker="s",
              label="mean first divergence / tokens")
    left.set_xscale("log")
    left.set_xlabel("noise (× each matrix's standard deviation)")
    left.set_ylabel("share")
    right = left.twinx()
    right.plot([r["noise"] for r in noisy], [r["logprob_mae"] for r in noisy], marker="^", color="tab:red",
               label="log-prob MAE")
    right.set_yscale("log")
    right.set_ylabel("log-prob MAE")
    int8 = next((r for r in rows if r.get("int8")), None)
    if int8:
        right.axhline(int8["logprob_mae"], color="tab:red", linestyle=":", label="int8 log-prob MAE")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(handles, labels, fontsize=8, loc="center left")
    left.set_title(f"accuracy gate vs weight perturbation — {meta['machine']}, {meta['date']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())

"""`tritonforge tune`: choose the Python steps' serving settings of a built repository from measurements.

A candidate is a `Candidate`: instance counts of preprocessing, postprocessing and the BLS, and
postprocessing's dynamic-batching queue delay (a short delay gathers more streamed chunks per execution).
For each candidate of the grid the configs are rewritten, the server started, and the engine called
directly, the ensemble and the BLS measured at the target concurrency (`tritonforge.tools.benchmark`).

The choice (`choose`): among candidates whose ensemble and BLS both reach `target` of the direct path's
output tokens/s with no errors, the one with the fewest Python instances (CPU left to everything else), then
the lowest worst TTFT p99; if none reaches it, the best worst-path efficiency. Efficiency is the steady one
(ramp and drain left out, `tritonforge.tools.benchmark`) when every measured path has it, else the whole run's for
all alike. The chosen settings are written back into the repository's configs. The engine step keeps its
own settings: it batches itself. Configs are rendered again from the plan the build recorded in the manifest
(`builder/manifest.py`) through the same typed builders, never edited as text.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..builder import model_configs as configs
from ..builder.manifest import MANIFEST, Manifest, read_manifest
from ..builder.repository import RepositoryPlan, build_configs, tokenizer_dir
from ..facts.contract import BLS_MODEL, POSTPROCESSING_MODEL, PREPROCESSING_MODEL
from ..serve.server import TritonServer
from .benchmark import add_efficiency, make_prompts, measure_server

INSTANCE_MODELS = {"preprocessing": PREPROCESSING_MODEL, "postprocessing": POSTPROCESSING_MODEL, "bls": BLS_MODEL}


@dataclass(frozen=True)
class Candidate:
    preprocessing: int
    postprocessing: int
    bls: int
    postprocessing_delay_us: int = 0

    @property
    def instances(self) -> int:
        return self.preprocessing + self.postprocessing + self.bls

    @property
    def label(self) -> str:
        return (f"pre {self.preprocessing} / post {self.postprocessing} / BLS {self.bls} / "
                f"post delay {self.postprocessing_delay_us} µs")


@dataclass(frozen=True)
class TuneResult:
    rows: list[dict]  # one per candidate and path, with "candidate" (a dict) added
    chosen: Candidate
    reached_target: bool


def grid(preprocessing, postprocessing, bls, postprocessing_delays_us) -> list[Candidate]:
    return [Candidate(*values) for values in itertools.product(preprocessing, postprocessing, bls,
                                                                postprocessing_delays_us)]


def _config_path(repository: Path, model: str) -> Path:
    return repository / model / "config.pbtxt"


def _recorded(repository: Path) -> tuple[Manifest, RepositoryPlan]:
    manifest = read_manifest(repository)
    if manifest is None or manifest.plan is None:
        raise ValueError(f"{repository} holds no repository plan in its {MANIFEST} (built by an older tritonforge, "
                         f"or not by tritonforge): build it again to tune it")
    return manifest, manifest.plan


def current(repository: Path) -> Candidate:
    serving = _recorded(repository)[1].serving
    return Candidate(preprocessing=serving.preprocessing_instances, postprocessing=serving.postprocessing_instances,
                     bls=serving.bls_instances, postprocessing_delay_us=serving.postprocessing_delay_microseconds)


def apply(repository: Path, candidate: Candidate) -> None:
    """Render the configs of the Python steps again with a candidate's settings (the models the repository
    has), and record the new plan in the manifest."""
    manifest, plan = _recorded(repository)
    serving = dataclasses.replace(plan.serving, preprocessing_instances=candidate.preprocessing,
                                  postprocessing_instances=candidate.postprocessing, bls_instances=candidate.bls,
                                  postprocessing_delay_microseconds=candidate.postprocessing_delay_us)
    plan = dataclasses.replace(plan, serving=serving)
    rendered = build_configs(plan)
    for model in INSTANCE_MODELS.values():
        if model in rendered and _config_path(repository, model).is_file():
            _config_path(repository, model).write_text(configs.to_text(rendered[model]))
    dataclasses.replace(manifest, plan=plan).write(repository)


def _path_rows(rows: list[dict], candidate: Candidate) -> dict[str, dict]:
    return {row["path"]: row for row in rows if row["candidate"] == asdict(candidate)}


def choose(rows: list[dict], candidates: list[Candidate], target: float) -> tuple[Candidate, bool]:
    measured = [row for row in rows if row["path"] != "direct"]
    measure = ("steady_efficiency" if measured and all(row.get("steady_efficiency") is not None for row in measured)
               else "efficiency")

    def worst_efficiency(candidate: Candidate) -> float:
        paths = _path_rows(rows, candidate)
        return min((row[measure] or 0.0) for path, row in paths.items() if path != "direct")

    def worst_ttft_p99(candidate: Candidate) -> float:
        return max(row["ttft_ms_p99"] or float("inf") for row in _path_rows(rows, candidate).values())

    def clean(candidate: Candidate) -> bool:
        return all(row["errors"] == 0 for row in _path_rows(rows, candidate).values())

    good = [c for c in candidates if clean(c) and worst_efficiency(c) >= target]
    if good:
        return min(good, key=lambda c: (c.instances, worst_ttft_p99(c))), True
    return max(candidates, key=worst_efficiency), False


def tune(repository: Path, candidates: list[Candidate], *, concurrency: int = 128, target: float = 0.95,
         output_tokens: int = 64, duration_s: float = 10.0, tool: str = "asyncio",
         server_options: dict | None = None, prompts: int = 256, progress=lambda message: None) -> TuneResult:
    """Measure every candidate and write the chosen one into the configs. Whatever stops it first (an error, a
    Ctrl-C), the configs are put back as they were. The load cycles through `prompts` distinct prompts, each of
    which is first answered alone on every path (what its streams are checked against)."""
    paths = ["direct", "ensemble"] + (["bls"] if (repository / BLS_MODEL).is_dir() else [])
    prompt_set = make_prompts(tokenizer_dir(repository), prompts, 32)
    originals = {path: path.read_text() for path in [repository / MANIFEST] + [
        _config_path(repository, model) for model in INSTANCE_MODELS.values()] if path.is_file()}
    rows: list[dict] = []
    try:
        for candidate in candidates:
            progress(f"measuring {candidate.label}")
            apply(repository, candidate)
            # Open APIs: perf_analyzer reads the model config; the server lives only for this measurement.
            server = TritonServer(repository, restricted_apis="", **(server_options or {})).start()
            try:
                with tempfile.TemporaryDirectory() as work:
                    measured = measure_server(server.grpc_url, prompt_set, paths=paths, concurrencies=(concurrency,),
                                              output_tokens=output_tokens, duration_s=duration_s, tool=tool,
                                              work=Path(work), label=candidate.label, server_pid=server.pid,
                                              progress=progress)
            finally:
                server.stop()
            add_efficiency(measured)
            rows += [{**row, "candidate": asdict(candidate)} for row in measured]
        chosen, reached = choose(rows, candidates, target)
    except BaseException:
        for path, text in originals.items():
            path.write_text(text)
        raise
    apply(repository, chosen)
    return TuneResult(rows=rows, chosen=chosen, reached_target=reached)


def plot(result: TuneResult, png: Path, title: str) -> None:
    """Throughput against TTFT p99, one point per candidate and path, the chosen candidate ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 5))
    for path, marker in (("direct", "s"), ("ensemble", "o"), ("bls", "^")):
        points = [row for row in result.rows if row["path"] == path]
        if not points:
            continue
        axis.scatter([row["ttft_ms_p99"] or 0 for row in points], [row["output_tokens_per_s"] for row in points],
                     marker=marker, label=path, alpha=0.75)
        chosen = [row for row in points if row["candidate"] == asdict(result.chosen)]
        axis.scatter([row["ttft_ms_p99"] or 0 for row in chosen], [row["output_tokens_per_s"] for row in chosen],
                     s=220, facecolors="none", edgecolors="red", linewidths=1.8)
    axis.scatter([], [], s=220, facecolors="none", edgecolors="red", label=f"chosen: {result.chosen.label}")
    axis.set_xlabel("TTFT p99 (ms)")
    axis.set_ylabel("output tokens/s")
    axis.set_title(title, fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)

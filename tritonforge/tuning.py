"""`tritonforge tune`: pick the Python steps' instance counts of a built repository from measurements.

For each candidate count (the same for preprocessing, postprocessing and the BLS), rewrite the counts in the
configs, start the server, and measure the engine called directly, the ensemble and the BLS at the target
concurrency (`tritonforge.benchmark`). The smallest count whose ensemble and BLS both reach `target` of the
direct path's output tokens/s wins, else the count with the best ensemble efficiency; its counts are written
back. The engine step keeps its own instance settings: it batches inside itself.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from .benchmark import add_efficiency, make_prompts, measure_server
from .server import TritonServer

TUNED_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")


@dataclass(frozen=True)
class TuneResult:
    rows: list[dict]  # one per count and path, with "instances" added
    chosen: int
    reached_target: bool


def instance_counts(repository: Path) -> dict[str, int]:
    counts = {}
    for model in TUNED_MODELS:
        path = repository / model / "config.pbtxt"
        if path.is_file():
            config = text_format.Parse(path.read_text(), mc.ModelConfig())
            counts[model] = config.instance_group[0].count if config.instance_group else 1
    return counts


def set_instance_counts(repository: Path, count: int) -> None:
    for model in TUNED_MODELS:
        path = repository / model / "config.pbtxt"
        if not path.is_file():
            continue
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        if not config.instance_group:
            config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU)
        config.instance_group[0].count = count
        path.write_text(text_format.MessageToString(config))


def tune(repository: Path, *, counts=(1, 2, 4, 8), concurrency: int = 128, target: float = 0.95,
         output_tokens: int = 64, duration_s: float = 10.0, tool: str = "asyncio",
         server_options: dict | None = None) -> TuneResult:
    paths = ["direct", "ensemble"] + (["bls"] if (repository / "tensorrt_llm_bls").is_dir() else [])
    prompts = make_prompts(repository / "preprocessing" / "tokenizer", 256, 32)
    rows: list[dict] = []
    for count in counts:
        set_instance_counts(repository, count)
        # Open APIs: perf_analyzer reads the model config; the server lives only for this measurement.
        server = TritonServer(repository, restricted_apis="", **(server_options or {})).start()
        try:
            with tempfile.TemporaryDirectory() as work:
                measured = measure_server(server.grpc_url, prompts, paths=paths, concurrencies=(concurrency,),
                                          output_tokens=output_tokens, duration_s=duration_s, tool=tool,
                                          work=Path(work), label=f"{count} instances")
        finally:
            server.stop()
        add_efficiency(measured)
        rows += [{**row, "instances": count} for row in measured]

    def efficiency(count: int, path: str) -> float:
        return next((r["efficiency"] or 0.0 for r in rows if r["instances"] == count and r["path"] == path), 1.0)

    good = [c for c in counts if all(efficiency(c, p) >= target for p in paths if p != "direct")]
    chosen = min(good) if good else max(counts, key=lambda c: efficiency(c, "ensemble"))
    set_instance_counts(repository, chosen)
    return TuneResult(rows=rows, chosen=chosen, reached_target=bool(good))

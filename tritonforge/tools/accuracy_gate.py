"""The accuracy gate (`tritonforge build --accuracy-gate PROMPTS.jsonl`): once the build has written a repository,
serve its engine model, compare it with the checkpoint (`tools/accuracy.py`, what `tritonforge eval` runs),
record the figures in the manifest (and in engine_info.json beside a TensorRT-LLM engine) and mark the
repository ready only if the gate passes; `tritonforge serve` refuses one marked not ready."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..builder import trtllm
from ..builder.manifest import MANIFEST, read_manifest
from ..builder.repository import ENGINE_SUBDIR, tokenizer_dir
from ..facts.contract import ENGINE_MODEL
from ..facts.ports import GRPC_PORT
from ..facts.settings import setting


class AccuracyGateFailed(RuntimeError):
    """The engine failed the gate; `failures` names each figure that failed it."""

    def __init__(self, message: str, failures: tuple[str, ...] = ()):
        super().__init__(message)
        self.failures = failures


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    """The gate's settings, flags of `tritonforge build`."""

    accuracy_gate: Path | None = setting(None, "after the build, serve the repository and compare it with the "
                                         "checkpoint (tritonforge eval); a failing engine leaves the repository "
                                         "marked not ready (default: none: no gate)", parse=Path,
                                         metavar="PROMPTS.jsonl")
    accuracy_reference: Path | None = setting(None, "the checkpoint the gate compares with (default: --model), "
                                              "e.g. the original of a pre-quantized checkpoint", parse=Path)


def print_gate_commands(repository: Path, checkpoint: Path, gate: GateOptions, progress) -> None:
    """What a dry run shows: the gate as the two commands it runs."""
    reference = gate.accuracy_reference or checkpoint
    progress("accuracy gate (after the build):")
    progress(f"  tritonforge serve {repository} --grpc-port {GRPC_PORT}")
    progress(f"  tritonforge eval --url localhost:{GRPC_PORT} --reference {reference} "
             f"--tokenizer {tokenizer_dir(repository)} --prompts {gate.accuracy_gate}")


def run_accuracy_gate(repository: Path, checkpoint: Path, gate: GateOptions, progress,
                      executable: str | None = None) -> None:
    """Serve `repository`'s engine model (with the tritonserver `executable`, default: found as `serve` finds it),
    compare it with the checkpoint, record the verdict; raise AccuracyGateFailed when it fails (the repository is
    then marked not ready)."""
    from ..serve.server import TritonServer, only_models  # a server and the eval's clients: loaded when run
    from .accuracy import run_eval

    reference = gate.accuracy_reference or checkpoint
    progress(f"accuracy gate: serving {repository} and comparing it with {reference}")
    # The gate reads the engine model alone (its tokens and log-probs): the other models are not loaded.
    with TritonServer(repository, executable=executable, extra_args=only_models(ENGINE_MODEL)) as server:
        report = run_eval(server.grpc_url, reference, tokenizer_dir(repository), prompts_path=gate.accuracy_gate)
    progress(report.table())
    manifest = read_manifest(repository)
    if manifest is None:
        raise FileNotFoundError(f"{repository} has no {MANIFEST}: the gate runs on a repository tritonforge built")
    manifest_path = manifest.with_gate(report.record(), report.passed).write(repository)
    engine_info = repository / ENGINE_MODEL / "1" / ENGINE_SUBDIR / trtllm.ENGINE_INFO
    if engine_info.is_file():
        engine_info.write_text(json.dumps({**json.loads(engine_info.read_text()),
                                           "accuracy_gate": report.record()}, indent=2) + "\n")
    if not report.passed:
        raise AccuracyGateFailed(f"the engine failed the accuracy gate ({'; '.join(report.failures)}); the "
                                 f"repository is marked not ready in {manifest_path}", tuple(report.failures))

"""`tritonforge.json`, the record a build leaves at the root of the repository it wrote: read and written here
alone, as one typed object.

It holds the build's options as given, the repository plan the configs were rendered from (so `tune` can
render them again with other instance counts), what the engine kind recorded (a TensorRT-LLM build's memory
plan and commands), every file the build wrote (what a later `--force` may remove, and nothing else), and the
accuracy gate's verdict (`ready`: `serve` refuses a repository that failed it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..facts.limits import EngineLimits
from .model_configs import ServingConfig
from .repository import RepositoryPlan

MANIFEST = "tritonforge.json"
_BUILD, _PLAN, _FILES, _READY, _GATE = "tritonforge_build", "repository_plan", "files", "ready", "accuracy_gate"


class ManifestError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class Manifest:
    build: dict  # the build's options, as `tritonforge build` took them
    plan: RepositoryPlan | None  # None in a repository built before the plan was recorded
    engine_record: dict = field(default_factory=dict)  # what the engine kind recorded
    files: tuple[str, ...] = ()  # relative to the repository, every file the build wrote
    ready: bool | None = None  # the accuracy gate's verdict; None: no gate ran
    accuracy_gate: dict | None = None

    @property
    def engine(self) -> str | None:
        return self.build.get("engine")

    def with_gate(self, record: dict, passed: bool) -> Manifest:
        return dataclasses.replace(self, accuracy_gate=record, ready=passed)

    def to_json(self) -> dict:
        out = {_BUILD: self.build, **self.engine_record}
        if self.plan is not None:
            out[_PLAN] = _plan_record(self.plan)
        if self.accuracy_gate is not None:
            out[_GATE] = self.accuracy_gate
        if self.ready is not None:
            out[_READY] = self.ready
        out[_FILES] = list(self.files)
        return out

    @classmethod
    def from_json(cls, data: dict, repository: Path) -> Manifest:
        known = {_BUILD, _PLAN, _FILES, _READY, _GATE}
        plan = data.get(_PLAN)
        return cls(build=data.get(_BUILD, {}), plan=_plan_from(plan, repository) if plan else None,
                   engine_record={k: v for k, v in data.items() if k not in known},
                   files=tuple(data.get(_FILES) or ()), ready=data.get(_READY), accuracy_gate=data.get(_GATE))

    def write(self, repository: Path) -> Path:
        path = repository / MANIFEST
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        temporary.replace(path)  # never half-written: the record of what a --force may remove
        return path


def read_manifest(repository: Path) -> Manifest | None:
    """The repository's manifest, or None where it has none; one that cannot be read is a ManifestError."""
    path = repository / MANIFEST
    if not path.is_file():
        return None
    try:
        return Manifest.from_json(json.loads(path.read_text()), repository)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError, AttributeError) as error:
        raise ManifestError(f"{path} cannot be read ({error}): it is not a manifest tritonforge wrote, or it was "
                            f"edited") from None


def written_files(repository: Path) -> list[str] | None:
    """The files an earlier build recorded writing, or None where no such record exists."""
    path = repository / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text()).get(_FILES)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return list(files) if isinstance(files, list) else None


def options_record(options) -> dict:
    """A dataclass of options as JSON: paths as text, nested dataclasses as objects."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}


def _plan_record(plan: RepositoryPlan) -> dict:
    record = options_record(plan)
    record.pop("output")
    return record


def _plan_from(record: dict, repository: Path) -> RepositoryPlan:
    serving = dict(record["serving"])
    if serving.get("target_triton") is not None:
        serving["target_triton"] = tuple(serving["target_triton"])
    return RepositoryPlan(**{**record, "output": repository, "frontends": tuple(record["frontends"]),
                             "serving": ServingConfig(**serving), "limits": EngineLimits(**record["limits"])})

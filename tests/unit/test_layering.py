"""The package's layers and the one direction of their imports (docs/design/layers.md).

Every module's imports are read from its source, those inside functions included, so that a layer reaching
up (the runtime importing the build, say, which would load the build's code into every Triton stub) fails
here, by file and name, before it becomes a cycle."""

import ast
from pathlib import Path

import pytest

from tritonforge.builder.engines import ENGINE_KINDS, ENGINE_NAMES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tritonforge"
# Bottom to top: a module may import its own layer and those before it, never one after it.
LAYERS = ("facts", "runtime", "clients", "gateway", "serve", "builder", "tools", "cli")
# What Triton's Python stubs load: the models' adapters, which reach only the shared facts and the runtime.
STUB_LAYERS = ("facts", "runtime")
TRITON_MODELS = sorted(ROOT.glob("*/1/model.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The tritonforge modules (or packages) that the file at `path` imports, as dotted names."""
    name = module_name(path) if path.is_relative_to(PACKAGE) else ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "tritonforge")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "tritonforge":
                continue
            if node.module is None or (PACKAGE.parent / module.replace(".", "/")).is_dir():
                # `from .. import x` or `from tritonforge.facts import contract`: x may be a module of that package
                found.update(f"{module}.{alias.name}" for alias in node.names)
            else:
                found.add(module)
    return found


def layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


PACKAGE_MODULES = sorted(path for path in PACKAGE.rglob("*.py") if path != PACKAGE / "__init__.py")


def test_every_module_lies_in_a_layer():
    assert (PACKAGE / "__init__.py").read_text().strip() == "" or not imported(PACKAGE / "__init__.py")
    strays = [str(path.relative_to(ROOT)) for path in PACKAGE_MODULES if layer(module_name(path)) is None]
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"


def test_the_reader_sees_relative_lazy_and_package_imports():
    """Guards the guard: a reader that found nothing would pass every test below."""
    assert "tritonforge.serve.server" in imported(PACKAGE / "tools" / "accuracy_gate.py")  # inside a function
    assert "tritonforge.facts.contract" in imported(PACKAGE / "builder" / "model_configs.py")  # from ..facts import
    assert "tritonforge.cli.main" in imported(PACKAGE / "cli" / "reference_docs.py")
    assert "tritonforge.runtime.text.preprocess" in imported(ROOT / "preprocessing" / "1" / "model.py")


@pytest.mark.parametrize("path", PACKAGE_MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_and_those_below(path):
    own = layer(module_name(path))
    allowed = LAYERS[: LAYERS.index(own) + 1]
    upward = sorted(target for target in imported(path) if layer(target) not in allowed)
    assert not upward, f"{path.relative_to(ROOT)} ({own}) imports {upward}; {own} may import only {allowed}"


# Inside the runtime, its rooms bottom to top: the modules at its top (the Triton edge, the sender) serve every
# room; text knows no engine, the engine no BLS, and the BLS sits on both.
RUNTIME = PACKAGE / "runtime"
RUNTIME_ROOMS = ("", "text", "engine", "bls")


def runtime_room(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[:2] != ["tritonforge", "runtime"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in RUNTIME_ROOMS else ""


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda path: str(path.relative_to(RUNTIME)))
def test_a_runtime_module_imports_only_its_own_room_and_those_below(path):
    own = runtime_room(module_name(path))
    allowed = RUNTIME_ROOMS[: RUNTIME_ROOMS.index(own) + 1] if own else ("",)
    upward = sorted(target for target in imported(path)
                    if (room := runtime_room(target)) is not None and room not in allowed)
    assert not upward, f"{path.relative_to(ROOT)} ({own or 'runtime top'}) imports {upward}"


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_an_engine_kinds_model_runs_its_own_room_of_the_runtime(name):
    """Adding an engine is its record (builder/engines/) and its own folder (runtime/engine/<room>/), which its
    Triton model imports; a kind served by a backend of its own has neither."""
    kind = ENGINE_KINDS[name]
    if kind.model_source is None:
        assert kind.runtime_room is None
        return
    room = f"tritonforge.runtime.engine.{kind.runtime_room}"
    assert (RUNTIME / "engine" / kind.runtime_room / "__init__.py").is_file()
    model = ROOT / kind.model_source / "1" / "model.py"
    assert any(target.startswith(room) for target in imported(model)), f"{model} imports nothing of {room}"


@pytest.mark.parametrize("path", TRITON_MODELS, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_triton_model_imports_only_the_spec_and_the_runtime(path):
    beyond = sorted(target for target in imported(path) if layer(target) not in STUB_LAYERS)
    assert not beyond, f"{path.relative_to(ROOT)} runs in a Triton stub and imports {beyond}"


def test_every_triton_model_is_checked():
    assert {path.parts[-3] for path in TRITON_MODELS} >= {"preprocessing", "postprocessing", "tensorrt_llm_bls",
                                                         "tensorrt_llm_transformers", "tensorrt_llm_pytorch"}

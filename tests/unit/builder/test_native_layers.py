"""The C++ backends' include graph has one direction, as the Python package's imports do (test_layering.py):
`runtime/native/` is the floor (the contract, JSON, the edge to Triton, the stop protocol) and includes nothing
above it; the text code (`runtime/text/native/`) stands on the floor alone; each backend stands on the floor, the
text code and its own folder, and no backend's folder is included by another."""

import re
from pathlib import Path

from tritonforge.builder import native

RUNTIME = native.RUNTIME
FLOOR = RUNTIME / "native"
TEXT = RUNTIME / "text" / "native"
SOURCES = sorted(path for pattern in ("*.cc", "*.h") for path in RUNTIME.rglob(pattern))
INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def resolved(source: Path, name: str) -> Path:
    """Where a quoted include lands: beside the source, else in the floor (the build's -I)."""
    beside = (source.parent / name).resolve()
    return beside if beside.is_file() else (FLOOR / name).resolve()


def allowed(source: Path) -> tuple[Path, ...]:
    if source.parent == FLOOR:
        return (FLOOR,)
    if source.parent == TEXT:
        return (FLOOR, TEXT)
    return (FLOOR, TEXT, source.parent)


def test_every_include_points_down_or_beside():
    assert SOURCES
    for source in SOURCES:
        for name in INCLUDE.findall(source.read_text()):
            target = resolved(source, name)
            assert target.is_file(), f"{source.relative_to(RUNTIME)} includes {name}, which is not there"
            assert target.parent in allowed(source), (
                f"{source.relative_to(RUNTIME)} includes {target.relative_to(RUNTIME)}: the floor (runtime/native) "
                f"includes only itself, the text code only the floor, a backend only those and its own folder")

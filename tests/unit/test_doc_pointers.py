"""Pointers between the code and the docs lead somewhere.

Every `docs/<page>.md` (and `README.md`), with an optional `#anchor`, that the code, its comments, the models'
`config.pbtxt`, `bench/`, `scripts/`, the Dockerfile or `deploy/` name is a page that exists, and its anchor is a
heading of that page as the docs site makes its ids (mkdocs' `toc`). Every `tritonforge/...` path that the docs
pages, the README or those files name exists. `bench/results/` and the changelog are history and are not read.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import markdown
import pytest

from tritonforge.builder.repository import SOURCE_ROOT

DOCS = SOURCE_ROOT / "docs"
HISTORY = (SOURCE_ROOT / "bench" / "results", DOCS / "changelog.md")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gz", ".tgz", ".safetensors", ".bin", ".model", ".pyc", ".so"}
# A path starts a word: not the tail of another one (`server/docs/...`, `deploy/helm/tritonforge/`, a URL).
DOC_POINTER = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md|README\.md)(?:#([\w-]+))?")
PACKAGE_PATH = re.compile(r"(?<![\w./-])tritonforge/[\w./-]*")
ACCIDENTAL_HEADING = re.compile(r"#{1,6}[^#\s]")


def _is_history(path: Path) -> bool:
    return any(path == old or old in path.parents for old in HISTORY)


def _text_files(*roots: Path) -> list[Path]:
    files = []
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if (path.is_file() and path.suffix not in BINARY_SUFFIXES and not _is_history(path)
                    and not SKIPPED_PARTS.intersection(path.relative_to(SOURCE_ROOT).parts)):
                files.append(path)
    return files


def code_files() -> list[Path]:
    """The package, the tests, the benches, the scripts, the deployment, the image and the model sources."""
    roots = [SOURCE_ROOT / name for name in ("tritonforge", "tests", "bench", "scripts", "deploy")]
    roots += [SOURCE_ROOT / name for name in ("Dockerfile", "build_engine.py", "pyproject.toml", "mkdocs.yml")]
    roots += sorted(SOURCE_ROOT.glob("*/config.pbtxt")) + sorted(SOURCE_ROOT.glob("*/1/model.py"))
    return _text_files(*roots)


def doc_pages() -> list[Path]:
    return _text_files(SOURCE_ROOT / "README.md", DOCS)


def _lines(path: Path):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        yield f"{path.relative_to(SOURCE_ROOT)}:{number}", line


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """The ids the docs site gives the headings of `page` (Python-Markdown's toc, as mkdocs runs it)."""
    converter = markdown.Markdown(extensions=["toc", "fenced_code", "tables"])
    converter.convert(page.read_text())
    ids, tokens = set(), list(converter.toc_tokens)
    while tokens:
        token = tokens.pop()
        ids.add(token["id"])
        tokens.extend(token["children"])
    return frozenset(ids)


def broken_doc_pointer(target: str, anchor: str | None) -> str | None:
    page = SOURCE_ROOT / target
    if not page.is_file():
        return f"{target} does not exist"
    if anchor is not None and anchor not in anchors(page):
        return f"{target} has no heading #{anchor} (its anchors: {', '.join(sorted(anchors(page)))})"
    return None


def test_the_anchors_are_those_the_docs_site_makes():
    faults = anchors(DOCS / "design" / "faults.md")
    assert "traps-of-triton-251-at-load-and-in-its-python-backend" in faults
    assert "ensemble-what-clients-send-and-get" in anchors(DOCS / "reference" / "tensors.md")


def test_every_docs_page_the_code_names_exists_with_its_anchor():
    found, anchored, broken = 0, 0, []
    for path in code_files():
        for where, line in _lines(path):
            for match in DOC_POINTER.finditer(line):
                found, anchored = found + 1, anchored + (match[2] is not None)
                problem = broken_doc_pointer(match[1], match[2])
                if problem:
                    broken.append(f"{where}: {problem}")
    assert found > 10 and anchored > 5, f"only {found} pointers to docs/ found ({anchored} with an anchor)"
    assert not broken, "\n".join(broken)


def test_no_docs_line_starts_a_heading_by_accident():
    """Markdown needs no space after `#`: a wrapped line that starts with an issue number (`#8034)`) becomes a
    heading of the page, and its id an anchor nobody meant."""
    accidental = []
    for page in doc_pages():
        fenced = False
        for where, line in _lines(page):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and ACCIDENTAL_HEADING.match(line):
                accidental.append(f"{where}: {line}")
    assert not accidental, "\n".join(accidental)


@pytest.mark.parametrize("files", [doc_pages, code_files], ids=["docs", "code"])
def test_every_package_path_named_exists(files):
    found, missing = 0, []
    for path in files():
        for where, line in _lines(path):
            for match in PACKAGE_PATH.finditer(line):
                found += 1
                named = match[0].rstrip(".")
                if not (SOURCE_ROOT / named).exists():
                    missing.append(f"{where}: {named}")
    assert found > 0
    assert not missing, "no such path:\n" + "\n".join(missing)

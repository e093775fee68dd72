"""The docs site builds with `mkdocs build --strict` (a broken link or anchor, or a page left out of the nav,
fails it), and the plots it shows are the benches' own."""

import os
import re
import subprocess
import sys

from tritonforge.builder.repository import SOURCE_ROOT

DOCS = SOURCE_ROOT / "docs"
RESULTS = SOURCE_ROOT / "bench" / "results"
BUILD_TIMEOUT_S = 300  # a few seconds alone; generous for a CPU shared with other test runs


def test_the_site_builds_in_strict_mode(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(SOURCE_ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=SOURCE_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("index.html", "performance/index.html", "reference/tensors/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_plot_on_the_site_is_a_copy_of_the_one_its_bench_drew():
    shown = sorted(DOCS.glob("images/*.png"))
    assert shown, "no plots under docs/images"
    for image in shown:
        drawn = RESULTS / image.name
        assert drawn.is_file(), f"docs/images/{image.name}: no bench/results/{image.name} drew it"
        assert image.read_bytes() == drawn.read_bytes(), (
            f"docs/images/{image.name} is older than bench/results/{image.name}: copy it again")


def test_every_image_a_page_shows_is_under_docs_images():
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert (page.parent / target).resolve().parent == (DOCS / "images").resolve(), (page, target)

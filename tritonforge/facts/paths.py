"""The ways into a served repository that the benchmarks and the CLI name: the engine model directly, the
ensemble, and the BLS."""

from __future__ import annotations

import argparse

from .contract import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL
from .settings import comma_list

PATH_MODELS = {"direct": ENGINE_MODEL, "ensemble": ENSEMBLE_MODEL, "bls": BLS_MODEL}
PATHS = tuple(PATH_MODELS)


def path_list(text: str) -> tuple[str, ...]:
    """An argparse `type` for --paths, e.g. "direct,ensemble": the paths named, in their order."""
    chosen = comma_list(text)
    unknown = sorted(set(chosen) - set(PATHS))
    if unknown or not chosen:
        found = f"unknown {unknown}" if unknown else "none given"
        raise argparse.ArgumentTypeError(f"{found}; choose from {', '.join(PATHS)}")
    return chosen

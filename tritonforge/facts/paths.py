"""The ways into a served repository that the benchmarks and the CLI name: the engine model directly, the
ensemble, and the BLS; and the BLS asked for each token's log probability with its likeliest alternatives (what
they cost, beside "bls"; not measured unless named)."""

from __future__ import annotations

import argparse

from .contract import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL
from .settings import comma_list

PATH_MODELS = {"direct": ENGINE_MODEL, "ensemble": ENSEMBLE_MODEL, "bls": BLS_MODEL, "bls-log-probs": BLS_MODEL}
PATHS = ("direct", "ensemble", "bls")  # measured unless --paths says otherwise
LOG_PROB_PATH_TOP = 5  # the alternatives each token of "bls-log-probs" asks for


def path_list(text: str) -> tuple[str, ...]:
    """An argparse `type` for --paths, e.g. "direct,ensemble": the paths named, in their order."""
    chosen = comma_list(text)
    unknown = sorted(set(chosen) - set(PATH_MODELS))
    if unknown or not chosen:
        found = f"unknown {unknown}" if unknown else "none given"
        raise argparse.ArgumentTypeError(f"{found}; choose from {', '.join(PATH_MODELS)}")
    return chosen

"""Shared fixtures: tiny checkpoints for both tokenizer families, built once per session."""

from __future__ import annotations

import signal

import pytest

from tritonforge.tiny_model import TOKENIZER_FAMILIES, make_tiny_model


@pytest.fixture(scope="session", params=TOKENIZER_FAMILIES)
def tiny_model(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(f"tiny-{request.param}"), tokenizer_family=request.param)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    return {family: make_tiny_model(tmp_path_factory.mktemp(f"tiny-all-{family}"), tokenizer_family=family)
            for family in TOKENIZER_FAMILIES}


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # A run stopped with SIGTERM (`timeout`, a CI job's limit) ends as Ctrl+C does: pytest then tears down the
    # fixtures, which stop the tritonservers they started (their own sessions would outlive the run).
    signal.signal(signal.SIGTERM, _interrupt)

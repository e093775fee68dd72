"""Shared fixtures: tiny checkpoints for both tokenizer families, built once per session; a gRPC server for test
doubles of Triton's gRPC service."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from tritonclient.grpc import service_pb2_grpc
from xdist.scheduler import LoadFileScheduling

from tritonforge.facts.environment import SERVER_START_LOCK_ENV
from tritonforge.serve.ports import free_port
from tritonforge.tools.tiny_model import TOKENIZER_FAMILIES, make_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tests read these checkpoints and never write into them (a degraded copy goes to a folder of its own)."""
    return {family: make_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), tokenizer_family=family)
            for family in TOKENIZER_FAMILIES}


@pytest.fixture(scope="session", params=TOKENIZER_FAMILIES)
def tiny_model(request, tiny_models):
    """Each family's checkpoint in turn: the same ones as `tiny_models`, built once per session."""
    return tiny_models[request.param]


@contextmanager
def serving_grpc(servicer: service_pb2_grpc.GRPCInferenceServiceServicer) -> Iterator[str]:
    """A local gRPC server answering with `servicer` (a test double of Triton's service); yields host:port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    url = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(url)
    server.start()
    try:
        yield url
    finally:
        server.stop(grace=None)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# Every tokenizer and checkpoint a test meets comes from these fixtures: a test that asks for neither runs no
# code of transformers or tokenizers (tests that import them otherwise carry the marker themselves), so
# scripts/test.sh runs only the marked ones again on the container's transformers.
CHECKPOINT_FIXTURES = {"tiny_model", "tiny_models"}


# The modules whose tests send requests to the session's `tiny_servers` (tests/integration/conftest.py): a
# run in several processes keeps them in one, so that those servers start once.
TINY_SERVER_MODULES = frozenset({"tests/integration/test_bls.py", "tests/integration/test_ensemble.py",
                                 "tests/integration/test_openai_gateway.py"})


def _longest_first(module: str) -> int:
    """The order modules run in: the longest first, so that no process is left running a long module alone at
    the end. The modules on the shared servers (together the longest run), then the other integration modules
    (each starts servers of its own), then the many short ones, which fill the gaps at the end."""
    if module in TINY_SERVER_MODULES:
        return 0
    return 1 if module.startswith("tests/integration/") else 2


def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CHECKPOINT_FIXTURES & fixtures:
            item.add_marker("transformers")
        module = item.nodeid.split("::", 1)[0]
        if "tiny_servers" in fixtures and module not in TINY_SERVER_MODULES:
            raise pytest.UsageError(f"{module} uses tiny_servers: add it to TINY_SERVER_MODULES (tests/conftest.py)")


class TinyServerModulesTogether(LoadFileScheduling):
    """`--dist loadfile` (a module's tests in one process, its servers started once), with the modules of
    TINY_SERVER_MODULES as one. (xdist's `loadgroup` cannot do it on pytest 9: it renames test ids.) Modules go
    out in collection order (`_longest_first`), not xdist's default of most tests first: a slow module of few
    tests came last and ran alone."""

    def __init__(self, config, log=None):
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return "tiny_servers" if module in TINY_SERVER_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return TinyServerModulesTogether(config, log)
    return None


class _LongestFirst:
    @pytest.hookimpl(trylast=True)  # after pytest's own reordering, which groups tests by their fixtures' parameters
    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: _longest_first(item.nodeid.split("::", 1)[0]))  # stable: a module's order kept


def pytest_configure(config):
    config.pluginmanager.register(_LongestFirst(), "longest-first")
    # The test processes of a run (and of the container pass beside it) load their servers one at a time: loads
    # side by side on a small machine starved the Python stubs into Triton 2.51's wedge start after start.
    os.environ.setdefault(SERVER_START_LOCK_ENV, os.path.join(tempfile.gettempdir(), "tritonforge-test-starts.lock"))
    # A run stopped with SIGTERM (`timeout`, a CI job's limit) ends as Ctrl+C does: pytest then tears down the
    # fixtures, which stop the tritonservers they started (their own sessions would outlive the run).
    signal.signal(signal.SIGTERM, _interrupt)

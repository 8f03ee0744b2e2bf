"""LangChain's own standard tests for embeddings (langchain-tests) against IngestEmbeddings, for
each backend. Each backend's pool starts once for the module and is shared by its tests."""
from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from ingest.api import EncodePool, IngestEmbeddings
from ingest.backends import BACKENDS, MODEL_FREE, ensure_export
from ingest.model_ref import resolve_model

_pools: dict[str, EncodePool] = {}


def _pool(backend: str) -> EncodePool:
    if backend != "torch" and backend not in MODEL_FREE:      # no export to make or guard
        entry = ensure_export(resolve_model())[backend]
        if not entry["ok"]:                 # the guard decides per CPU (test_onnx.guarded)
            pytest.skip(f"{backend} refused by its guard on this CPU: {entry['reason']}")
    if backend not in _pools:
        _pools[backend] = EncodePool("default", backend=backend)
    return _pools[backend]


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    yield
    for pool in _pools.values():
        pool.close()
    _pools.clear()


class _Ingest:
    backend = "torch"

    @property
    def embeddings_class(self) -> type[IngestEmbeddings]:
        return IngestEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"pool_or_model": _pool(self.backend)}


# TestTorchUnit, TestTorchIntegration, TestOnnxUnit, …, TestNullIntegration: both suites per backend
for _backend in BACKENDS:
    for _suite in (EmbeddingsUnitTests, EmbeddingsIntegrationTests):
        _name = f"Test{_backend.title().replace('-', '')}{_suite.__name__.removeprefix('Embeddings').removesuffix('Tests')}"
        globals()[_name] = type(_name, (_Ingest, _suite), {"backend": _backend})

"""An autouse fixture for test modules that make ``HybridLLM`` clients without closing each one.

A client sits in a reference cycle, so one left open is collected by some later test's garbage
collection in the same worker, and its "garbage-collected without close()" ResourceWarning is
reported there (as an error under warnings as errors). Import the fixture into the module:
``from tests._open_clients import close_clients_left_open  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hybridllm._lifecycle import _OPEN_CLIENTS, _snapshot


@pytest.fixture(autouse=True)
def close_clients_left_open() -> Iterator[None]:
    """Close, at the test's end, the clients it made and left open."""
    before = {id(client) for client in _snapshot(_OPEN_CLIENTS)}
    yield
    for client in _snapshot(_OPEN_CLIENTS):
        if id(client) not in before:
            client.close()

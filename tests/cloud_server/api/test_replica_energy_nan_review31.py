"""A replica's energy report that is no number of joules (review 31).

The cluster's front end takes a replica's ``energy`` from the last output as it is. A NaN there
failed a non-streamed answer with a 500 (JSON has no NaN: the response could not be written) after
the whole answer was generated; a stream carried ``"joules": null``. Now ``usage_of`` leaves such a
report out, streamed or not, and a good report still goes through.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import httpx
import pytest

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine, FakeOutput
from .helpers import ThreadServer


@dataclasses.dataclass
class _ReplicaOutput(FakeOutput):
    energy: dict | None = None


def _replica(joules: float) -> type[FakeEngine]:
    class Replica(FakeEngine):
        async def _run(self, request_id, ids, params):  # type: ignore[no-untyped-def]
            async for out in super()._run(request_id, ids, params):
                report = {"joules": joules, "source": "nvml", "joules_per_output_token": joules / 3}
                yield _ReplicaOutput(**dataclasses.asdict(out), energy=report if out.finished else None)

    return Replica


@pytest.fixture(params=[math.nan, -1.0, math.inf, 1.5], ids=["nan", "negative", "inf", "good"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, float]]:
    server = ThreadServer(create_app(_replica(request.param), energy="remote")).start()
    try:
        yield server.url, request.param
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_non_streamed_answer_with_a_replicas_bad_energy_is_still_answered(served: tuple[str, float],
                                                                            path: str) -> None:
    url, joules = served
    body: dict = {"model": "fake-model", "max_tokens": 3}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = httpx.post(url + path, json=body, timeout=10)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == 3
    if math.isfinite(joules) and joules >= 0:
        assert usage["energy"] == {"joules": joules, "source": "nvml", "joules_per_output_token": 0.5}
    else:
        assert "energy" not in usage

"""Review 20: the fleet board's actor dies (killed, its node lost). Whoever talks to it gets it
again by name (or creates it again) instead of keeping a dead handle for good: /health said 503
for ever while requests were still served, and the router's and the autoscaler's notes were lost.
Fakes of the actor handle raise the errors Ray raises; no Ray cluster is started."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve", reason="needs the [cluster] extra")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402

from cloud_server.cluster.autoscale import TARGET_NOTE, QueuedTokensPolicy  # noqa: E402
from cloud_server.cluster.remote_engine import RemoteEngine  # noqa: E402

_DEATHS = [ActorDiedError(), ActorUnavailableError("the actor is unavailable", None)]


class _Board:
    """The board actor's handle: ``snapshot``/``notes``/``post``/``note`` ``.remote`` calls; once
    ``dead`` is set, every call fails with that error, as a dead actor's calls do."""

    def __init__(self, fleet: dict | None = None, notes: dict | None = None) -> None:
        self.fleet = dict(fleet or {})
        self.noted = dict(notes or {})
        self.dead: BaseException | None = None
        self.snapshot = SimpleNamespace(remote=self._snapshot)
        self.notes = SimpleNamespace(remote=self._notes)
        self.post = SimpleNamespace(remote=self._post)
        self.note = SimpleNamespace(remote=self._note)

    async def _snapshot(self, max_age_s: float) -> dict:
        if self.dead:
            raise self.dead
        return dict(self.fleet)

    async def _notes(self) -> dict:
        if self.dead:
            raise self.dead
        return dict(self.noted)

    async def _post(self, replica: str, report: dict) -> None:
        if self.dead:
            raise self.dead
        self.fleet[replica] = report

    def _note(self, key: str, value) -> SimpleNamespace:
        """Fire and forget, as Ray's: an ObjectRef whose ``future()`` fails if the actor died."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.dead:
            future.set_exception(self.dead)
        else:
            self.noted[key] = value
            future.set_result(None)
        return SimpleNamespace(future=lambda: future)


@pytest.mark.parametrize("death", _DEATHS, ids=lambda e: type(e).__name__)
def test_health_recovers_once_the_board_is_created_again(death):
    old = _Board({"r1": {"stats": {"steps": 1}}})
    new = _Board()
    renewed: list[int] = []

    def renew():
        renewed.append(1)
        return new

    engine = RemoteEngine(handle=None, model="m", board=old, target_replicas=1, stale_after_s=0.05,
                          renew_board=renew)

    async def run() -> list[str]:
        seen = []
        await engine._poll_once()
        seen.append(engine.health_detail()["status"])
        old.dead = death  # the actor is killed: its calls fail from now on
        await asyncio.sleep(0.06)
        await engine._poll_once()
        seen.append(engine.health_detail()["status"])  # the outage shows while it lasts
        new.fleet["r1"] = {"stats": {"steps": 2}}  # the replica's next post refills the new board
        await engine._poll_once()
        seen.append(engine.health_detail()["status"])
        return seen

    # before: the dead handle was kept, so /health said "unavailable" (503) for good
    assert asyncio.run(run()) == ["ok", "unavailable", "ok"]
    assert renewed == [1]
    assert engine.stats()["steps"] == 2


def test_a_board_that_is_only_slow_is_not_created_again():
    board = _Board({"r1": {"stats": {}}})
    board.dead = TimeoutError()  # not an actor's death: the same board is asked again
    renewed: list[int] = []
    engine = RemoteEngine(handle=None, model="m", board=board, renew_board=lambda: renewed.append(1))
    asyncio.run(engine._poll_once())
    assert renewed == [] and engine._board is board


def test_the_autoscaled_target_is_kept_while_a_new_board_lacks_its_note():
    old = _Board({}, {TARGET_NOTE: 0})  # scaled to zero (--min-replicas 0)
    new = _Board()
    engine = RemoteEngine(handle=None, model="m", board=old, target_replicas=2, renew_board=lambda: new)

    async def run() -> None:
        await engine._poll_once()
        assert engine.health_detail()["status"] == "idle"
        old.dead = ActorDiedError()
        await engine._poll_once()
        await engine._poll_once()  # the new board: no target noted yet

    asyncio.run(run())
    # not "unavailable" (503) on the first replica count until the policy notes its target again
    assert engine.health_detail()["status"] == "idle"


def test_a_replica_gets_the_board_again_once_its_actor_died(monkeypatch):
    from cloud_server.cluster import app
    from cloud_server.cluster.app import EngineReplica

    old, new = _Board(), _Board()
    old.dead = ActorDiedError()
    asked: list[str] = []
    monkeypatch.setattr(app, "board_handle", lambda name: asked.append(name) or new)
    replica = EngineReplica.__new__(EngineReplica)
    replica.engine = SimpleNamespace(is_ready=True, stats=lambda: {"steps": 1})
    replica.meter = SimpleNamespace(name="estimate")
    replica.replica = "r1"
    replica._board_name = "board-1"
    replica._board = old

    async def run() -> None:
        poster = asyncio.create_task(replica._post_stats())
        await asyncio.sleep(1.2)  # the first post fails; the second goes to the new board
        poster.cancel()

    asyncio.run(run())
    # before: every post went to the dead actor for good, and /health never saw the replica again
    assert asked == ["board-1"]
    assert set(new.fleet) == {"r1"}


def _ask_again(monkeypatch, new):
    import ray

    asked: list[str] = []
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace: asked.append(name) or new)
    return asked


def test_the_routers_notes_go_to_the_board_created_again(monkeypatch):
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    old, new = _Board(), _Board()
    asked = _ask_again(monkeypatch, new)
    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)
    router.initialize_state(block_size=4, board_name="board-1")
    router._board = old
    router._post_decisions()
    assert "router" in old.noted
    old.dead = ActorDiedError()
    for _ in range(3):  # once a second: the first fails, the next ones reach the new board
        router._posted_at = 0.0
        router._post_decisions()
    # before: the router kept noting to the dead actor for good
    assert asked == ["board-1"] and "router" in new.noted


def test_the_autoscalers_target_goes_to_the_board_created_again(monkeypatch):
    old, new = _Board(), _Board()
    asked = _ask_again(monkeypatch, new)
    policy = QueuedTokensPolicy(target_tokens_per_replica=100, board_name="board-1")
    policy._board = old
    policy._note_target(2)
    assert old.noted == {TARGET_NOTE: 2}
    old.dead = ActorDiedError()
    for target in (3, 4):  # a change is noted at once: the first fails, the next reaches the new one
        policy._note_target(target)
    # before: Serve's target never reached /health again; it compared with the first count
    assert asked == ["board-1"] and new.noted == {TARGET_NOTE: 4}

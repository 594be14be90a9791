"""bench.cluster's replica-death watch: the replicas as the fleet board sees them."""

from __future__ import annotations

import os
from typing import Any

from bench._cluster_requests import say


class Fleet:
    """The replicas as the fleet board sees them, and whether any of them died."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.pids: dict[str, int] = {}  # replica id -> pid, fixed after the warm-up
        self.deaths: list[str] = []

    async def snapshot(self, max_age_s: float = 5.0) -> dict[str, dict[str, Any]]:
        return await self.board.snapshot.remote(max_age_s)

    async def notes(self) -> dict[str, Any]:
        return await self.board.notes.remote()

    def pin(self, snap: dict[str, dict[str, Any]]) -> None:
        self.pids = {rid: int(v["pid"]) for rid, v in snap.items()}

    def check(self, snap: dict[str, dict[str, Any]]) -> None:
        """A replica died when its process is gone, a new replica id shows up (Serve replaced
        one), or a pinned replica stopped posting (it posts every second; 5 s is the limit)."""
        for rid, pid in self.pids.items():
            if not _alive(pid):
                self._death(f"replica {rid} (pid {pid}) exited")
            elif rid not in snap:
                self._death(f"replica {rid} (pid {pid}) stopped reporting for 5 s")
        for rid in snap:
            if rid not in self.pids:
                self._death(f"a new replica {rid} appeared (Serve replaced one)")

    def _death(self, what: str) -> None:
        if what not in self.deaths:
            self.deaths.append(what)
            say(f"REPLICA DEATH: {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

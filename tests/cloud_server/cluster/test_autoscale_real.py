"""Autoscaling on queued tokens, for real: a local Ray cluster starts with one SmolLM2-135M replica
(``--min-replicas 1 --max-replicas 2``), queued tokens from concurrent long answers make Serve add
the second replica, which then serves, and an idle fleet goes back to one; ``/health`` counts
the replicas Serve wants at each stage. Every request sent meanwhile completes. Serve's own
delays are cut to seconds so the test runs in about a minute.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray", reason="needs the [cluster] extra (ray[serve])")
openai = pytest.importorskip("openai")

from cloud_server.cluster.launch import free_port  # noqa: E402 - after the skips

pytestmark = [
    pytest.mark.real,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = "smollm2"
BOARD = "hybridllm-fleet-autoscale-test"


def _replicas() -> dict[str, dict]:
    """The engine replicas that posted their stats within the last 3 s (pid per replica)."""
    board = ray.get_actor(BOARD, namespace="hybridllm")
    return ray.get(board.snapshot.remote(3.0))


def _running_replicas() -> int:
    from ray import serve

    from cloud_server.cluster.app import APP_NAME, ENGINE

    deployment = serve.status().applications[APP_NAME].deployments[ENGINE]
    return int(deployment.replica_states.get("RUNNING", 0))


def _wait(predicate, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")


def test_queued_tokens_scale_the_fleet_up_and_back_down(smollm2_path):
    from cloud_server.cluster import launch
    from cloud_server.config import ClusterConfig, EngineConfig

    engine = EngineConfig(
        str(smollm2_path), num_threads=1, max_model_len=1024, kv_cache_memory_bytes=48 << 20, max_num_seqs=8
    )
    # 8 answers of 160 tokens queue about 1,300 tokens: ceil(1300 / 256) = 6, clamped to 2
    cfg = ClusterConfig(
        replicas=1, min_replicas=1, max_replicas=2, target_tokens_per_replica=256,
        upscale_delay_s=0.0, downscale_delay_s=2.0, autoscale_window_s=11.0, stats_period_s=0.5,
    )
    port = free_port()
    try:
        url = launch.start(
            engine, cfg, host="127.0.0.1", port=port, board_name=BOARD,
            app_options={"served_model_name": MODEL},
            ray_init={"num_cpus": 4, "include_dashboard": False},
        )
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        assert _running_replicas() == 1 and len(_replicas()) == 1

        stop = threading.Event()
        results: list[str] = []

        def load(i: int) -> None:
            while not stop.is_set():  # keep tokens queued until the second replica serves
                try:
                    r = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"Tell me story {i}."}],
                        max_tokens=160, temperature=0, extra_body={"ignore_eos": True},
                    )
                    results.append("completed" if r.usage.completion_tokens == 160 else "short")
                except openai.APIError as exc:
                    results.append(f"failed: {exc}")

        # /health compares the reporting replicas with Serve's current target, not --min-replicas
        def health() -> tuple[str, dict]:
            body = httpx.get(f"{url}/health", timeout=10).json()
            return body["status"], body["replicas"]

        def steps() -> dict[str, int]:
            return {k: v["stats"].get("steps", 0) for k, v in _replicas().items()}

        # checked while the load goes on: once it stops, the averaged queue falls and Serve may
        # want one replica again before a slow machine has finished the load's last answers
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(load, i) for i in range(8)]
            try:
                up_s = _wait(lambda: _running_replicas() == 2 and len(_replicas()) == 2, 120, "scale-up")
                _wait(lambda: health() == ("ok", {"healthy": 2, "wanted": 2}), 30, "health 2/2")
                # the new replica serves: both replicas step on past where they were
                before = steps()
                _wait(lambda: len(now := steps()) == 2 and all(now[k] > before.get(k, 0) for k in now),
                      120, "both replicas serving")
            finally:
                stop.set()
            for f in futures:
                f.result(timeout=300)  # no request hangs
        print(f"scale-up to 2 replicas after {up_s:.1f} s of load; {len(results)} requests")
        assert results and all(r == "completed" for r in results), [r for r in results if r != "completed"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            done = list(pool.map(
                lambda i: client.completions.create(
                    model=MODEL, prompt=f"{i} " + "plums and figs " * (i + 2), max_tokens=24,
                    temperature=0, extra_body={"ignore_eos": True},
                ).usage.completion_tokens,
                range(4),
            ))
        assert done == [24] * 4

        # idle: the averaged queue falls to 0 and Serve removes a replica after its delay
        down_s = _wait(lambda: _running_replicas() == 1, 120, "scale-down")
        print(f"scale-down to 1 replica {down_s:.1f} s after the load stopped")
        _wait(lambda: health() == ("ok", {"healthy": 1, "wanted": 1}), 30, "health 1/1")
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert r.usage.completion_tokens > 0
    finally:
        launch.stop(cfg)
        assert not ray.is_initialized()

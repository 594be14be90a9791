"""Plain-data parts of the cluster: the autoscaling rule, the fleet board, the engine's load report,
the front end's health and error mapping, and the CLI without Ray."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cloud_server.cluster.autoscale import QueuedTokensPolicy, desired_replicas
from cloud_server.cluster.fleet import FleetBoard, aggregate_stats
from cloud_server.cluster.remote_engine import RemoteEngine, _replica_error
from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.llm_engine import LLMEngine
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence
from cloud_server.exceptions import ConfigError, EngineError, QueueFullError, ServerError


def test_desired_replicas_follow_queued_tokens_within_bounds():
    assert desired_replicas(0, 1000, current=3, min_replicas=1, max_replicas=8) == 1
    assert desired_replicas(2500, 1000, current=1, min_replicas=1, max_replicas=8) == 3
    assert desired_replicas(1e9, 1000, current=1, min_replicas=1, max_replicas=8) == 8
    ctx = SimpleNamespace(
        aggregated_metrics={"outstanding_tokens": {"r1": 3000.0, "r2": 2000.0}},
        current_num_replicas=2,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=4,
        policy_state={},
    )
    assert QueuedTokensPolicy(target_tokens_per_replica=1000)(ctx) == (4, {})
    ctx.aggregated_metrics = {}
    assert QueuedTokensPolicy()(ctx)[0] == 1


def test_policy_notes_serves_target_for_health():
    notes: list[tuple[str, int]] = []
    board = SimpleNamespace(note=SimpleNamespace(remote=lambda key, value: notes.append((key, value))))
    policy = QueuedTokensPolicy(target_tokens_per_replica=1000, board_name="board")
    policy._board = board
    ctx = SimpleNamespace(
        aggregated_metrics={}, current_num_replicas=1, target_num_replicas=2,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4, policy_state={},
    )
    policy(ctx)
    policy(ctx)  # the same target within a second: noted once
    ctx.target_num_replicas = 3
    policy(ctx)  # a change: noted at once
    assert notes == [("target_replicas", 2), ("target_replicas", 3)]

    engine = RemoteEngine(handle=None, model="m", target_replicas=1)  # --min-replicas 1
    engine._fleet = {"r1": {}}
    assert engine.health_detail() == {"status": "ok", "replicas": {"healthy": 1, "wanted": 1}}
    engine._serve_target = 2  # scaled to 2, one of them gone: degraded, not ok
    assert engine.health_detail() == {"status": "degraded", "replicas": {"healthy": 1, "wanted": 2}}


def test_fleet_board_drops_silent_replicas_and_sums_counters():
    board = FleetBoard()
    board.post("a", {"stats": {"steps": 3}})
    assert board.snapshot(max_age_s=60) == {"a": {"stats": {"steps": 3}}}
    assert board.snapshot(max_age_s=-1) == {}
    agg = aggregate_stats(
        [
            {"steps": 3, "kv_cache_usage": 0.5, "prefix_cache_hits": 10},
            {"steps": 4, "kv_cache_usage": 0.25, "prefix_cache_hits": 5},
        ]
    )
    assert agg == {"steps": 7, "kv_cache_usage": 0.5, "prefix_cache_hits": 15, "num_replicas": 2}


def test_load_report_counts_prefill_and_expected_decode_tokens():
    engine = LLMEngine.__new__(LLMEngine)  # the bookkeeping only, no model
    engine.block_manager = BlockManager(32, 4)
    engine.scheduler = Scheduler(engine.block_manager, max_num_seqs=4, max_num_batched_tokens=64)
    running = Sequence("r", list(range(10)), SamplingParams(max_tokens=20))
    engine.scheduler.add(running)
    engine.scheduler.schedule()  # prefills all 10 prompt tokens
    running.token_ids += [1, 2, 3]  # three tokens decoded: all but the last one computed
    running.num_computed_tokens = 12
    engine.scheduler.add(Sequence("w", list(range(100, 108)), SamplingParams(max_tokens=5)))
    report = engine.load_report()
    assert report["prefill_tokens"] == 8  # the waiting prompt
    assert report["decode_tokens"] == (20 - 3) + 5
    assert report["outstanding_tokens"] == 8 + 22
    assert isinstance(report["prefix_hashes"], list)


def test_health_detail_and_error_mapping():
    engine = RemoteEngine(handle=None, model="m", target_replicas=2)
    engine._fleet = {"a": {}, "b": {}}
    assert engine.health_detail() == {"status": "ok", "replicas": {"healthy": 2, "wanted": 2}}
    engine._fleet = {"a": {}}
    assert engine.health_detail()["status"] == "degraded"
    engine._fleet = {}
    assert engine.health_detail()["status"] == "unavailable"
    own = QueueFullError("full")
    assert _replica_error(SimpleNamespace(cause=own)) is own  # a RayTaskError carries its cause
    assert _replica_error(RuntimeError("actor died")) is None  # a fault, not the replica's answer
    wrapped = EngineError("x")
    wrapped.cause = own  # what RayTaskError.as_instanceof_cause() carries
    assert _replica_error(wrapped) is own


class _DyingHandle:
    """A deployment handle whose replica dies: before its first output, then after it."""

    def __init__(self, fail_after: list[int]) -> None:
        self.fail_after = fail_after
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, prompt_ids, params, request_id):
        from ray.exceptions import ActorDiedError

        n = self.fail_after[min(self.calls, len(self.fail_after) - 1)]
        self.calls += 1

        class Stream:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                for i in range(3):
                    if i == n:
                        raise ActorDiedError()
                    yield SimpleNamespace(i=i, request_id=request_id)

            def cancel(self):
                pass

        return Stream()


@pytest.mark.parametrize("fail_after, outcome", [([0, 0, 9], 3), ([1], "error"), ([0, 0, 0], "error")])
def test_replica_death_before_the_first_output_is_retried_after_it_is_an_error(fail_after, outcome):
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    handle = _DyingHandle(fail_after)
    engine = RemoteEngine(handle, "m", retries=2)

    async def collect():
        return [o async for o in engine._stream("req", [1, 2], {})]

    if outcome == "error":
        with pytest.raises(EngineError, match="replica serving this request failed"):
            asyncio.run(collect())
    else:
        outs = asyncio.run(collect())
        assert len(outs) == outcome and outs[0].request_id == "req-retry2"


def test_cluster_config_validation():
    assert not ClusterConfig(replicas=2).autoscaling
    auto = ClusterConfig(replicas=2, max_replicas=4)
    assert auto.autoscaling and (auto.min_replicas, auto.max_replicas) == (1, 4)
    with pytest.raises(ConfigError, match="must lie within"):
        ClusterConfig(replicas=5, min_replicas=1, max_replicas=4)
    with pytest.raises(ConfigError, match="--min-replicas 3 is above --max-replicas 2"):
        ClusterConfig(replicas=3, min_replicas=3, max_replicas=2)  # not "--replicas 3 must lie within"
    with pytest.raises(ConfigError):
        ClusterConfig(replicas=0)
    for bad in ({"upscale_delay_s": -1}, {"downscale_delay_s": float("inf")}, {"autoscale_window_s": 0},
                {"upscale_delay_s": "5"}):
        with pytest.raises(ConfigError):
            ClusterConfig(replicas=1, max_replicas=2, **bad)


def test_autoscaling_flags_reach_serves_config():
    from cloud_server.__main__ import build_parser
    from cloud_server.cli_settings import _cluster_config

    args = build_parser().parse_args([
        "serve", "--model", "m.gguf", "--replicas", "1", "--max-replicas", "3",
        "--target-tokens-per-replica", "512", "--autoscale-window-s", "12",
        "--upscale-delay-s", "0", "--downscale-delay-s", "45",
    ])
    cfg = _cluster_config(args)
    assert (cfg.min_replicas, cfg.max_replicas, cfg.target_tokens_per_replica) == (1, 3, 512)
    assert (cfg.autoscale_window_s, cfg.upscale_delay_s, cfg.downscale_delay_s) == (12.0, 0.0, 45.0)
    defaults = _cluster_config(build_parser().parse_args(
        ["serve", "--model", "m.gguf", "--replicas", "1", "--max-replicas", "3"]))
    delays = (defaults.upscale_delay_s, defaults.downscale_delay_s, defaults.autoscale_window_s)
    assert delays == (30, 600, 30)
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from ray.serve.config import AutoscalingConfig

    from cloud_server.cluster.app import autoscaling_config

    auto = AutoscalingConfig(**autoscaling_config(cfg))  # what Serve validates and applies
    assert (auto.min_replicas, auto.max_replicas, auto.initial_replicas) == (1, 3, 1)
    assert (auto.look_back_period_s, auto.upscale_delay_s, auto.downscale_delay_s) == (12.0, 0.0, 45.0)
    assert auto.policy.policy_kwargs == {"target_tokens_per_replica": 512, "board_name": None}


def _cli(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_replicas_ray_is_never_imported():
    out = _cli(
        "import sys, asyncio\n"
        "from cloud_server.__main__ import build_parser\n"
        "from cloud_server.cli_settings import _cluster_config\n"
        "from cloud_server.api.server import create_app\n"
        "from tests.cloud_server.api.fake_engine import FakeEngine\n"
        "import httpx\n"
        "args = build_parser().parse_args(['serve', '--model', 'x'])\n"
        "assert _cluster_config(args) is None\n"
        "app = create_app(lambda: FakeEngine())\n"
        "async def go():\n"
        "    async with app.router.lifespan_context(app):\n"
        "        for _ in range(100):\n"
        "            await asyncio.sleep(0.02)\n"
        "            if app.state.server.engine is not None: break\n"
        "        t = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=t, base_url='http://t') as c:\n"
        "            r = await c.post('/v1/completions', json={'model': 'fake-model', 'prompt': 'ab'})\n"
        "            assert r.status_code == 200, r.text\n"
        "asyncio.run(go())\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_replicas_without_ray_installed_says_how_to_install(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    out = _cli(
        "import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
        "from cloud_server.__main__ import main\n"
        f"sys.exit(main(['serve', '--model', {str(model)!r}, '--replicas', '2']))\n"
    )
    assert out.returncode == 1
    assert "pip install 'hybridllm[cluster]'" in out.stderr and "Traceback" not in out.stderr


def test_cluster_flags_need_replicas(tmp_path, capsys):
    from cloud_server.__main__ import main

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert main(["serve", "--model", str(model), "--max-replicas", "3"]) == 2  # a usage error
    assert "go with --replicas" in capsys.readouterr().err
    assert main(["serve", "--model", str(model), "--upscale-delay-s", "3"]) == 2
    assert "go with --replicas" in capsys.readouterr().err
    assert main(["serve", "--model", str(model), "--replicas", "2", "--downscale-delay-s", "30"]) == 2
    err = capsys.readouterr().err
    assert "--downscale-delay-s tune autoscaling: add --min-replicas" in err and "Traceback" not in err


def test_app_builder_for_serve_config_files():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from ray.serve import Application

    from cloud_server.cluster.app import app_builder

    app = app_builder({"model": "m.gguf", "replicas": 3, "num_threads": 2, "served_model_name": "x",
                       "max_body_bytes": 1 << 20})  # every option of the CLI's front end
    assert isinstance(app, Application)
    assert app._bound_deployment.init_args[4] == {"served_model_name": "x", "max_body_bytes": 1 << 20}
    auto = app_builder({"model": "m.gguf", "replicas": 2, "min_replicas": 1, "max_replicas": 4})
    assert isinstance(auto, Application)  # Serve validated the queued-tokens autoscaling config
    with pytest.raises(ValueError, match="unknown"):
        app_builder({"model": "m.gguf", "nope": 1})


def test_unreachable_ray_address_fails_in_seconds(tmp_path, capsys):
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    import socket
    import time

    from cloud_server.__main__ import main

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    code = main(["serve", "--model", str(model), "--replicas", "1", "--port", "8123",
                 "--ray-address", f"127.0.0.1:{port}"])
    assert code == 1 and time.monotonic() - start < 30  # Ray alone retries for minutes
    err = capsys.readouterr().err
    assert f"nothing answers at --ray-address 127.0.0.1:{port}" in err and "ray start --head" in err


def test_health_scaled_to_zero_is_idle_not_ok():
    # --min-replicas 0: Serve holds no replica, so the next request waits for one to load its
    # model; "ok" would hide that cold start, 503 would make a readiness probe pull the server
    engine = RemoteEngine(handle=None, model="m", target_replicas=1)
    engine._serve_target, engine._fleet = 0, {}
    assert engine.health_detail() == {"status": "idle", "replicas": {"healthy": 0, "wanted": 0}}
    engine._serve_target = 1  # a request came: Serve starts a replica, which loads meanwhile
    assert engine.health_detail()["status"] == "unavailable"
    engine._fleet = {"r1": {}}
    assert engine.health_detail()["status"] == "ok"


def _engine_deployment(app):
    """The engine deployment bound into build_app's application (the front end's first arg)."""
    return app._bound_deployment.init_args[0]._bound_deployment


def test_an_autoscaled_fleet_wants_its_initial_replicas_until_serve_says_otherwise():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import build_app

    app = build_app(EngineConfig("m.gguf"), ClusterConfig(replicas=2, min_replicas=0, max_replicas=4))
    assert app._bound_deployment.init_args[3] == 2  # Serve starts 2: one up is degraded, not ok


def test_cuda_replicas_each_ask_ray_for_a_gpu_of_their_own():
    # without a GPU in ray_actor_options Ray places replicas by CPU and shows each every GPU:
    # all of them would share cuda:0
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import build_app

    cuda = _engine_deployment(build_app(EngineConfig("m.gguf", device="cuda"), ClusterConfig(replicas=2)))
    assert cuda.ray_actor_options == {"num_cpus": 1.0, "num_gpus": 1}
    cpu = _engine_deployment(build_app(EngineConfig("m.gguf", device="cpu"), ClusterConfig(replicas=2)))
    assert "num_gpus" not in cpu.ray_actor_options
    with pytest.raises(ConfigError, match="use --device cuda"):
        build_app(EngineConfig("m.gguf", device="cuda:1"), ClusterConfig(replicas=2))


def test_a_replica_the_autoscaler_removes_has_time_to_finish_its_answers():
    # Serve kills a replica it scales down graceful_shutdown_timeout_s after it stops sending it
    # requests; at 2 s every answer still streaming there was cut off mid-answer
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import build_app

    app = build_app(EngineConfig("m.gguf"), ClusterConfig(replicas=1, max_replicas=4))
    assert _engine_deployment(app)._deployment_config.graceful_shutdown_timeout_s >= 20


def test_a_local_ray_too_small_for_the_replicas_is_refused_not_waited_for(monkeypatch):
    # a local Ray never grows: Serve would wait for the third CPU for ever inside serve.run,
    # silently (Ray's logs do not reach the terminal)
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    import ray
    from ray import serve

    from cloud_server.cluster import launch

    def never(*_args, **_kwargs):
        raise AssertionError("serve.start reached: the fleet would wait for CPUs for ever")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(launch, "init_ray", lambda address, **_: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(serve, "start", never)
    port = launch.free_port()
    with pytest.raises(ServerError, match=r"--replicas 3 needs 3 CPUs .* has 2: ask for at most 2"):
        launch.start(EngineConfig("m.gguf"), ClusterConfig(replicas=3), host="127.0.0.1", port=port)
    with pytest.raises(ServerError, match="needs 2 GPUs .* has 0: join a cluster"):
        launch.start(EngineConfig("m.gguf", device="cuda"), ClusterConfig(replicas=2), host="127.0.0.1",
                     port=port)
    launch.check_capacity(ClusterConfig(replicas=2), {"CPU": 2.0})  # fits
    def no_ray(*_args, **_kwargs):
        raise AssertionError("Ray started before the bad --device was refused")

    monkeypatch.setattr(launch, "init_ray", no_ray)
    with pytest.raises(ConfigError, match="use --device cuda"):
        launch.start(EngineConfig("m.gguf", device="cuda:1"), ClusterConfig(replicas=1), host="127.0.0.1",
                     port=port)


def test_ray_address_auto_without_a_local_cluster_says_how_to_start_one(monkeypatch):
    from cloud_server.cluster.launch import _connect_hint

    hint = _connect_hint("auto")
    assert "ray start --head" in hint and "without --ray-address a local Ray instance" in hint
    # an explicit address: the token hint depends on RAY_AUTH_MODE (a real Ray test earlier in the
    # same process may have set it)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert "RAY_AUTH_MODE=token" in _connect_hint("10.0.0.1:6379")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert "RAY_AUTH_TOKEN" in _connect_hint("10.0.0.1:6379")


def test_stop_on_an_existing_cluster_deletes_the_app_and_its_fleet_board(monkeypatch):
    # the board is a detached actor: left alone it outlived every CLI run on the cluster
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    import ray
    from ray import serve

    from cloud_server.cluster import launch

    done: list[tuple] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "delete", lambda name: done.append(("delete", name)))
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace: (name, namespace))
    monkeypatch.setattr(ray, "kill", lambda actor: done.append(("kill", actor)))
    monkeypatch.setattr(ray, "shutdown", lambda: done.append(("shutdown",)))
    launch.stop(ClusterConfig(replicas=1, ray_address="auto"), "board-1")
    assert done == [("delete", "hybridllm"), ("kill", ("board-1", "hybridllm"))]


def test_sigterm_while_the_fleet_starts_stops_it_at_once(tmp_path):
    # loading the models (minutes for a large one) or waiting for Ray: SIGTERM used to be noted
    # and acted on only once the fleet was up, or never when it could not come up
    code = (
        "import os, signal, sys, threading, time\n"
        "from cloud_server.cluster import launch\n"
        "from cloud_server.config import ClusterConfig, EngineConfig\n"
        "stopped = []\n"
        "launch.require_ray = lambda: None\n"
        "launch.start = lambda *a, **k: time.sleep(60)\n"
        "launch.stop = lambda cluster, board=None, drain=True, delete_app=True: stopped.append(\n"
        "    (board is not None, drain))\n"
        "threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "t = time.monotonic()\n"
        "code = launch.serve_cluster(EngineConfig('m.gguf'), ClusterConfig(replicas=1), host='127.0.0.1',\n"
        "                            port=8000, power_watts=None, app_options={})\n"
        "print(code, stopped, time.monotonic() - t < 30)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # exit status 0, the board named for stop, nothing to drain, and well before start's 60 s
    assert out.stdout.strip() == "0 [(True, False)] True", out.stdout + out.stderr[-2000:]

"""A serve that joins a cluster never replaces or deletes an app it did not deploy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.exceptions import ServerError

pytest.importorskip("ray.serve", reason="needs the [cluster] extra")


def _serve_cluster(monkeypatch, start):
    from cloud_server.cluster import launch

    stops: list[dict] = []
    monkeypatch.setattr(launch, "start", start)
    monkeypatch.setattr(launch, "stop", lambda cluster, board, **kw: stops.append(kw))
    cluster = ClusterConfig(replicas=1, ray_address="127.0.0.1:6379")
    with pytest.raises(ServerError):
        launch.serve_cluster(EngineConfig(model="m"), cluster, host="127.0.0.1", port=8000,
                             power_watts=None, app_options={})
    return stops


def test_a_run_refused_before_it_deploys_leaves_the_clusters_app(monkeypatch):
    def refused(*args, **kwargs):
        raise ServerError("an app named 'hybridllm' already runs")

    stops = _serve_cluster(monkeypatch, refused)
    assert [kw.get("delete_app", True) for kw in stops] == [False]


def test_a_run_that_deployed_and_failed_deletes_its_app(monkeypatch):
    def deployed_then_failed(*args, deploying=None, **kwargs):
        deploying()
        raise ServerError("the engine replicas could not start")

    stops = _serve_cluster(monkeypatch, deployed_then_failed)
    assert [kw.get("delete_app", True) for kw in stops] == [True]


def test_an_app_already_on_the_cluster_is_refused_unless_replace(monkeypatch, caplog):
    from ray import serve

    from cloud_server.cluster import launch

    running = SimpleNamespace(applications={"hybridllm": SimpleNamespace(status="ApplicationStatus.RUNNING")})
    monkeypatch.setattr(serve, "status", lambda: running)
    with pytest.raises(ServerError, match=r"already runs on the Ray cluster at h:1 \(RUNNING\).*--replace"):
        launch._check_app_free("hybridllm", "h:1", replace=False)
    launch._check_app_free("hybridllm", "h:1", replace=True)  # taken over, with a warning
    assert "replacing the app 'hybridllm'" in caplog.text
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={}))
    launch._check_app_free("hybridllm", "h:1", replace=False)  # none there: fine


def test_replace_goes_with_an_existing_cluster(tmp_path, capsys):
    from cloud_server.__main__ import main

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert main(["serve", "--model", str(model), "--replace"]) == 2  # a usage error
    assert "go with --replicas" in capsys.readouterr().err
    assert main(["serve", "--model", str(model), "--replicas", "1", "--replace"]) == 2
    assert "--replace goes with --ray-address" in capsys.readouterr().err

"""Joining a Ray cluster that turns this process's token away fails at once, with what to check.

``ray.init`` retries the GCS's "Unauthenticated" answer for 20 s before its "Failed to connect";
``init_ray`` asks the GCS once first (its cluster id, with the token Ray would send) and stops
there on that answer, leaving every other answer to Ray. A real gRPC server stands in for the GCS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from cloud_server.cluster import launch
from cloud_server.cluster.net import _CLUSTER_ID_METHOD
from cloud_server.exceptions import ServerError

TOKEN = "a" * 64


class _Gcs(grpc.GenericRpcHandler):
    """Answers GetClusterId: to the right token when one is required, else to anyone; refuses
    with UNAUTHENTICATED as Ray's GCS does; every other method is UNIMPLEMENTED."""

    def __init__(self, token: str | None, cluster_id: bool = True) -> None:
        self.token, self.cluster_id, self.calls = token, cluster_id, []

    def service(self, details):
        if details.method != _CLUSTER_ID_METHOD or not self.cluster_id:
            return None

        def answer(request, context):
            metadata = dict(context.invocation_metadata())
            self.calls.append((request, metadata.get("authorization")))
            if self.token is not None and metadata.get("authorization") != f"Bearer {self.token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              "InvalidAuthToken: Authentication token is missing or incorrect")
            return b"\n\x00\x12\x1c" + bytes(28)

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.fixture
def gcs():
    servers = []

    def start(token: str | None, cluster_id: bool = True) -> tuple[str, _Gcs]:
        handler = _Gcs(token, cluster_id)
        server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", handler

    yield start
    for server in servers:
        server.stop(None)


@pytest.fixture
def ray_init(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    return calls


def test_a_cluster_that_wants_a_token_is_refused_before_ray_init(gcs, ray_init):
    from cloud_server.cluster.net import _connect_hint

    address, handler = gcs(TOKEN)
    with pytest.raises(ServerError) as err:
        launch.init_ray(address)
    message = str(err.value)
    assert message.startswith(f"the Ray cluster at --ray-address {address} turned this process away")
    assert "(InvalidAuthToken: Authentication token is missing or incorrect)" in message
    # what to check, as for any failed join (it depends on RAY_AUTH_MODE, which a local Ray
    # started earlier in this process sets; the cases of each are the subprocess tests below)
    assert message.endswith(_connect_hint(address))
    assert ray_init == []  # not Ray's 20 s of retries
    assert [request for request, _ in handler.calls] == [b""]  # one call, an empty request


@pytest.mark.parametrize("cluster_id", [True, False], ids=["answers", "unimplemented"])
def test_any_other_answer_is_left_to_ray(gcs, ray_init, cluster_id):
    address, handler = gcs(None, cluster_id)
    launch.init_ray(address)
    assert [call["address"] for call in ray_init] == [address]
    assert len(handler.calls) == int(cluster_id)


def test_a_head_that_does_not_answer_in_time_is_left_to_ray():
    import socket

    from cloud_server.cluster import net

    with socket.socket() as listener:  # takes the connection, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        net._check_token(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)  # no error


@pytest.mark.parametrize("address", ["auto", "ray://127.0.0.1:1", "localhost"])
def test_addresses_that_are_not_a_gcs_are_not_asked(address, monkeypatch):
    from cloud_server.cluster import net

    monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **k: pytest.fail("asked"))
    net._check_token(address)


_PROBE = """
import sys
from cloud_server.cluster.net import _check_token
from cloud_server.exceptions import ServerError
try:
    _check_token(sys.argv[1])
except ServerError as exc:
    print("refused:", exc)
else:
    print("accepted")
"""


@pytest.mark.parametrize(("given", "want"), [(TOKEN, "accepted"), ("b" * 64, "refused"), (None, "refused")])
def test_the_token_sent_is_the_one_ray_would_send(gcs, tmp_path, given, want):
    """Ray reads RAY_AUTH_MODE and the token once a process (and a local ``ray.init`` sets the
    mode in its environment), so each case runs in a process of its own."""
    address, handler = gcs(TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token
    if given is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=given)
    out = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(want), out.stdout + out.stderr
    if given is None:  # no token sent: the hint says how to send one
        assert "needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN" in out.stdout
    elif want == "refused":  # a token sent: check it is the cluster's
        assert "and that this token (RAY_AUTH_TOKEN" in out.stdout
    assert handler.calls == [(b"", None if given is None else f"Bearer {given}")]

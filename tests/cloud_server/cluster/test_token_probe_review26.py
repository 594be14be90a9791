"""A Ray whose private token helpers changed does not stop a join: the token check steps aside
and ``ray.init`` connects (or refuses) as it would without it.

``_check_token`` calls two helpers Ray does not promise to keep: ``is_token_auth_enabled`` and
its gRPC client interceptor. A Ray that moves them raises ImportError (left to Ray already); one
that changes how they are called raises anything else, which must not end ``serve`` either.
"""

from __future__ import annotations

import pytest

from cloud_server.cluster import launch

from .test_token_probe_review25 import TOKEN, gcs, ray_init  # noqa: F401 - fixtures

_AUTH = "ray._private.authentication"


def _broken(*args, **kwargs):
    raise TypeError("takes 2 positional arguments but 0 were given")


@pytest.mark.parametrize("where", [
    f"{_AUTH}.authentication_utils.is_token_auth_enabled",
    f"{_AUTH}.grpc_authentication_client_interceptor.SyncAuthenticationMetadataClientInterceptor",
], ids=["is_token_auth_enabled", "interceptor"])
def test_a_changed_private_helper_leaves_the_join_to_ray(gcs, ray_init, monkeypatch, where):  # noqa: F811
    address, handler = gcs(TOKEN)
    # the interceptor is built only when a token is on (Ray reads that once a process: set it here)
    monkeypatch.setattr(f"{_AUTH}.authentication_utils.is_token_auth_enabled", lambda: True)
    monkeypatch.setattr(where, _broken)
    launch.init_ray(address)  # no TypeError, no refusal
    assert [call["address"] for call in ray_init] == [address]
    assert handler.calls == []  # nothing sent without the token Ray would send

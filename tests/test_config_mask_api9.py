"""One helper for a URL's user:password@ (``_masking.split_userinfo`` / ``public_value``): the cloud
sends it as basic auth and names the endpoint without it, and everything shown masks it. Before,
``config show`` (``public_dict``) masked cloud_url's passwords but printed those of
cloud_endpoints' URLs whole."""

from __future__ import annotations

import json

from hybridllm._config import HybridLLMConfig
from hybridllm._masking import public_text, split_userinfo
from hybridllm.backends.cloud import CloudBackend


def test_show_masks_every_url_password_and_the_key():
    cfg = HybridLLMConfig(cloud_url="https://ann:hunter2@a.example/v1", cloud_api_key="sk-abcdefgh1234",
                          cloud_endpoints=[{"url": "https://bob:s3cret@b.example/v1", "region": "eu",
                                            "carbon_intensity": 50}])
    shown = json.dumps(cfg.public_dict(), default=str)
    assert "hunter2" not in shown and "s3cret" not in shown and "abcdefgh" not in shown
    assert "https://***@b.example/v1" in shown and "https://***@a.example/v1" in shown
    assert cfg.public_dict()["cloud_api_key"] == "***1234"
    assert HybridLLMConfig(cloud_api_key="short").public_dict()["cloud_api_key"] == "***"
    assert HybridLLMConfig().public_dict()["cloud_api_key"] is None


def test_the_cloud_and_the_display_read_the_same_userinfo():
    url = "https://us%40er:p%3Ass@h.example:8443/v1"
    assert split_userinfo(url) == ("https://h.example:8443/v1", ("us@er", "p:ss"))
    assert public_text(f"could not reach {url}") == "could not reach https://***@h.example:8443/v1"
    assert split_userinfo("http://h/v1?next=a@b") == ("http://h/v1?next=a@b", None)  # not userinfo
    cloud = CloudBackend(base_url=url)
    assert cloud.endpoints[0].base_url == "https://h.example:8443/v1"
    assert cloud._auth == {"https://h.example:8443/v1": ("us@er", "p:ss")}

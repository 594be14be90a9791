"""A cloud URL refused by the settings' rule never prints its password (errors are printed and
logged): check_url quoted the URL as given, user:password@ included."""

import pytest

from hybridllm import ConfigError
from hybridllm.backends.circuit import check_url


@pytest.mark.parametrize("url", ["http://alice:s3cret@h:99999/v1", "http://alice:s3cret@[::1/v1",
                                 "ftp://alice:s3cret@h/v1", "http://alice:s3cret@/v1"])
def test_a_refused_url_is_quoted_without_its_password(url):
    with pytest.raises(ConfigError) as err:
        check_url("cloud_url", url)
    assert "s3cret" not in str(err.value) and "cloud_url" in str(err.value)
    assert "***@" in str(err.value)


def test_a_good_url_with_credentials_still_passes():
    check_url("cloud_url", "https://alice:s3cret@h.example:8443/v1")

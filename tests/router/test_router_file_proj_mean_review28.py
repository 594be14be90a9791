"""Review 28: a router file whose neighbor projection mean is two-dimensional ([e, 1], a hand edit
or a bad conversion) is refused at load. It broadcast each prompt into e rows: a single scorer
loaded and scored the first of those, a different number than the router's, without a word, and a
source mixture loaded and failed at the first request with numpy's "all input arrays must have
the same shape"."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.router import load_router
from tests.router.test_router_file_review15 import _copy, routers  # noqa: F401 (a fixture)


@pytest.mark.parametrize(("which", "name"), [("one", "proj_mean"), ("mix", "expert0_proj_mean")])
def test_two_dimensional_proj_mean_is_refused_at_load(routers, tmp_path, which, name):  # noqa: F811
    folders, _ = routers
    load_router(folders[which])  # whole, it loads
    bad = _copy(folders[which], tmp_path / "bad", **{name: lambda a: a[:, None]})
    with pytest.raises(RouterFileError, match="neighbor arrays do not match"):
        load_router(bad)

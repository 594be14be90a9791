"""Fixtures shared by the whole suite: the embedded models and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache_dir(tmp_path_factory):
    """Tests never touch the user's semantic cache; models stay in the shared data dir."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path_factory.mktemp("hybridllm-cache")))
    mp.delenv("HYBRIDLLM_CONFIG", raising=False)
    yield
    mp.undo()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data is absent (looked in {SHARED_DATA}); it holds the real datasets")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from hybridllm.models import pull

    return pull("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from hybridllm.models import pull

    return pull("gemma3-270m")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from hybridllm.models import pull

    return pull("minilm-l6-v2")

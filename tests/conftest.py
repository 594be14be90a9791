"""Fixtures shared by the whole suite: the embedded models and the shared data folder."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

# as in the server: cloud_server's import caps oneDNN below AMX before torch runs a bf16 matmul
# (cloud_server/cpu_features.py), whichever test a worker happens to run first
import cloud_server  # noqa: F401,I001 - imported for that effect, before any test module's torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Every session starts from empty folders, as on a user's first run: models are copied out of
    their packages and the cache's ONNX models are built again, and the user's own data and
    semantic cache are never touched (``make test`` also points both at empty folders)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HYBRIDLLM_HOME", str(tmp_path_factory.mktemp("hybridllm-home")))
    cache = tmp_path_factory.mktemp("hybridllm-cache")
    mp.setenv("HYBRIDLLM_CACHE_DIR", str(cache))
    # embeddings of whole datasets (minutes to compute) are keyed by content: kept across sessions
    shared = Path.home() / ".cache" / "hybridllm" / "embeddings"
    mp.setenv("HYBRIDLLM_EMBEDDINGS_DIR", os.environ.get("HYBRIDLLM_EMBEDDINGS_DIR") or str(shared))
    mp.delenv("HYBRIDLLM_CONFIG", raising=False)
    # Ray 2.60's local ray.init() turns token auth on and, with no token given, writes one to
    # ~/.ray/auth_token, after which the user's own `ray start` runs with token auth too: the
    # session's local clusters take a token from the environment instead (tests that need another
    # set their own; one given by the user is kept)
    if not any(os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        mp.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    yield cache
    mp.undo()


# What a test shares with the rest of the session in the cache folder: builds keyed by their
# content (the engine's CPU kernels, training-set embeddings), slow to make and never read as state.
_SHARED_IN_CACHE_DIR = ("kernels", "train")


@pytest.fixture(autouse=True)
def _own_cache_dir(_isolated_dirs: Path):
    """Each test gets its own HYBRIDLLM_CACHE_DIR, so a client built without ``cache=False`` or a
    ``cache_path`` (``SemanticCache()`` too) starts from an empty semantic cache, and from no
    remembered cloud refusals, whatever ran before. With one folder for the session every such test
    read and wrote one file: a test could be served another test's cached answer ("cache" instead of
    "edge") and pass or fail by the (random) order. The content-keyed builds are links to the
    session folder's, built once; the models the cache runs live under HYBRIDLLM_HOME, shared.

    Fixtures of a wider scope are set up first, so a module's or the session's client keeps the
    session folder; a test that sets HYBRIDLLM_CACHE_DIR itself (``monkeypatch``) overrides this."""
    import tempfile

    root = _isolated_dirs.with_name(_isolated_dirs.name + "-tests")
    root.mkdir(exist_ok=True)
    own = Path(tempfile.mkdtemp(dir=root))  # O(1), unlike numbering under tmp_path_factory
    for name in _SHARED_IN_CACHE_DIR:
        (_isolated_dirs / name).mkdir(exist_ok=True)
        (own / name).symlink_to(_isolated_dirs / name, target_is_directory=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("HYBRIDLLM_CACHE_DIR", str(own))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def _package_files() -> dict[Path, tuple[int, int]]:
    """The installed model packages' files, with their size and last write: a pulled model is a
    hard link to its package's file (``hybridllm.models.store``), so a test that writes into a
    pulled file writes into the package, and every later test reads the damage."""
    from hybridllm.models import _sources, catalog

    found: dict[Path, tuple[int, int]] = {}
    for spec in catalog.load_catalog().values():
        for file in spec.files:
            try:
                parts = _sources._source_parts(spec, file)
            except Exception:  # a package not installed here
                continue
            for part in parts:
                st = part.stat()
                found[part] = (st.st_size, st.st_mtime_ns)
    return found


@pytest.fixture(autouse=True)
def _packages_untouched(_package_files: dict[Path, tuple[int, int]]):
    """Fails the test that wrote into an installed model package's file (through a pulled model's
    link), so the damage is named where it happened, not in the tests that read it later."""
    yield
    for part, (size, mtime) in _package_files.items():
        st = part.stat()
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            _package_files[part] = (st.st_size, st.st_mtime_ns)  # named once, in this test
            pytest.fail(f"this test wrote into {part}, an installed model package's file (a pulled model "
                        "is a hard link to it): damage a copy put in its place instead (os.replace); "
                        "reinstall the package", pytrace=False)


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


# Modules that start a local Ray cluster: under xdist they run on one worker, one after another
# (two local clusters on one machine fight over its ports and cores)
_RAY_MODULES = "tests/cloud_server/cluster/test_*_real.py"


class _WholeModules:
    """``TEST_WORKERS=N make test`` (``-n N --dist loadscope``): each module runs whole on one worker, so
    its module-scoped fixtures (an engine, a server, a Ray cluster) are built once, and the Ray
    modules form one unit. xdist's ``loadgroup`` marks cannot say this here: they rewrite
    ``item._nodeid``, which pytest 9 no longer reads."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        from fnmatch import fnmatch

        from xdist.scheduler import LoadScopeScheduling

        class Scheduler(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                return "ray" if fnmatch(module, _RAY_MODULES) else module

        return Scheduler(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    """One line on the free disk space where the suite writes its temporary folders (models pulled,
    exports built, a wheel's venv), shown under ``-q`` too: the first thing to look at when a run
    fails with ``No space left on device`` (ENOSPC), as one CI run did at 94%."""
    import shutil
    import tempfile

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):  # an xdist worker: the main says it
        return
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 2**30
    short = " (too little: expect ENOSPC failures)" if free < _PEAK_GIB else ""
    reporter.write_line(f"disk: {free:.1f} GiB free under {where}; a whole run writes up to about "
                        f"{_PEAK_GIB} GiB there{short}")


# measured by sampling `du` of pytest's folder through a fresh-clone `make test` (README, Development)
_PEAK_GIB = 4


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", None) == "loadscope":
        config.pluginmanager.register(_WholeModules(), "hybridllm-whole-modules")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """With ``HYBRIDLLM_TEST_FAST_EXIT=1`` (``make test`` sets it): end the process with the
    session's status once pytest is done, without the interpreter's teardown.

    The suite loads ONNX Runtime, llama.cpp, torch with our C++ kernels and Ray into one process;
    at interpreter exit their objects are destroyed in whatever order module teardown reaches them.
    One fresh-clone run of 722 passing tests (2026-11-27, seed 60306) ended with "Segmentation
    fault" after the summary, so `make test` failed; the same seed passed when repeated, and no
    test saw a crash. A crash after the summary says nothing about the code under test, so it must
    not decide CI; run pytest without the variable (and with ``PYTHONFAULTHANDLER=1``) to see such
    a crash and where it happens."""
    if os.environ.get("HYBRIDLLM_TEST_FAST_EXIT") != "1" or _EXIT_STATUS not in config.stash:
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash[_EXIT_STATUS])

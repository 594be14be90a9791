"""hybridllm embedded in an application: what importing it loads, the threads and the model a
client holds and gives back (close, a context manager, garbage collection, interpreter exit), use
from several threads and from inside a running event loop, no logging set-up or warnings, and no
files in the current folder. Fast tests on the fake backend; the same on SmolLM2 with llama.cpp
(``real``). Import checks compare module sets, never times."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, HybridLLMError
from hybridllm.backends.fake import FakeBackend

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "torch", "onnxruntime", "onnxruntime_genai", "llama_cpp", "httpx", "sqlite3",
         "fastapi", "uvicorn", "transformers", "sklearn", "tokenizers", "platformdirs", "safetensors")
NOT_CLOSED = "garbage-collected without"


def _run(code: str, *args: str, timeout: float = 240, env: dict[str, str] | None = None,
         **kwargs) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (this checkout first on the path), its output captured."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    env.pop("HYBRIDLLM_TEST_FAST_EXIT", None)
    return subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env, **kwargs)


def _heavy_loaded_by(statement: str) -> list[str]:
    code = f"""
        import json, sys
        {statement}
        print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({list(HEAVY)!r}))))
    """
    out = _run(code)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _our_threads(before: set[threading.Thread]) -> list[str]:
    # Thread objects, not idents: a thread ending as the test starts may pass its ident on
    return sorted(t.name for t in threading.enumerate() if t not in before)


def _fake(reply: str = "one two three", **kw) -> FakeBackend:
    return FakeBackend(reply=lambda m: reply, **kw)


# -- import ---------------------------------------------------------------------------------------
def test_import_loads_no_heavy_module():
    assert _heavy_loaded_by("import hybridllm") == []


@pytest.mark.parametrize("module", ["hybridllm.router.privacy", "hybridllm.router.budget",
                                    "hybridllm.cache.guards"])
def test_light_submodules_do_not_load_their_packages_heavy_parts(module):
    """A package's ``__init__`` used to import every public name: importing its PII scanner or the
    budget ledger loaded numpy and the router's scorer; a cache helper loaded numpy and sqlite3."""
    assert _heavy_loaded_by(f"import {module}") == []


def test_lazy_package_names_still_resolve():
    import hybridllm.cache as cache
    import hybridllm.router as router

    assert router.Budget.__module__ == "hybridllm.router.budget"
    assert router.load_router.__module__ == "hybridllm.router.router"
    assert cache.SemanticCache.__module__ == "hybridllm.cache.semantic"
    assert set(router.__all__) <= set(dir(router)) and set(cache.__all__) <= set(dir(cache))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        router.nope  # noqa: B018


def test_routing_needs_no_torch():
    """The light install has no torch: a client with a cloud routes (the router, the policy, the
    budget) with torch made unimportable."""
    out = _run("""
        import sys
        sys.modules["torch"] = None  # import torch -> ImportError
        from hybridllm import HybridLLM
        from hybridllm.backends.fake import FakeBackend
        with HybridLLM(edge=FakeBackend(), cloud_url="http://127.0.0.1:9", cache=False) as llm:
            c = llm.chat("What is the capital of France?", max_tokens=4)
        print(c.route, "|", c.reason)
    """)
    assert out.returncode == 0, out.stderr
    assert "score" in out.stdout  # the learned router decided


# -- threads and the model: close, with, collection, exit -----------------------------------------
def test_close_and_context_manager_end_every_thread():
    before = set(threading.enumerate())
    llm = HybridLLM(edge=_fake(), cache=False)
    llm.chat("hi")
    assert _our_threads(before)  # the loop and the device thread run while it is open
    llm.close()
    with HybridLLM(edge=_fake(), cache=False) as other:
        other.chat("hi")
    assert _our_threads(before) == []


class _SlowCache:
    """A cache whose lookup takes a while (a cold ONNX embedder, a slow disk)."""

    def __init__(self) -> None:
        self.looking_up = threading.Event()
        self.closed = False
        self.closed_under_a_lookup = False

    def embed_query(self, messages):
        self.looking_up.set()
        threading.Event().wait(0.3)  # the lookup's work
        self.closed_under_a_lookup = self.closed
        return None

    def get(self, messages, **kw):
        return None

    def put(self, messages, text, **kw):
        return None

    def close(self) -> None:
        self.closed = True


def test_close_waits_for_pool_jobs_before_closing_the_parts():
    """close() from another thread during a cache lookup: the lookup's pool thread used to outlive
    close(), and the cache was closed under it."""
    before = set(threading.enumerate())
    cache = _SlowCache()
    llm = HybridLLM(edge=_fake(), cache=cache)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            llm.chat("hi")
        except HybridLLMError as exc:
            errors.append(exc)

    reader = threading.Thread(target=ask)
    reader.start()
    assert cache.looking_up.wait(30)
    llm.close()
    leftover = _our_threads(before | {reader})
    reader.join(30)
    assert leftover == []
    assert not cache.closed_under_a_lookup and cache.closed
    assert len(errors) == 1 and "closed" in str(errors[0])


def test_client_collected_without_close_releases_threads_and_warns():
    """A client dropped without close() used to keep its loop thread, its device thread and its
    model for the life of the process (about 200 MB of RSS per SmolLM2 client)."""
    before = set(threading.enumerate())
    closed: list[bool] = []
    backend = _fake()
    backend.close = lambda: closed.append(True)  # type: ignore[method-assign]
    llm = HybridLLM(edge=backend, cache=False)
    assert llm.chat("hi").text == "one two three"
    with pytest.warns(ResourceWarning, match=NOT_CLOSED):
        del llm
        gc.collect()
    assert _our_threads(before) == [] and closed == [True]


def test_a_closed_client_does_not_warn_when_collected():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with HybridLLM(edge=_fake(), cache=False) as llm:
            llm.chat("hi")
        del llm
        gc.collect()


def test_a_stream_keeps_its_client_alive():
    """``HybridLLM(...).stream(...)`` leaves no other reference to the client: the stream must
    keep it (else collecting the client would close it under the reader)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the client is never closed here
        stream = HybridLLM(edge=_fake(), cache=False).stream("hi")
        gc.collect()
        assert "".join(ch.text for ch in stream) == "one two three"
        assert stream.completion is not None and stream.completion.route == "edge"
        del stream
        gc.collect()


def test_async_client_collected_without_aclose_releases_its_device_thread():
    before = set(threading.enumerate())
    allm = AsyncHybridLLM(edge=_fake(), cache=False)
    assert asyncio.run(allm.chat("hi")).text == "one two three"
    assert _our_threads(before)
    with pytest.warns(ResourceWarning, match=NOT_CLOSED):
        del allm
        gc.collect()
    assert _our_threads(before) == []


def test_wrap_keeps_the_sync_client_alive():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        allm = AsyncHybridLLM.wrap(HybridLLM(edge=_fake(), cache=False))
        gc.collect()
        assert asyncio.run(allm.chat("hi")).text == "one two three"
        allm._owner.close()  # type: ignore[union-attr]


def test_collected_on_its_own_device_thread_frees_the_model_only_after_the_answer_stops():
    """The collector may run on the client's own device thread, mid-answer (a cycle collected
    there). Freeing the model from that thread would free it under the token loop that thread
    returns to; the close is handed to another thread, which waits for the loop to stop."""
    from hybridllm._lifecycle import _close_collected

    events: list[str] = []

    class Backend(FakeBackend):
        def stream(self, messages, params):
            for i, delta in enumerate(super().stream(messages, params)):
                if i == 1:  # what the collector runs if it collects the client here
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ResourceWarning)
                        _close_collected(None, core, "AsyncHybridLLM")
                events.append("token")
                yield delta

        def close(self) -> None:
            events.append("close")

    allm = AsyncHybridLLM(edge=Backend(reply=lambda m: " ".join(["w"] * 40), delay_s=0.005),
                          cache=False)
    core = allm._core
    with pytest.raises(HybridLLMError):  # closed mid-answer: an error, never a short answer
        asyncio.run(allm.chat("hi"))
    for t in threading.enumerate():
        if t.name == "hybridllm-close":
            t.join(30)
    assert events.count("close") == 1 and events[-1] == "close", events
    allm._finalizer.detach()  # type: ignore[union-attr]  # closed above


EXIT_WITH_OPEN_STREAM = """
    import atexit, os, threading
    # registered before hybridllm is imported, so it runs after hybridllm's own exit handlers
    atexit.register(lambda: print("AT-EXIT", sorted(t.name for t in threading.enumerate()),
                                  llm.edge.__dict__.get("_llm", "fake") is None, flush=True))
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend
    if os.environ.get("EDGE_MODEL"):
        llm = HybridLLM(edge_model=os.environ["EDGE_MODEL"], n_ctx=512, cache=False)
    else:
        llm = HybridLLM(edge=FakeBackend(reply=lambda m: " ".join(["w"] * 500), delay_s=0.01),
                        cache=False)
    it = iter(llm.stream("Write a long story about a dragon.", max_tokens=400))
    next(it), next(it)  # the answer is half read when the program ends
    print("EXITING", flush=True)
"""


def _exit_with_open_stream(**env: str) -> subprocess.CompletedProcess:
    return _run(EXIT_WITH_OPEN_STREAM, env=env)


def test_exit_with_a_half_read_stream_closes_the_client_before_teardown():
    """A stream left open at exit was closed in teardown, when the client's loop thread (a
    daemon) no longer runs: exit waited 60 s for it. The client is now closed at exit, first."""
    out = _exit_with_open_stream()
    assert out.returncode == 0, out.stderr
    at_exit = next(line for line in out.stdout.splitlines() if line.startswith("AT-EXIT"))
    assert at_exit.startswith("AT-EXIT ['MainThread']"), at_exit  # no hybridllm thread left
    assert "Traceback" not in out.stderr, out.stderr


def test_exit_runs_no_close_twice_and_prints_nothing_for_a_closed_client():
    out = _run("""
        from hybridllm import HybridLLM
        from hybridllm.backends.fake import FakeBackend
        with HybridLLM(edge=FakeBackend(), cache=False) as llm:
            llm.chat("hi")
        kept = HybridLLM(edge=FakeBackend(), cache=False)  # open at exit: closed quietly then
        kept.chat("hi")
    """, "-W", "error")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


# -- logging, warnings, output --------------------------------------------------------------------
def test_a_first_run_configures_no_logging_and_warns_nothing(tmp_path):
    """``-W error``: any warning fails the run; the root logger keeps no handler; stdout stays
    the application's; nothing lands in the current folder. The semantic cache (the default) and a
    cloud (unreachable) are configured, as an app would."""
    out = _run("""
        import logging
        from hybridllm import HybridLLM
        from hybridllm.backends.fake import FakeBackend
        with HybridLLM(edge=FakeBackend(), cloud_url="http://127.0.0.1:9", cloud_model="m",
                       cloud_max_retries=0) as llm:
            llm.chat("hi", route="edge")
            llm.chat("What is the capital of France?")
        assert logging.getLogger().handlers == [], logging.getLogger().handlers
        assert logging.getLogger("hybridllm").handlers == []
    """, "-W", "error", cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, ""), out.stderr
    assert list(tmp_path.iterdir()) == []


# -- offline start --------------------------------------------------------------------------------
def test_an_unreachable_cloud_costs_nothing_before_the_first_cloud_call():
    """Construction opens no connection and a device-routed answer never touches the cloud."""
    import hybridllm.backends.cloud as cloud_mod

    made: list[object] = []
    real_client = cloud_mod.CloudBackend._client

    def counting(self):
        made.append(self)
        return real_client(self)

    cloud_mod.CloudBackend._client = counting  # type: ignore[method-assign]
    try:
        with HybridLLM(edge=_fake(), cloud_url="http://10.255.255.1:8000", cache=False) as llm:
            assert llm.chat("hi", route="edge").route == "edge"
            assert made == []
    finally:
        cloud_mod.CloudBackend._client = real_client  # type: ignore[method-assign]


# -- concurrency ----------------------------------------------------------------------------------
def _four_threads(llm: HybridLLM, n: int = 3, **params) -> tuple[dict, list]:
    answers: dict[tuple[int, int], str] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(n):
                answers[i, j] = llm.chat(f"Say the number {i}.", **params).text
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread never finished: deadlock"
    return answers, errors


def test_four_threads_share_one_client():
    with HybridLLM(edge=_fake(delay_s=0.002), cache=False) as llm:
        answers, errors = _four_threads(llm)
    assert errors == [] and sorted(answers.values()) == ["one two three"] * 12


def test_sync_client_inside_a_running_event_loop():
    """A notebook cell runs in an event loop: the sync client answers there (it runs its own
    loop on its own thread), a stream too."""
    with HybridLLM(edge=_fake(), cache=False) as llm:
        async def cell() -> tuple[str, str]:
            text = llm.chat("hi").text
            with llm.stream("hi") as stream:
                streamed = "".join(ch.text for ch in stream)
            return text, streamed

        assert asyncio.run(cell()) == ("one two three", "one two three")


# -- files ------------------------------------------------------------------------------------------
def test_files_go_to_hybridllm_dirs_never_the_current_folder(tmp_path, monkeypatch):
    cwd, cache_dir = tmp_path / "app", tmp_path / "cache"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(cache_dir))
    with HybridLLM(edge=_fake(), cache=True) as llm:
        llm.chat("What is the capital of France?")
        assert llm.chat("What is the capital of France?").route == "cache"
    assert list(cwd.iterdir()) == []
    assert (cache_dir / "semantic_cache.sqlite3").is_file()


# -- the real device model ------------------------------------------------------------------------
@pytest.mark.real
def test_real_model_client_collected_without_close_frees_the_model(smollm2_path):
    before = set(threading.enumerate())
    llm = HybridLLM(edge_model=str(smollm2_path), n_ctx=512, cache=False)
    assert "Paris" in llm.chat("What is the capital of France?", max_tokens=16, temperature=0).text
    edge = llm.edge
    with pytest.warns(ResourceWarning, match=NOT_CLOSED):
        del llm
        gc.collect()
    assert edge._llm is None  # type: ignore[attr-defined]  # llama.cpp's model and context freed
    assert _our_threads(before) == []


@pytest.mark.real
def test_real_model_exit_with_a_half_read_stream(smollm2_path):
    out = _exit_with_open_stream(EDGE_MODEL=str(smollm2_path))
    assert out.returncode == 0, out.stderr
    at_exit = next(line for line in out.stdout.splitlines() if line.startswith("AT-EXIT"))
    assert at_exit == "AT-EXIT ['MainThread'] True", at_exit  # threads ended, the model freed


@pytest.mark.real
def test_real_model_shared_by_four_threads_and_used_in_an_event_loop(smollm2_path):
    with HybridLLM(edge_model=str(smollm2_path), n_ctx=512, cache=False) as llm:
        answers, errors = _four_threads(llm, n=2, max_tokens=8, temperature=0)
        assert errors == [] and len(answers) == 8 and all(answers.values())

        async def cell() -> str:
            return llm.chat("What is the capital of France?", max_tokens=16, temperature=0).text

        assert "Paris" in asyncio.run(cell())


def test_a_windowed_app_without_stderr_gets_no_error_from_first_run_notices(monkeypatch, capsys):
    """pythonw and frozen GUI builds run with sys.stderr None: the first run's notices (the cache
    model being prepared, a reranker that cannot load) wrote to it and raised AttributeError in
    the app's first answer, or went to stdout."""
    from hybridllm.cache import prepare, reranker

    monkeypatch.setattr(sys, "stderr", None)
    prepare.stderr_notice("Preparing the cache model ...\n")  # AttributeError before
    v = reranker.RerankVerifier.__new__(reranker.RerankVerifier)
    v._lock, v._fallback, v.features = threading.Lock(), None, None
    v._fall_back(RuntimeError("no onnx here"))  # printed to stdout before
    assert v.kind == "features"
    assert capsys.readouterr().out == ""


def test_close_never_frees_the_model_under_a_step_that_does_not_stop(caplog):
    """close() waited 30 s for the device thread and then freed the model even when the thread was
    still inside a step (a long native call that cannot see the cancel): a llama.cpp or ONNX
    Runtime model freed under a running step crashes the process. It now stays loaded, with a
    warning."""
    import logging

    from hybridllm import HybridLLM
    from hybridllm._types import Usage
    from hybridllm.backends.base import Delta
    from hybridllm.backends.fake import FakeBackend

    inside, release, closed = threading.Event(), threading.Event(), []

    class Stuck(FakeBackend):
        def stream(self, messages, params):
            yield Delta("one")
            inside.set()
            release.wait(20)  # one step that does not look at the cancel
            yield Delta(" two")
            yield Delta("", finish_reason="stop", usage=Usage(1, 2))

        def close(self):
            closed.append(True)

    llm = HybridLLM(edge=Stuck(), cache=False)
    llm._core.close_timeout_s = 0.3
    def read() -> None:  # the sync client generates as its reader reads (on the device thread)
        try:
            for _ in llm.stream("hi"):
                pass
        except Exception:  # noqa: BLE001 - closed under it: an error, as documented
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert inside.wait(10)
    try:
        with caplog.at_level(logging.WARNING, logger="hybridllm"):
            llm.close()
        assert closed == [], "the model was freed under the running step"
        assert "left loaded" in caplog.text
    finally:
        release.set()

"""The public API as a library user meets it: per-call option errors, injected parts checked at
construction, errors that pickle, JSON-ready chunks, py.typed, and close() while threads read
(fake backend; one test on the real SmolLM2 model)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import logging
import pickle
import sys
import threading
import tomllib
import traceback
import warnings
from pathlib import Path

import pytest

import hybridllm
from hybridllm import (
    AsyncHybridLLM,
    CloudBudgetSpentError,
    CloudError,
    ConfigError,
    ContextWindowExceededError,
    HybridLLM,
    HybridLLMError,
    InvalidRequestError,
)
from hybridllm.backends.fake import FakeBackend

ROOT = Path(__file__).resolve().parents[1]


def _sync() -> HybridLLM:
    return HybridLLM(edge=FakeBackend(), cache=False)


def _both_raise(kwargs: dict, messages: object = "hi") -> tuple[BaseException, BaseException]:
    """The error of ``chat(messages, **kwargs)`` on the sync and on the async client."""
    with _sync() as llm:
        with pytest.raises(Exception) as sync_err:
            llm.chat(messages, **kwargs)

    async def main() -> BaseException:
        async with AsyncHybridLLM(edge=FakeBackend(), cache=False) as allm:
            with pytest.raises(Exception) as err:
                await allm.chat(messages, **kwargs)
            return err.value

    return sync_err.value, asyncio.run(main())


# -- per-call options -------------------------------------------------------------------------------
def test_an_unknown_option_is_named_with_a_hint_and_every_accepted_option():
    """A typo gets "did you mean", and the list of accepted options includes the routing ones
    (route, cache, cascade, namespace, priority), not only the sampling settings."""
    for err in _both_raise({"max_token": 5}):
        assert isinstance(err, InvalidRequestError)
        msg = str(err)
        assert "'max_token'" in msg and "did you mean 'max_tokens'?" in msg
        for name in ("temperature", "stop", "seed", "route", "cache", "cascade", "namespace", "priority"):
            assert name in msg
    sync_err, async_err = _both_raise({"rout": "edge", "stream": True})
    assert str(sync_err) == str(async_err)
    assert "['rout', 'stream']" in str(sync_err) and "did you mean 'route'?" in str(sync_err)


@pytest.mark.parametrize("kwargs, messages", [
    ({"route": "gpu"}, "hi"),
    ({"cache": "no"}, "hi"),
    ({"priority": 3}, "hi"),
    ({"namespace": ""}, "hi"),
    ({"seed": "1"}, "hi"),
    ({"stop": [1]}, "hi"),
    ({}, None),
    ({}, {"role": "user", "content": "hi"}),
    ({}, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
])
def test_bad_input_gets_the_same_clear_error_from_both_clients(kwargs, messages):
    sync_err, async_err = _both_raise(kwargs, messages)
    assert type(sync_err) is type(async_err) is InvalidRequestError
    assert str(sync_err) == str(async_err)


def test_messages_in_every_accepted_shape_give_the_same_answer():
    shapes = ["hi", [{"role": "user", "content": "hi"}], ({"role": "user", "content": "hi"},),
              [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]]
    with _sync() as llm:
        assert {llm.chat(m).text for m in shapes} == {"echo: hi"}


# -- injected parts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, named", [
    ({"edge": "smollm2-135m-instruct"}, "edge_model="),  # a model name where a Backend belongs
    ({"cloud": "http://gpu-host:8000"}, "cloud_url="),
    ({"cache": "yes"}, "True, False"),
    ({"policy": "cloud"}, "decide()"),
])
@pytest.mark.parametrize("client", [HybridLLM, AsyncHybridLLM])
def test_a_wrong_part_fails_at_construction_naming_the_argument(client, kwargs, named):
    """Not an AttributeError inside the first answer (edge=, cloud=), nor accepted and broken at
    the first lookup (cache="yes"), nor an error printed by the finalizer later."""
    options = {"edge": FakeBackend(), "cache": False, **kwargs}
    gc.collect()  # earlier tests' garbage is not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError) as err:
            client(**options)
        gc.collect()
    (arg,) = kwargs
    assert str(err.value).startswith(f"{arg}= must be") and named in str(err.value)
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks


@pytest.mark.parametrize("client", [HybridLLM, AsyncHybridLLM])
def test_the_constructor_shows_its_parts_to_type_checkers(client, tmp_path):
    """``HybridLLM(**options)`` told a type checker and an IDE nothing: the parts are keyword-only
    and typed (a Path config included), the settings (``HybridLLMConfig``) come as keywords."""
    params = inspect.signature(client).parameters
    for name, typ in [("config", "PathLike"), ("edge", "Backend"), ("cloud", "Backend"),
                      ("cache", "CachePort"), ("policy", "PolicyPort")]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None
        assert typ in str(params[name].annotation)
    assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD
    path = tmp_path / "hybridllm.toml"
    path.write_text("[hybridllm]\nmax_tokens = 2\n")
    llm = client(config=path, edge=FakeBackend(), cache=False)
    assert llm.config.max_tokens == 2
    if client is HybridLLM:
        assert llm.chat("one two three").finish_reason == "length"
        llm.close()
    else:
        asyncio.run(llm.aclose())


# -- errors -----------------------------------------------------------------------------------------
def _error_examples() -> list[HybridLLMError]:
    out: list[HybridLLMError] = []
    for name in hybridllm.__all__:
        cls = getattr(hybridllm, name)
        if not (isinstance(cls, type) and issubclass(cls, HybridLLMError)):
            continue
        if cls is CloudBudgetSpentError:
            out.append(cls("budget spent", reason="100 calls an hour; room at 12:00",
                           prompt_tokens=9000, context_length=8192))
        elif issubclass(cls, CloudError):
            out.append(cls("cloud failed", status_code=503, prompt_tokens=9000, context_length=8192))
        elif cls is ContextWindowExceededError:
            out.append(cls("too long", prompt_tokens=9000, context_length=8192))
        else:
            out.append(cls("something failed"))
    return out


def test_every_exported_error_pickles_with_its_attributes():
    """An error raised in a worker process reaches its parent whole (multiprocessing pickles it):
    CloudBudgetSpentError, whose reason is keyword-only, used to fail to unpickle."""
    examples = _error_examples()
    assert len(examples) >= 20
    for err in examples:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert (str(back), repr(back), back.args) == (str(err), repr(err), err.args)
        assert vars(back) == vars(err)
    budget = next(e for e in examples if isinstance(e, CloudBudgetSpentError))
    back = pickle.loads(pickle.dumps(budget))
    assert (back.reason, back.prompt_tokens, back.context_length) == (
        "100 calls an hour; room at 12:00", 9000, 8192)


# -- types ------------------------------------------------------------------------------------------
def test_chunks_serialise_to_json_like_completions():
    with _sync() as llm:
        with llm.stream("hi", max_tokens=5) as stream:
            chunks = list(stream)
    last = chunks[-1].to_dict()
    assert json.loads(json.dumps(last))["completion"] == json.loads(json.dumps(stream.completion.to_dict()))
    assert last["finish_reason"] == "stop" and last["route"] == "edge"
    first = chunks[0].to_dict()
    assert first["completion"] is None and first["text"] == chunks[0].text
    assert "".join(c.to_dict()["text"] for c in chunks) == stream.completion.text


def test_py_typed_is_shipped():
    """PEP 561: without py.typed a type checker ignores the package's annotations. setuptools
    ships py.typed as package data by default from version 69 on; the build requires at least that."""
    assert (Path(hybridllm.__file__).parent / "py.typed").is_file()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    spec = next(r for r in requires if r.startswith("setuptools"))
    assert spec.startswith("setuptools>=") and int(spec.split(">=")[1].split(".")[0]) >= 69


# -- threads ----------------------------------------------------------------------------------------
def _read_until_closed(llm: HybridLLM, n_threads: int, how: str) -> tuple[list[str], list[bool]]:
    errors: list[str] = []
    answers: list[bool] = []
    started = threading.Barrier(n_threads + 1)

    def reader(i: int) -> None:
        started.wait()
        try:
            for j in range(1000):
                prompt = f"question {i}-{j}"
                if how == "chat":
                    c = llm.chat(prompt)
                else:
                    with llm.stream(prompt) as s:
                        "".join(ch.text for ch in s)
                    c = s.completion
                answers.append(c.text.endswith(prompt) and c.finish_reason == "stop")
        except HybridLLMError as exc:
            errors.append(str(exc))

    # daemons: a reader left waiting fails this test, not the whole run's exit
    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    started.wait()
    while len(answers) < 2 * n_threads:
        threading.Event().wait(0.005)
    llm.close()
    for t in threads:
        t.join(timeout=30)
    # where a reader still waits (a reader waiting for the device's turn, dropped unrun, hung here)
    frames = sys._current_frames()
    alive = {t.name: "".join(traceback.format_stack(frames[t.ident])) if t.ident in frames else "?"
             for t in threads if t.is_alive()}
    assert not alive, alive
    return errors, answers


@pytest.mark.parametrize("how", ["chat", "stream"])
def test_close_while_threads_read_stops_them_cleanly(how, caplog):
    """A web app's shutdown: close() while threads read answers. Each reader gets HybridLLMError
    (never a cut answer passed off as finished), and the answers that were half-way are wound
    up before the loop stops: asyncio used to log "Task was destroyed but it is pending!" for
    each (their cleanup scheduled on a loop that was stopping)."""
    llm = HybridLLM(edge=FakeBackend(delay_s=0.002, reply=lambda m: "answer to " + m[-1]["content"]),
                    cache=False)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        errors, answers = _read_until_closed(llm, 3, how)
        gc.collect()
    assert len(errors) == 3 and all("closed" in e for e in errors)
    assert answers and all(answers)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


# -- the real model -----------------------------------------------------------------------------------
def test_real_model_threads_share_one_client_then_close(smollm2_path, caplog):
    """SmolLM2 on llama.cpp: three threads asking at once each get the greedy answer to their own
    question (the one it gets alone), JSON-ready; then close() while they read ends each with
    HybridLLMError and leaves nothing pending on the loop."""
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=512, n_threads=1)
    llm = HybridLLM(edge=edge, cache=False, max_tokens=6, temperature=0)
    questions = ["What is 2+2?", "Name a colour.", "Say hello."]
    alone = {q: llm.chat(q).text for q in questions}
    together: dict[str, str] = {}

    def ask(q: str) -> None:
        together[q] = json.loads(json.dumps(llm.chat(q).to_dict()))["text"]

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert together == alone

    errors: list[str] = []  # (an error kept would keep its stream alive through its traceback)

    def read() -> None:  # short answers one after another, as a web app's requests come
        try:
            for _ in range(1000):
                for _ in llm.stream("Name a colour.", max_tokens=3):
                    pass
        except HybridLLMError as exc:
            errors.append(str(exc))

    readers = [threading.Thread(target=read) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for t in readers:
            t.start()
        threading.Event().wait(0.5)
        llm.close()
        for t in readers:
            t.join(timeout=30)
        gc.collect()
    assert len(errors) == 2 and all("closed" in e for e in errors)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_the_api_key_is_not_in_the_settings_repr():
    """``repr(llm.config)`` (a log line, an error report, a notebook cell) showed the key whole."""
    with HybridLLM(edge=FakeBackend(), cache=False, cloud_url="http://gpu-host:8000",
                   cloud_api_key="sk-VERYSECRET-1234") as llm:
        assert "VERYSECRET" not in repr(llm.config) and "VERYSECRET" not in repr(llm)
        assert llm.config.cloud_api_key == "sk-VERYSECRET-1234"  # still there for the cloud client

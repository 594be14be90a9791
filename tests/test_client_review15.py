"""The client's constructor refuses wrong objects at once, with a ConfigError that says what to
pass; an aclose() cut half way leaks nothing (helper-d1, review 15)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from hybridllm import AsyncHybridLLM, ConfigError, HybridLLM, HybridLLMError
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache
from hybridllm.router.policy import RoutingPolicy


def _edge() -> FakeBackend:
    return FakeBackend(reply=lambda m: "a b c")


@pytest.mark.parametrize("client", [HybridLLM, AsyncHybridLLM])
@pytest.mark.parametrize(
    ("part", "cls"),
    [("edge", FakeBackend), ("cloud", FakeBackend), ("cache", SemanticCache), ("policy", RoutingPolicy)],
)
def test_a_class_where_an_instance_belongs_is_refused_at_construction(client, part, cls):
    """Before: the class passed the check (its methods are there, unbound). edge=FakeBackend failed
    at the first answer with an EdgeError blaming the backend, cache=SemanticCache served no hit
    ever (every lookup and store failed, logged), and close() logged 'close() missing self'."""
    parts = {"edge": _edge(), "cache": False, part: cls}
    with pytest.raises(ConfigError) as err:
        client(**parts)
    assert str(err.value).startswith(f"{part}= must be ")
    assert f"got the class {cls.__name__}, not an instance: pass {cls.__name__}(...)." in str(err.value)


@pytest.mark.parametrize("client", [HybridLLM, AsyncHybridLLM])
def test_config_that_is_not_a_path_is_a_config_error(client):
    """Before: config={...} or config=llm.config raised a bare TypeError ('expected str, bytes or
    os.PathLike object, not dict') from deep in the path handling."""
    with HybridLLM(edge=_edge(), cache=False) as llm:
        settings = llm.config
    for config in ({"max_tokens": 3}, settings, 5):
        with pytest.raises(ConfigError, match=r"config= is the path of a TOML file; got "
                           rf"{type(config).__name__}\. Pass settings as keyword arguments"):
            client(edge=_edge(), cache=False, config=config)


def test_a_path_config_still_loads(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[hybridllm]\nmax_tokens = 7\n")
    for config in (path, str(path)):
        with HybridLLM(edge=_edge(), cache=False, config=config) as llm:
            assert llm.config.max_tokens == 7


class _Edge(FakeBackend):
    def __init__(self) -> None:
        super().__init__(reply=lambda m: "a b c")
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class _SlowCloseCloud(FakeBackend):
    async def aclose(self) -> None:  # closing its connections takes a while
        await asyncio.sleep(0.5)


def _cut_aclose(llm: AsyncHybridLLM) -> None:
    """aclose() cancelled half way, as asyncio.timeout() or wait_for() around it does."""

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(llm.aclose(), 0.05)
        with pytest.raises(HybridLLMError, match="closed"):  # closed for new answers all the same
            llm.stream("hi")

    asyncio.run(main())


def test_an_aclose_cut_half_way_is_finished_by_the_next_aclose():
    """Before: aclose() set 'closed' first, so after a cancelled one the next aclose() returned at
    once and the device model (and its thread) stayed loaded for ever, even past collection (the
    finalizer was detached first too)."""
    edge = _Edge()
    llm = AsyncHybridLLM(edge=edge, cloud=_SlowCloseCloud(model="c"), cache=False)
    _cut_aclose(llm)
    assert edge.closed == 0
    asyncio.run(llm.aclose())
    assert edge.closed == 1
    asyncio.run(llm.aclose())  # then idempotent
    assert edge.closed == 1


def test_a_client_whose_aclose_was_cut_is_closed_when_collected():
    edge = _Edge()
    llm = AsyncHybridLLM(edge=edge, cloud=_SlowCloseCloud(model="c"), cache=False)
    _cut_aclose(llm)
    with pytest.warns(ResourceWarning, match="without aclose"):
        del llm
        gc.collect()
    assert edge.closed == 1

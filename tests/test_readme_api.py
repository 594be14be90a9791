"""README's API section matches the code: every name it shows is importable and its code runs
(on a fake edge, with the cloud left out)."""

from __future__ import annotations

import re
from pathlib import Path

import hybridllm

README = Path(__file__).resolve().parents[1] / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## The Python API")
    return text[start : text.index("\n## ", start + 1)]


def test_every_name_the_api_section_shows_is_exported():
    section = _section()
    block = re.search(r"from hybridllm import \((.*?)\)", section, re.S)
    assert block is not None
    imported = {n.strip() for n in block.group(1).replace("\n", " ").split(",") if n.strip()}
    table = set(re.findall(r"^\| `(\w+)", section, re.M))
    table |= set(re.findall(r"^\| `\w+`(?:\([^)]*\))? / `(\w+)`", section, re.M))
    table |= set(re.findall(r"^\| `\w+`, `(\w+)`", section, re.M))
    errors = set(re.findall(r"`(\w+Error)`", section))
    for name in imported | table | errors:
        assert name in hybridllm.__all__, name
    assert {"HybridLLM", "AsyncHybridLLM", "Stream", "AsyncStream", "Decision"} <= table


def test_the_fields_and_methods_it_names_exist():
    section = _section()
    row = re.search(r"^\| `Completion` \| (.*) \|$", section, re.M).group(1)
    fields = re.findall(r"`(\w+)(?:\(\))?`", row)
    for name in fields:
        assert hasattr(hybridllm.Completion, name) or name in hybridllm.Completion.__dataclass_fields__, name
    for cls, names in (
        (hybridllm.HybridLLM, ("chat", "stream", "stats", "close", "__enter__")),
        (hybridllm.AsyncHybridLLM, ("chat", "stream", "stats", "aclose", "wrap")),
        (hybridllm.Stream, ("close", "__enter__", "__iter__")),
        (hybridllm.AsyncStream, ("aclose", "__aenter__", "__aiter__")),
    ):
        for name in names:
            assert hasattr(cls, name), (cls, name)


def test_the_example_runs():
    """The example, with a fake device model and no cloud (the cloud URL is the README's)."""
    import asyncio

    from hybridllm.backends.fake import FakeBackend

    code = re.search(r"```python\n(.*?)```", _section(), re.S).group(1)
    imports, body = code.split("\n\n", 1)
    namespace: dict = {"__name__": "readme"}
    exec(compile(imports, "README", "exec"), namespace)  # every name it imports exists

    def fake(cls):
        def make(**kw):
            kw.pop("cloud_url", None)
            return cls(edge=FakeBackend(reply=lambda m: "Paris is the capital."), cache=False, **kw)

        return make

    namespace["HybridLLM"] = fake(namespace["HybridLLM"])
    namespace["AsyncHybridLLM"] = fake(namespace["AsyncHybridLLM"])
    exec(compile(body, "README", "exec"), namespace)
    asyncio.run(namespace["main"]())

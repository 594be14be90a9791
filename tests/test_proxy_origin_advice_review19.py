"""The 403 for a web page's request names an `--allow-origin` that `hybridllm serve` accepts.

Before: a page opened from a file or in a sandboxed frame sends ``Origin: null``; the 403 said "start
`hybridllm serve` with --allow-origin null", which the parser refuses ("expected an origin such as
https://app.example:3000"): the advice could not be followed. Now it names what lets such a page in
(``--allow-origin '*'``, or serving it from this machine), and following the advice gives a 200.
"""

from __future__ import annotations

import shlex

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM, cli  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

BODY = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def _post(allow_origins: list[str], origin: str):
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cache=False)
    try:
        with TestClient(create_app(llm, allow_origins=allow_origins)) as http:
            return http.post("/v1/chat/completions", json=BODY, headers={"origin": origin})
    finally:
        llm.close()


@pytest.mark.parametrize("origin", ["null", "https://evil.example", "chrome-extension://abcdef"])
def test_the_advice_in_the_403_parses_and_lets_the_page_in(origin):
    refused = _post([], origin)
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    words = message.split()
    advice = [words[i + 1].rstrip(".,") for i, w in enumerate(words[:-1]) if w == "--allow-origin"]
    assert advice, message
    for value in advice:
        value = shlex.split(value)[0]  # '*' is quoted for the shell
        args = cli.build_parser().parse_args(["serve", "--allow-origin", value])  # no usage error
        assert _post(args.allow_origin, origin).status_code == 200, (value, message)

"""The connection to the endpoints: their names, one httpx client per event loop, bounded reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

from .._masking import split_userinfo
from .._request_id import REQUEST_ID
from .cloud_status import _Retryable

MAX_ERROR_BYTES = 64 * 2**10  # an error's body: only its start is read, for the message


_SSL_CONTEXT: Any = None


def _ssl_context() -> Any:
    """One TLS context for every client of the process: httpx reads the CA store (certifi's, or
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) for each new client, 20-250 ms that the first cloud call
    on each event loop spent on the loop, holding up an async app's other requests."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        import httpx

        _SSL_CONTEXT = httpx.create_ssl_context()  # a race builds two; either is right
    return _SSL_CONTEXT


class _Clients:
    """The httpx clients of :class:`~hybridllm.backends.cloud.CloudBackend`, and their closing."""

    _api_key: str | None
    _transport: Any
    _clients: dict[asyncio.AbstractEventLoop, Any]
    connect_timeout_s: float
    read_timeout_s: float

    def _client(self) -> Any:
        """The AsyncClient of the running loop (a client's connections belong to one loop)."""
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # redirects are not followed: a POST would be re-sent (the prompt, the key) to wherever a
            # captive portal or a proxy points; the status says where, and base_url is fixed once
            tls = {} if self._transport is not None else {"verify": _ssl_context()}
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.read_timeout_s, connect=self.connect_timeout_s),
                headers=headers, transport=self._transport, follow_redirects=False, **tls)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        self.close()

    def close(self) -> None:
        """Close every loop's client (a loop that is still running closes its own)."""
        clients, self._clients = self._clients, {}
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if loop is current:
                loop.create_task(client.aclose())
                continue
            if loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            else:
                loop.run_until_complete(client.aclose())


async def _read_capped(resp: Any, limit: int) -> tuple[Any, bool]:
    """The answer with at most ``limit`` bytes of its body read (and whether it had more), as a
    response whose ``json()`` and ``text`` work; the streamed one is closed. Its content arrives
    decoded, so the copy leaves out the headers that describe the bytes on the wire."""
    import httpx

    data = bytearray()
    async with aclosing(resp.aiter_bytes()) as chunks:
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                break
    await resp.aclose()  # read whole: its connection goes back to the pool; cut off: it is closed
    headers = [(k, v) for k, v in resp.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(resp.status_code, headers=headers, content=bytes(data[:limit]),
                          request=resp.request), len(data) > limit



@asynccontextmanager
async def _trickle_bound(limit: float, what: str) -> AsyncIterator[None]:
    """A bound on a whole step (a head, a model list): httpx's read timeout bounds each read, so a
    server that trickles its bytes one at a time would be waited on for ever. Past ``limit`` the
    step fails as "<what> within <limit> s (its bytes trickled in)", to be retried."""
    try:
        async with asyncio.timeout(limit):
            yield
    except TimeoutError:
        raise _Retryable(f"{what} within {limit:g} s (its bytes trickled in)") from None


def _traced() -> dict[str, str] | None:
    """X-Request-Id of the HTTP request being served (``hybridllm serve``): a question sent to the
    cloud carries it, so one id traces it through both servers."""
    rid = REQUEST_ID.get()
    return None if rid is None else {"X-Request-Id": rid}


def _api_root(url: str) -> str:
    """The endpoint's name: its API root (``.../v1``), without a ``user:password@`` or a query
    string (its parameters go with each request, ``_query_of``: an ``?api-version=`` or a ``?key=``
    was left in the path, ``.../v1?key=S/v1/chat/completions``, and every request failed)."""
    url = split_userinfo(url)[0].split("#", 1)[0].split("?", 1)[0].rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _query_of(url: str) -> list[tuple[str, str]]:
    """The parameters of ``url``'s query string, sent with each request to that endpoint."""
    from urllib.parse import parse_qsl, urlsplit

    return parse_qsl(urlsplit(url).query, keep_blank_values=True)

"""The server's log at ``--log-level info`` has no line per HTTP request that it sends itself.

httpx logs each request at INFO; the cluster launch polls the app's ``/health`` with it, so a
``serve --replicas N`` printed ``INFO httpx: HTTP Request: GET http://.../health "HTTP/1.1 200
OK"`` among its own lines. Those lines are for ``--log-level debug``. Each case runs in a process
of its own: logging's configuration is the process's.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = """
import http.server, logging, sys, threading
import httpx
from cloud_server.__main__ import _configure_logging

class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
threading.Thread(target=server.serve_forever, daemon=True).start()
_configure_logging(sys.argv[1])
httpx.get(f"http://127.0.0.1:{server.server_address[1]}/health", trust_env=False)
logging.getLogger("cloud_server.cluster").info("listening")
logging.getLogger("httpx").warning("a warning of httpx's own")
"""


@pytest.mark.parametrize(("level", "request_logged"), [("info", False), ("debug", True)])
def test_httpx_request_lines_only_at_debug(level, request_logged):
    out = subprocess.run([sys.executable, "-c", _SCRIPT, level], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert ("HTTP Request: GET" in out.stderr) is request_logged, out.stderr
    assert "INFO cloud_server.cluster: listening" in out.stderr  # the server's own lines stay
    assert "WARNING httpx: a warning of httpx's own" in out.stderr  # and httpx's warnings

"""``hybridllm-cloud serve --replicas`` in its own process, as an operator runs it.

On a local Ray instance: a replica that cannot start says why in one line (not only "failed to
update the deployments"), and SIGTERM stops a running fleet with exit code 0 once the answer it
was streaming has ended whole. On an existing cluster (``ray start --head`` with token
authentication): without the token the CLI stops with one line saying what to set; with it, the
official ``openai`` client is answered, a second serve on the same cluster is refused without
touching the first one's app, and after SIGTERM the app and its fleet board are gone while the
cluster keeps running.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="needs the [cluster] extra (ray[serve])")
openai = pytest.importorskip("openai")

from cloud_server.cluster.launch import free_port  # noqa: E402 - after the skips

pytestmark = pytest.mark.real

BIN = Path(sys.executable).parent


class _Watcher:
    """A driver process on the cluster that reports, on each ask, the Serve applications there and
    our named actors (the fleet board). One ``ray.init`` for the test's three looks (a fresh
    driver each time took seconds to start), made while the app starts; each answer is read from
    the cluster as it is at that ask."""

    CODE = (
        "import ray, json, sys\n"
        "from ray import serve\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "for _ in sys.stdin:\n"
        "    ours = [a['name'] for a in ray.util.list_named_actors(all_namespaces=True)\n"
        "            if a['namespace'] == 'hybridllm']\n"
        "    print('APPS ' + json.dumps(sorted(serve.status().applications) + sorted(ours)), flush=True)\n"
    )

    def __init__(self, address: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", self.CODE, address], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the driver ended

    def apps(self, timeout_s: float = 120) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while (line := self.lines.get(timeout=max(0.1, deadline - time.monotonic()))) is not None:
            if line.startswith("APPS "):  # Ray's own lines may come first
                return json.loads(line[len("APPS "):])
        raise AssertionError(self.log.read_text()[-2000:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def _serve_command(model, port: int, *extra: str) -> list[str]:
    return [
        str(BIN / "hybridllm-cloud"), "serve", "--model", str(model), "--replicas", "1",
        "--host", "127.0.0.1", "--port", str(port), "--num-threads", "1", "--served-model-name",
        "smollm2", *extra,
    ]


def _wait_ok(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"not healthy in {timeout_s:.0f} s:\n" + log.read_text()[-3000:])


def test_local_fleet_says_why_a_replica_cannot_start_and_stops_on_sigterm(smollm2_path, tmp_path):
    port = free_port()
    # a 1 MiB KV pool holds less than one sequence: the engine refuses it in every replica. Serve
    # tries a failing replica 3 times by default, each failing alike (4 s apiece here): once is
    # enough to read why, and the error line is the same
    bad = subprocess.run(
        _serve_command(smollm2_path, port, "--kv-cache-memory-mb", "1"),
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1"},
    )
    assert bad.returncode == 1, bad.stderr[-3000:]
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("hybridllm-cloud: error: the engine replicas could not start: ConfigError:"), last
    assert "--kv-cache-memory-mb" in last and "Traceback" not in bad.stderr, bad.stderr[-3000:]

    log_path = tmp_path / "local.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            _serve_command(smollm2_path, port, "--max-model-len", "1024", "--kv-cache-memory-mb", "48"),
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ok(url, server, log_path)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
            r = client.completions.create(model="smollm2", prompt="Hello", max_tokens=4)
            assert r.usage.completion_tokens > 0
            # SIGTERM with an answer streaming: Serve drains the app, the answer ends whole. The
            # proxy may serve before serve.run has returned; SIGTERM before that stops at once
            deadline = time.monotonic() + 60
            while "listening on" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            stream = client.completions.create(
                model="smollm2", prompt="Once upon a time", max_tokens=48, stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = iter(stream)
            texts, finish = [next(chunks).choices[0].text], None
            server.send_signal(signal.SIGTERM)
            for chunk in chunks:
                texts.append(chunk.choices[0].text if chunk.choices else "")
                finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
            assert finish == "length" and len(texts) >= 40, (finish, len(texts))
            assert server.wait(timeout=90) == 0, log_path.read_text()[-3000:]
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=30)
    text = log_path.read_text()
    assert "Traceback" not in text
    # review26: neither the launch's own health polls nor Serve's "will not be applied" about the
    # options this command itself started Serve with
    assert "HTTP Request: GET" not in text and "will not be applied" not in text, text[-3000:]
    assert "stopping: deleting the app, its answers in flight get up to 120 s to finish, then the " \
           "local Ray instance stops" in text, text[-3000:]
    assert "graceful_shutdown failed" not in text, text[-3000:]  # Ray's noise from serve.shutdown()
    with pytest.raises(httpx.HTTPError):  # Serve's proxy went with the local Ray
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_cli_joins_an_existing_cluster_and_leaves_it_running(smollm2_path, tmp_path):
    ray_bin = shutil.which("ray", path=str(BIN)) or shutil.which("ray")
    assert ray_bin, "the ray CLI comes with ray[serve]"
    gcs_port, http_port = free_port(), free_port()
    address = f"127.0.0.1:{gcs_port}"
    plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    plain["RAY_USAGE_STATS_ENABLED"] = "0"
    env = {**plain, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    head = subprocess.run(
        [ray_bin, "start", "--head", f"--port={gcs_port}", "--num-cpus=3", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
    server = watcher = None
    command = _serve_command(
        smollm2_path, http_port, "--ray-address", address, "--max-model-len", "1024",
        "--kv-cache-memory-mb", "48",
    )
    try:
        watcher = _Watcher(address, env, tmp_path / "watcher.log")  # its start-up overlaps the app's
        refused = subprocess.run(command, capture_output=True, text=True, timeout=180, env=plain)
        assert refused.returncode == 1, refused.stderr[-3000:]
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("hybridllm-cloud: error:") and "RAY_AUTH_MODE=token" in last, last
        assert "Traceback" not in refused.stderr
        # refused on the GCS's first answer, not after ray.init's 20 s of retrying it
        assert "Failed to get cluster ID" not in refused.stderr, refused.stderr[-3000:]

        log = (tmp_path / "serve.log").open("w")
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{http_port}"
        _wait_ok(url, server, tmp_path / "serve.log")

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
        )
        assert r.choices[0].message.content and r.usage.completion_tokens > 0
        apps = watcher.apps()
        assert apps[0] == "hybridllm" and [a.split("-")[:2] for a in apps[1:]] == [["hybridllm", "fleet"]]

        # a second serve on the same cluster is refused in one line and leaves the first one's
        # app alone (it used to replace it, and its own exit deleted it)
        second = subprocess.run(
            _serve_command(smollm2_path, free_port(), "--ray-address", address, "--max-model-len", "1024",
                           "--kv-cache-memory-mb", "48"),
            capture_output=True, text=True, timeout=180, env=env,
        )
        assert second.returncode == 1, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        assert "already runs on the Ray cluster" in last and "--replace" in last, last
        assert "Traceback" not in second.stderr
        r = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert r.usage.completion_tokens > 0
        assert watcher.apps() == apps

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=90) == 0, (tmp_path / "serve.log").read_text()[-3000:]
        text = (tmp_path / "serve.log").read_text()
        assert "Traceback" not in text, text[-3000:]
        assert "HTTP Request: GET" not in text and "will not be applied" not in text, text[-3000:]
        assert "in flight get up to 120 s to finish; the Ray cluster keeps running" in text, text[-3000:]
        # the app and its fleet board (a detached actor) are deleted, the cluster still answers
        assert watcher.apps() == []
    finally:
        if watcher is not None:
            watcher.close()
        if server is not None:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=30)
            log.close()
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(temp_dir, ignore_errors=True)

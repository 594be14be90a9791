"""The Dockerfile cannot be built here; check what it promises and that its command parses.

``test_real_server.py`` runs the same ENTRYPOINT + CMD for real (with the model path, host and
port overridden after them).
"""

from __future__ import annotations

import json
import re

from cloud_server.__main__ import build_parser

from .helpers import ROOT

DOCKERFILE = (ROOT / "cloud_server" / "Dockerfile").read_text()


def instruction(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.*)$", DOCKERFILE, re.M)


def test_cuda_base_image() -> None:
    (base,) = instruction("FROM")
    assert base.startswith("nvidia/cuda:")


def test_runs_as_a_non_root_user() -> None:
    users = instruction("USER")
    assert users and users[-1] not in ("root", "0")


def test_healthcheck_probes_health() -> None:
    text = DOCKERFILE[DOCKERFILE.index("HEALTHCHECK") :]
    assert "/health" in text.split("\n\n")[0]


def test_model_comes_from_a_volume_and_the_command_parses() -> None:
    assert '"/models"' in instruction("VOLUME")[0]
    entry = json.loads(instruction("ENTRYPOINT")[0])
    cmd = json.loads(instruction("CMD")[-1])
    assert entry[:2] == ["hybridllm-cloud", "serve"]
    args = build_parser().parse_args(entry[1:] + cmd)
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert args.model.startswith("/models/")

"""``hybridllm-cloud``'s command line: the serve command's options and its usage errors."""

from __future__ import annotations

import argparse
from typing import NoReturn

from cloud_server.exceptions import ServerError
from hybridllm._cli_options import (
    WholeNameParser,
    bind_host,
    given,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from hybridllm._serve_cli import web_origin
from hybridllm.wire.body import DEFAULT_MAX_BODY_BYTES

PROG = "hybridllm-cloud"
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


class UsageError(ServerError):
    """A bad option value or combination found after parsing: exit status 2, as argparse's own."""


def _system_prompt(text: str) -> str:
    """``--system-prompt``: '' means none; one of spaces only was sent as a system message."""
    if text and not text.strip():
        raise argparse.ArgumentTypeError(f"the system prompt is blank ({text!r}); give '' for none")
    return text


class _Parser(WholeNameParser):
    """Whole option names only (``--mod`` is not ``--model``); usage errors as one line
    (``hybridllm-cloud: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="hybridllm cloud server")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI-compatible HTTP API",
        description="Serve a model over the OpenAI-compatible HTTP API. API keys also come from "
        "the HYBRIDLLM_CLOUD_API_KEYS environment variable (comma-separated).",
    )
    serve.add_argument("--model", required=True, type=given("a catalog id, .gguf file or HF folder"),
                       help="catalog id, .gguf file or HF folder")
    serve.add_argument(
        "--served-model-name", type=given("a model name without spaces around it", trimmed=True),
        help="model name in the API (default: the catalog id, or the .gguf file's or folder's name)",
    )
    serve.add_argument(
        "--system-prompt", default=None, metavar="TEXT", type=_system_prompt,
        help="system message for chat requests without one (default: the catalog model's own, as "
        "the device uses it; '' for none)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", type=bind_host, help="address to bind (default 127.0.0.1)"
    )
    serve.add_argument("--port", type=port, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--api-key", action="append", default=[], metavar="KEY", help="accepted key (repeatable)"
    )
    serve.add_argument(
        "--api-key-file", metavar="PATH", type=given("a file's path"),
        help="file with one accepted key a line (preferred over --api-key, which shows in ps)",
    )
    serve.add_argument(
        "--allow-origin", action="append", default=[], type=web_origin, metavar="ORIGIN",
        help="a web page origin (https://app.example:3000, or '*') allowed to call this server from "
        "a browser, with CORS (repeatable; default: none, the API key is still checked)",
    )
    serve.add_argument(
        "--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
        help=f"largest request body accepted; beyond it 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    serve.add_argument(
        "--shutdown-timeout", type=non_negative_float, default=None, metavar="S",
        help=f"on SIGTERM or Ctrl-C, refuse new requests (503) and give those in flight S seconds "
        f"to finish before ending them (default {DEFAULT_SHUTDOWN_TIMEOUT_S:g}; 0: end them at once)",
    )
    engine = serve.add_argument_group("engine")
    engine.add_argument(
        "--max-num-seqs", type=positive_int, default=16,
        help="most sequences in one engine step (default 16)",
    )
    engine.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=512,
        help="most tokens in one engine step, decode and prefill chunks together (default 512)",
    )
    engine.add_argument(
        "--max-waiting", type=positive_int, default=256,
        help="requests that may wait beyond the free batch slots; beyond that 429 (default 256)",
    )
    engine.add_argument(
        "--max-model-len", type=positive_int, default=None,
        help="longest sequence, prompt and answer (default: the model's own, at most 4096 on CPU "
        "and 32768 on CUDA)",
    )
    engine.add_argument(
        "--block-size", type=positive_int, default=16,
        help="tokens per KV cache block, a power of two (default 16)",
    )
    engine.add_argument(
        "--kv-cache-memory-mb", type=positive_int, default=None,
        help="KV pool budget in MiB (default: 1024 on CPU, half the free memory on CUDA); a "
        "--draft-model adds its own pool beyond it, as many blocks at its own size a token",
    )
    engine.add_argument(
        "--no-prefix-caching", action="store_true",
        help="do not reuse the KV blocks of earlier prompts' shared prefixes",
    )
    engine.add_argument(
        "--device", default=None, help="cpu or cuda[:N] (default: cuda where available, else cpu)"
    )
    engine.add_argument(
        "--dtype", default=None,
        help="float32, bfloat16 or float16 (default: bfloat16; float32 on CPU with --quantization none)",
    )
    engine.add_argument(
        "--quantization", default=None, choices=["none", "int8", "int4"],
        help="weights: int8 (weight-only, groups of 32: a GGUF's own blocks), int4 (a GGUF's own "
        "4-bit groups, int8 for its other tensors) or none (default: int4 on CPU, none on CUDA)",
    )
    engine.add_argument(
        "--enforce-eager", action="store_true",
        help="CUDA: run every step eagerly (default: decode steps replay CUDA graphs, captured "
        "on first use of each batch and context size)",
    )
    engine.add_argument("--seed", type=int, default=0, help="seed of the engine's sampler (default 0)")
    engine.add_argument(
        "--num-threads", type=positive_int, default=None,
        help="torch CPU threads (default: all cores this process may use; 1 a replica with --replicas)",
    )
    engine.add_argument(
        "--power-watts", type=positive_float, default=None, metavar="W",
        help="watts: estimate the per-request energy at W, even where a counter is readable (default: "
        "measured with NVML on a GPU or RAPL where readable, else estimated at 10 W per CPU thread / "
        "300 W per GPU)",
    )
    cluster = serve.add_argument_group(
        "cluster (Ray Serve; needs pip install 'hybridllm[cluster]')"
    )
    cluster.add_argument(
        "--replicas", type=positive_int, default=None, metavar="N",
        help="run N engine replicas as a Ray Serve deployment behind this API, routed by "
        "outstanding tokens and cached prefixes (without it Ray is not used)",
    )
    cluster.add_argument(
        "--ray-address", default=None, metavar="ADDR",
        help="join this Ray cluster (auto, ray://host:10001); default: the one RAY_ADDRESS names, "
        "as Ray's own, else start a local one",
    )
    cluster.add_argument(
        "--replace", action="store_true",
        help="with --ray-address: deploy over a hybridllm app already on that cluster (one left "
        "behind by a serve that was killed); without it such an app is refused, not replaced",
    )
    cluster.add_argument(
        "--min-replicas", type=non_negative_int, default=None, metavar="A",
        help="autoscale between A and --max-replicas replicas on queued tokens",
    )
    cluster.add_argument(
        "--max-replicas", type=positive_int, default=None, metavar="B",
        help="upper bound of the autoscaled replica count",
    )
    cluster.add_argument(
        "--target-tokens-per-replica", type=positive_int, default=None, metavar="T",
        help="autoscaling: want ceil(queued tokens of the fleet / T) replicas (default 4096)",
    )
    cluster.add_argument(
        "--autoscale-window-s", type=positive_float, default=None, metavar="S",
        help="autoscaling: average the queued tokens over the last S seconds, more than 10 "
        "(replicas push their figures every 10 s; default 30)",
    )
    cluster.add_argument(
        "--upscale-delay-s", type=non_negative_float, default=None, metavar="S",
        help="autoscaling: add replicas once more have been wanted for S seconds (default 30)",
    )
    cluster.add_argument(
        "--downscale-delay-s", type=non_negative_float, default=None, metavar="S",
        help="autoscaling: remove replicas once fewer have been wanted for S seconds (default 600)",
    )
    cluster.add_argument(
        "--graceful-shutdown-s", type=non_negative_float, default=None, metavar="S",
        help="a replica being removed (scaled down, or at exit) finishes its answers in flight "
        "within S seconds, then is killed and they fail (default 120)",
    )
    spec = serve.add_argument_group("speculative decoding (off by default)")
    spec.add_argument(
        "--speculative-method", default=None, choices=["ngram", "draft"],
        help="ngram: prompt lookup (drafts copied from the prompt and output); draft: a smaller "
        "model with the same tokenizer (--draft-model)",
    )
    spec.add_argument(
        "--num-speculative-tokens", type=positive_int, default=None, metavar="K",
        help="most tokens proposed per sequence and step, 1-16 (default 8 for ngram, 3 for draft; "
        "fewer under load)",
    )
    spec.add_argument(
        "--draft-model", default=None, metavar="ID_OR_PATH",
        type=given("a catalog id, .gguf file or HF folder"),
        help="draft model for --speculative-method draft: catalog id, .gguf file or HF folder",
    )
    spec.add_argument(
        "--draft-vocab-size", type=non_negative_int, default=None, metavar="N",
        help="the draft proposes only token ids below N, a smaller output head to compute "
        "(lossless: the target checks every token; default 32768 for larger vocabularies, 0: all)",
    )
    serve.add_argument(
        "--access-log", action="store_true",
        help="log one line per request at --log-level info, ending with [request_id=ID] as the "
        "error lines do (default: off; the single-process server only)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default info)",
    )
    return parser

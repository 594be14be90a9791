"""Settings of the serving engine, validated when they are made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cluster.fleet import finite_number  # (no Ray: the package imports nothing)
from .exceptions import ConfigError

_DEVICES = ("cpu", "cuda")
_DTYPES = ("float32", "bfloat16", "float16")
_QUANTIZATIONS = ("none", "int8", "int4")
_SPEC_METHODS = ("ngram", "draft")
_NO_VALUE = object()
# Ray Serve's metrics_interval_s (ray.serve.config.DEFAULT_METRICS_INTERVAL_S, which we leave as it
# is): each replica pushes its autoscaling figures to the controller this often, and Serve warns of
# a look_back_period_s not above it (a FutureWarning: "will raise an exception in a future release")
SERVE_METRICS_INTERVAL_S = 10.0


class SettingError(ConfigError):
    """A bad ``EngineConfig`` setting, said in a structured way: ``fields`` are the settings at
    fault (the first is the one to change), ``rule`` what is wrong, with ``{0}``, ``{1}`` ... where
    their names go, and ``got`` the value given. ``naming`` words it with each field's name in a
    caller's terms (the command line's options); ``str()`` says ``EngineConfig.field``."""

    def __init__(self, rule: str, *fields: str, got: Any = _NO_VALUE) -> None:
        self.rule, self.fields, self.got = rule, fields, got
        super().__init__(self.naming(lambda field: f"EngineConfig.{field}"))

    def naming(self, name: Callable[[str], str]) -> str:
        text = self.rule
        for i, field in enumerate(self.fields):  # placeholders only: a value's braces stay as they are
            text = text.replace(f"{{{i}}}", name(field))
        return text if self.got is _NO_VALUE else f"{text}, got {self.got!r}"


@dataclass
class EngineConfig:
    """What the engine loads and how it batches.

    ``model`` is a catalog id (``smollm2-135m-instruct``), a ``.gguf`` path or a Hugging Face
    folder (``config.json``, ``*.safetensors``, ``tokenizer.json``). ``None`` means "choose at
    load time": the KV budget from the device, ``max_model_len`` from the model (capped on CPU),
    the device (CUDA when present), the dtype and the quantization: on CPU ``"int4"`` with bf16
    activations (the fastest there; logits within cosine 0.99 of fp32), on CUDA bf16.
    ``quantization="int4"`` keeps a GGUF's 4-bit matrices (Q4_0, Q4_1, Q4_K) as their own groups
    of 32 and makes the other matrices int8 groups (CPU; widened to the activation dtype elsewhere);
    ``"int8"`` makes every matrix weight-only int8 in groups of 32 (an fp16 scale and zero each; a
    GGUF's blocks of 32 are taken as they are).

    Speculative decoding (off by default): ``speculative_method`` ``ngram`` (prompt lookup) or
    ``draft`` (``draft_model``, a smaller model with the same tokenizer), proposing up to
    ``num_speculative_tokens`` tokens per step (``None``: 8 for ``ngram``, 3 for ``draft``);
    ``spec_max_rows`` bounds the draft rows of one step
    (the adaptive rule in ``engine/spec_decode/decoder.py``). ``draft_vocab_size`` N: the draft
    model proposes only token ids below N (its output head cut to those rows; lossless, the target
    verifies every token); ``None`` means 32768 for a larger vocabulary, 0 the whole vocabulary.

    On CUDA, decode steps replay CUDA graphs captured on first use per shape bucket
    (``engine/cuda_graph.py``); ``enforce_eager=True`` runs every step eagerly instead.
    """

    model: str
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    device: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    seed: int = 0
    max_waiting: int = 256
    enable_prefix_caching: bool = True
    num_threads: int | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    draft_model: str | None = None
    draft_vocab_size: int | None = None
    spec_max_rows: int = 16
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise SettingError("{0} must be a catalog id, a .gguf path or a folder", "model")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_waiting"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SettingError("{0} must be a positive integer", name, got=value)
        if self.block_size & (self.block_size - 1):
            raise SettingError("{0} must be a power of two", "block_size", got=self.block_size)
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1 << 20:
            raise SettingError("{0} must be at least 1 MiB", "kv_cache_memory_bytes")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise SettingError("{0} must be at least 2", "max_model_len")
        if self.max_num_batched_tokens < self.max_num_seqs:  # every running seq decodes each step
            raise SettingError("{0} must be >= {1}", "max_num_batched_tokens", "max_num_seqs")
        kind, colon, index = (self.device or "").partition(":")
        if self.device is not None and (kind not in _DEVICES or (colon and not index.isdigit())):
            raise SettingError(f"{{0}} must be one of {_DEVICES}, optionally with an index (cuda:1)",
                               "device", got=self.device)
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise SettingError(f"{{0}} must be one of {_DTYPES}", "dtype", got=self.dtype)
        if self.quantization is not None and self.quantization not in _QUANTIZATIONS:
            raise SettingError(f"{{0}} must be one of {_QUANTIZATIONS}", "quantization",
                               got=self.quantization)
        if self.speculative_method is not None and self.speculative_method not in _SPEC_METHODS:
            raise SettingError(f"{{0}} must be one of {_SPEC_METHODS}", "speculative_method",
                               got=self.speculative_method)
        k = self.num_speculative_tokens
        if k is not None and (not isinstance(k, int) or not 1 <= k <= 16):
            raise SettingError("{0} must be an integer in [1, 16]", "num_speculative_tokens")
        if (self.speculative_method == "draft") != (self.draft_model is not None):
            raise SettingError("{0} goes with {1} draft, and only with it", "draft_model",
                               "speculative_method")
        if self.draft_vocab_size is not None and (
            not isinstance(self.draft_vocab_size, int) or self.draft_vocab_size < 0
        ):
            raise SettingError("{0} must be an integer >= 0 (0: all tokens)", "draft_vocab_size")
        if self.draft_vocab_size is not None and self.draft_model is None:  # else silently unused
            raise SettingError("{0} goes with {1}", "draft_vocab_size", "draft_model")
        if not isinstance(self.spec_max_rows, int) or self.spec_max_rows < 2:
            raise SettingError("{0} must be an integer >= 2", "spec_max_rows")
        if self.num_threads is not None and self.num_threads < 1:
            raise SettingError("{0} must be a positive integer", "num_threads")
        # a torch generator takes [-2**63, 2**64); the draft model's sampler takes seed + 1. Out of
        # that range the load went through and every sampled request failed
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (
            -(2**63) <= self.seed < 2**64 - 1
        ):
            raise SettingError("{0} must be an integer in [-2**63, 2**64 - 1)", "seed", got=self.seed)


@dataclass
class ClusterConfig:
    """Engine replicas on Ray Serve (``--replicas``; see ``cloud_server.cluster``).

    ``replicas`` engine replicas, or with ``min_replicas``/``max_replicas`` an autoscaled count
    starting at ``replicas`` and driven by queued tokens (``target_tokens_per_replica`` each).
    ``ray_address`` joins an existing cluster (``auto``, ``ray://host:10001``); ``None`` starts a
    local one. Each replica holds ``replica_cpus`` CPUs (its torch threads, unless given) and takes
    up to ``max_ongoing_requests`` requests (the engine queues and batches them). The router sends
    a request to the replica with the longest cached prefix of its prompt unless that replica's
    outstanding tokens exceed the least loaded one's by more than
    ``max(min_margin_tokens, imbalance_ratio * least)``; replicas report every ``stats_period_s``.
    Autoscaling averages the queued tokens over ``autoscale_window_s`` (Serve's
    ``look_back_period_s``) and acts on a wanted count only after it has held for
    ``upscale_delay_s`` (more replicas) or ``downscale_delay_s`` (fewer); the defaults are Serve's.
    A replica being removed (scaled down, or the app deleted at exit) gets ``graceful_shutdown_s``
    to finish its answers in flight, then is killed and they fail.
    """

    replicas: int = 1
    ray_address: str | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    replica_cpus: float = 1.0
    max_ongoing_requests: int = 64
    stats_period_s: float = 0.5
    imbalance_ratio: float = 0.25
    min_margin_tokens: int = 128
    target_tokens_per_replica: int = 4096
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    autoscale_window_s: float = 30.0
    # Serve's default of 20 s cut answers off on CPU replicas: a long answer there takes minutes
    # (a 2-core machine's SmolLM2 replica with 4 answers of 160 tokens at once: over 20 s)
    graceful_shutdown_s: float = 120.0
    replace_app: bool = False  # --replace: deploy over an app of ours already on a joined cluster

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    def __post_init__(self) -> None:
        # each message names the option at fault (the command line's, where it has one), the value
        # given and what is allowed: `hybridllm-cloud serve` prints it as it is
        for name in ("replicas", "max_ongoing_requests", "target_tokens_per_replica"):
            _check_int(name, getattr(self, name), 1)
        if self.autoscaling:
            for name, low in (("min_replicas", 0), ("max_replicas", 1)):
                if getattr(self, name) is not None:
                    _check_int(name, getattr(self, name), low)
            given_max = self.max_replicas is not None
            if self.min_replicas is None:
                self.min_replicas = min(1, self.replicas)
            if self.max_replicas is None:
                self.max_replicas = max(self.replicas, self.min_replicas)
            if self.min_replicas > self.max_replicas:
                raise ConfigError(
                    f"--min-replicas {self.min_replicas} is above --max-replicas {self.max_replicas}: "
                    f"--min-replicas must be from 0 to {self.max_replicas}"
                )
            if not self.min_replicas <= self.replicas <= self.max_replicas:
                default = "" if given_max else " (its default: the larger of --replicas and --min-replicas)"
                # the count to start at is one at least, also where --min-replicas 0 lets it shrink to 0
                raise ConfigError(
                    f"--replicas {self.replicas} must lie within --min-replicas {self.min_replicas} "
                    f"and --max-replicas {self.max_replicas}{default}: give --replicas from "
                    f"{max(1, self.min_replicas)} to {self.max_replicas}"
                )
        for name in ("upscale_delay_s", "downscale_delay_s", "autoscale_window_s", "graceful_shutdown_s"):
            value = getattr(self, name)
            if not finite_number(value) or value < 0 or (name == "autoscale_window_s" and value == 0):
                kind = "> 0" if name == "autoscale_window_s" else ">= 0"
                raise ConfigError(f"{_cluster_option(name)} must be a finite number of seconds {kind}, "
                                  f"got {value!r}")
        if self.autoscale_window_s <= SERVE_METRICS_INTERVAL_S:
            # each push carries the replica's samples of the last window only: a window not longer
            # than the push interval leaves the policy part of one push, up to 10 s old. Serve warns
            # of it only once Ray has started, and means to refuse it
            raise ConfigError(
                f"--autoscale-window-s must be more than {SERVE_METRICS_INTERVAL_S:g} seconds, Ray "
                f"Serve's metrics push interval (replicas report their queued tokens that often, and "
                f"Serve warns it will refuse a window not above it), got {self.autoscale_window_s!r}"
            )
        for name in ("replica_cpus", "stats_period_s", "imbalance_ratio", "min_margin_tokens"):
            value = getattr(self, name)
            positive = name in ("replica_cpus", "stats_period_s")
            if not finite_number(value) or value < 0 or (positive and value == 0):
                raise ConfigError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, "
                                  f"got {value!r}")


# ClusterConfig fields that `hybridllm-cloud serve` sets from an option of the same name
_CLUSTER_OPTIONS = frozenset({
    "replicas", "min_replicas", "max_replicas", "target_tokens_per_replica", "upscale_delay_s",
    "downscale_delay_s", "autoscale_window_s", "graceful_shutdown_s",
})


def _cluster_option(name: str) -> str:
    return "--" + name.replace("_", "-") if name in _CLUSTER_OPTIONS else name


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{_cluster_option(name)} must be an integer >= {low}, got {value!r}")

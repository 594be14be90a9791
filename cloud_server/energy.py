"""Energy of the work the server does, always labelled with where the figure comes from.

Sources (``energy_sources.py``), the first that works wins (``detect_source``):

    nvml      NVIDIA GPU: the driver's total-energy counter (mJ since load, Volta and later), read
              through ``pynvml`` (``pip install nvidia-ml-py``), on the device the engine uses
              (CUDA_VISIBLE_DEVICES taken into account); a CUDA engine without it: the estimate
    rapl      CPU engine: the packages' counters under /sys/class/powercap (intel-rapl:N/energy_uj
              named package-N, summed; sub-domains not added; psys only alone), in microjoules,
              wrapping at max_energy_range_uj (also read in the background, so no wrap is
              missed); readable by root only on current kernels
    estimate  a configured power figure times elapsed time (``--power-watts``, else
              ``HYBRIDLLM_POWER_WATTS``, refused unless a positive number, else 10 W per CPU
              thread / 300 W per GPU): a rough figure

Per request: the energy the source reports between two events (a request starting or ending) is
shared equally among the requests active in that interval; idle energy goes to nobody. A request
is active from when the engine first schedules it (``begin(queued=True)``, then ``started``):
one still waiting in the queue uses none of it. Per token
is the request's joules over its output tokens. The figures reach ``/metrics``
(``hybridllm_energy_joules``, ``hybridllm_energy_per_output_token_joules``, labelled ``source``)
and each response's ``usage.energy`` (``joules``, ``joules_per_output_token``, ``source``).
A counter that fails, reads NaN or does not move while requests run gives way to the estimate
(``EnergyMeter``); ``EnergyMeter.close`` releases it (NVML's session).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hybridllm._cpus import usable_cpus

from .energy_sources import EnergySource, EstimateSource, NvmlSource, RaplSource, check_watts, nvml_index

log = logging.getLogger("cloud_server.energy")
CPU_WATTS_PER_THREAD = 10.0
GPU_WATTS = 300.0


def default_watts(device: str, num_threads: int | None) -> float:
    env = os.environ.get("HYBRIDLLM_POWER_WATTS")
    if env:
        # checked here, not where it is first used: with a working counter the figure is only the
        # fallback, and a bad one would fail every request once the counter fails
        return check_watts(env, "HYBRIDLLM_POWER_WATTS")
    if device.startswith("cuda"):
        return GPU_WATTS
    return CPU_WATTS_PER_THREAD * (num_threads or usable_cpus())  # the engine's own default


def detect_source(
    device: str = "cpu", *, power_watts: float | None = None, num_threads: int | None = None,
    nvml: Any = None,
) -> EnergySource:
    """NVML on CUDA, RAPL on a CPU where readable, else an estimate; a given power figure forces
    it. A GPU without NVML's energy counter gets the estimate, not RAPL: the CPU packages' energy
    leaves out the GPU that does the work. Why a counter is not used is logged here, once."""
    if power_watts is not None:
        return EstimateSource(power_watts)
    fallback = default_watts(device, num_threads)
    if device.startswith("cuda"):
        try:
            return NvmlSource(nvml_index(device), nvml)
        except Exception as exc:  # noqa: BLE001 - no pynvml, no counter: fall back, say so
            log.warning("NVML energy counter unavailable for %s (%s: %s); per-request energy is an "
                        "estimate at %g W (set --power-watts to the card's figure)",
                        device, type(exc).__name__, exc, fallback)
            return EstimateSource(fallback)
    try:
        return RaplSource()
    except OSError as exc:
        log.info("%s; per-request energy is an estimate at %g W", exc, fallback)
    return EstimateSource(fallback)


def meter_for(device: str, *, power_watts: float | None = None,
              num_threads: int | None = None) -> EnergyMeter:
    """The meter of an engine on ``device``: its source (``detect_source``) and, should a counter
    fail later, the same estimate ``detect_source`` falls back to."""
    if power_watts is not None:  # checked before anything is opened (0 is refused, not the default)
        power_watts = check_watts(power_watts, "power_watts")
    fallback = power_watts or default_watts(device, num_threads)
    return EnergyMeter(detect_source(device, power_watts=power_watts, num_threads=num_threads), fallback)


class EnergyMeter:
    """Shares a source's energy among the requests active while it is spent.

    A counter that stops reading while the server runs (a GPU lost to the driver, a permission
    changed) or reads NaN would fail every request from then on: the meter goes over to an
    estimate at ``fallback_watts`` instead (once, with a warning), and the energy reports say
    ``estimate``. So does a counter that does not move over ``source.frozen_after_s`` of work (a
    virtualised one that always reads the same): the requests running then get the estimate, not
    0 J labelled as measured."""

    def __init__(self, source: EnergySource, fallback_watts: float = CPU_WATTS_PER_THREAD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.fallback_watts = fallback_watts
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._active: dict[int, float] = {}
        self._queued: set[int] = set()  # begun, not scheduled yet: no share
        self._estimated: dict[int, float] = {}  # the same requests' shares at fallback_watts
        self._last = source.read_joules()
        self._at = clock()
        self._still_s = 0.0  # time with requests running since the counter last moved
        self.attributed_joules = 0.0

    @property
    def name(self) -> str:
        return self.source.name

    def close(self) -> None:
        """Release the source (NVML's session); the meter reads on as an estimate."""
        with self._lock:
            self._to_estimate()

    def _to_estimate(self) -> None:
        self.source.close()
        self.source = EstimateSource(self.fallback_watts, self._clock)
        self._last = self.source.read_joules()

    def _advance(self) -> None:
        # Rule: the energy read between two events (a request begins or ends) is split equally
        # among the requests active in that interval; with none active it goes to nobody. So the
        # requests' joules sum to at most what the source measured (attributed_joules), never N x.
        at = self._clock()
        dt, self._at = max(0.0, at - self._at), at
        if self._active:  # the estimate's shares, kept should the counter turn out frozen
            for key in self._active:
                self._estimated[key] += self.fallback_watts * dt / len(self._active)
        try:
            now = self.source.read_joules()
            if not math.isfinite(now):  # NaN would read as 0 J (max(0, NaN)) from then on
                raise ValueError(f"read {now!r} J")
        except Exception as exc:  # noqa: BLE001 - a broken counter must not fail the requests
            log.warning("the %s energy counter failed (%s: %s); per-request energy is an estimate "
                        "at %g W from now on", self.source.name, type(exc).__name__, exc,
                        self.fallback_watts)
            self._to_estimate()  # the interval the counter failed in: no one's
            return
        delta, self._last = max(0.0, now - self._last), now
        if delta or self.source.frozen_after_s is None:
            self._still_s = 0.0
        elif self._active:
            self._still_s += dt
            if self._still_s >= self.source.frozen_after_s:
                log.warning("the %s energy counter has not moved in %.3g s of work (a frozen or "
                            "virtualised counter); per-request energy is an estimate at %g W from "
                            "now on", self.source.name, self._still_s, self.fallback_watts)
                self._to_estimate()
                for key, joules in self._estimated.items():  # the running requests: all estimate
                    self.attributed_joules += joules - self._active[key]
                    self._active[key] = joules
                return
        if self._active and delta:
            share = delta / len(self._active)
            for key in self._active:
                self._active[key] += share
            self.attributed_joules += delta

    def begin(self, *, queued: bool = False) -> int:
        """A request's key: its share starts now, or at ``started`` when it is ``queued``."""
        with self._lock:
            key = next(self._ids)
            if queued:
                self._queued.add(key)
            else:
                self._start(key)
            return key

    def started(self, key: int) -> None:
        """The engine has scheduled the queued request ``key``: its share starts now (once)."""
        with self._lock:
            if key in self._queued:
                self._queued.discard(key)
                self._start(key)

    def _start(self, key: int) -> None:
        self._advance()  # what was spent before it ran is the others'
        self._active[key] = self._estimated[key] = 0.0

    def end(self, key: int) -> float:
        with self._lock:
            if key in self._queued:  # it never ran
                self._queued.discard(key)
                return 0.0
            self._advance()
            self._estimated.pop(key, None)
            return self._active.pop(key, 0.0)


def energy_report(joules: float, num_output_tokens: int, source: str) -> dict[str, Any]:
    """The ``usage.energy`` object of a response."""
    per_token = joules / num_output_tokens if num_output_tokens else None
    return {
        "joules": round(joules, 6),
        "source": source,
        "joules_per_output_token": round(per_token, 6) if per_token is not None else None,
    }


class EnergyAccounting:
    """Per-request energy for one app: measured here (``meter``) or handed over by a replica on
    the last output (``out.energy``, the cluster's front end); recorded in ``/metrics``."""

    _BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30)

    def __init__(self, meter: EnergyMeter | None, registry: Any, model: Callable[[], str]) -> None:
        from prometheus_client import Counter, Histogram

        self.meter = meter
        self._model = model
        self.joules = Counter(
            "hybridllm_energy_joules",
            "Energy attributed to finished requests, by source.",
            ["model", "source"],
            registry=registry,
        )
        self.per_token = Histogram(
            "hybridllm_energy_per_output_token_joules",
            "Energy per output token of finished requests, by source.",
            ["model", "source"],
            buckets=self._BUCKETS,
            registry=registry,
        )

    def start(self, *, queued: bool = False) -> int | None:
        """A request's key; ``queued``: its share starts at ``started`` (the engine scheduled it)."""
        return self.meter.begin(queued=queued) if self.meter is not None else None

    def started(self, key: int | None) -> None:
        if key is not None and self.meter is not None:
            self.meter.started(key)

    def close(self) -> None:
        """At the server's stop: release the meter's counter (NVML's session)."""
        if self.meter is not None:
            self.meter.close()

    def cancel(self, key: int | None) -> None:
        if key is not None and self.meter is not None:
            self.meter.end(key)

    def finish(self, key: int | None, out: Any) -> None:
        """Set ``out.energy`` (unless a replica did) and record it."""
        report = getattr(out, "energy", None)
        if report is None and key is not None and self.meter is not None:
            report = energy_report(self.meter.end(key), out.num_output_tokens, self.meter.name)
            out.energy = report
        elif key is not None:
            self.cancel(key)
        if not report:
            return
        model, source = self._model(), str(report.get("source") or "unknown")
        # a replica's figures are taken only when they are joules: a negative one made inc() raise
        # (the finished answer then failed) and a NaN or inf poisoned the counter for good
        joules = joules_of(report.get("joules") or 0.0)
        if joules is None:
            log.warning("energy report %r of a finished request not recorded: not a number of "
                        "joules", report)
            return
        self.joules.labels(model, source).inc(joules)
        per_token = joules_of(report.get("joules_per_output_token"))
        if per_token is not None:
            self.per_token.labels(model, source).observe(per_token)


def joules_of(value: Any) -> float | None:
    """A finite, non-negative figure of joules, or None (absent, NaN, inf, negative, not a number)."""
    try:
        joules = math.nan if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return joules if math.isfinite(joules) and joules >= 0 else None

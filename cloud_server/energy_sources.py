"""The energy sources the meter reads: NVML's and RAPL's counters and the configured estimate."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("cloud_server.energy")
POWERCAP = Path("/sys/class/powercap")
RAPL_POLL_S = 60.0  # background reads of the RAPL counters, so no wrap is missed
RAPL_MAX_WATTS = 1000.0  # more than any CPU package draws


class EnergySource:
    """A cumulative energy reading in joules (only differences matter)."""

    name = "estimate"
    # A counter that has not moved over this much time with requests running is taken as frozen
    # (a virtualised counter that always reads the same): the meter goes over to the estimate
    # rather than report 0 J as measured. None: never (an estimate always moves).
    frozen_after_s: float | None = None

    def read_joules(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        """Release what reading holds (NVML's session); again: nothing."""


def check_watts(value: Any, what: str) -> float:
    """The one rule for a power figure: a positive, finite number of watts (inf would make every
    delta inf - inf = NaN); a string of one is taken (the environment, Serve's CLI args)."""
    try:
        watts = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        watts = math.nan
    if not (watts > 0 and math.isfinite(watts)):
        raise ValueError(f"{what}={value!r} is not a positive number of watts")
    return watts


class EstimateSource(EnergySource):
    name = "estimate"

    def __init__(self, watts: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.watts = check_watts(watts, "power_watts")
        self._clock = clock

    def read_joules(self) -> float:
        return self.watts * self._clock()


class RaplSource(EnergySource):
    """Sum of the CPU packages' RAPL domains (intel-rapl:N named package-N), wrap-around handled.

    Sub-domains (intel-rapl:N:M: core, uncore, dram) are parts of their package and not added.
    ``psys`` (a top-level domain on many Intel laptops and desktops) is the whole platform, the
    packages included: it is used only where no package domain can be read."""

    name = "rapl"
    frozen_after_s = 1.0  # a package counter moves about every millisecond, idle or not

    def __init__(self, root: Path | None = None, poll_s: float | None = None) -> None:
        root = POWERCAP if root is None else root
        packages: list[tuple[Path, float]] = []
        platform: list[tuple[Path, float]] = []
        denied: list[str] = []
        for d in sorted(root.glob("intel-rapl:*")):
            if d.name.count(":") != 1:  # intel-rapl:0:0 is a sub-domain of package 0
                continue
            energy = d / "energy_uj"
            try:
                int(energy.read_text())
                wrap = float((d / "max_energy_range_uj").read_text())
            except PermissionError:
                denied.append(d.name)
                continue
            except (OSError, ValueError):
                continue
            try:
                kind = (d / "name").read_text().strip()
            except OSError:
                kind = "package"  # no name file: taken as a package
            (platform if kind == "psys" else packages).append((energy, wrap))
        self.domains = packages or platform
        if not self.domains:
            why = "no readable intel-rapl:N/energy_uj"
            if denied:  # root only since the 2020 PLATYPUS fix (CVE-2020-8694)
                why = f"permission denied on {', '.join(denied)} (readable by root only)"
            raise OSError(f"RAPL energy counters under {root} not usable: {why}")
        self._last = [int(p.read_text()) for p, _ in self.domains]
        self._total_uj = 0.0
        self._lock = threading.Lock()
        # A counter that wraps twice between two reads loses a whole range (262 kJ on current
        # CPUs: 20 min at 200 W, one long request on an otherwise quiet server), so it is also
        # read in the background, twice per wrap at RAPL_MAX_WATTS, at least every RAPL_POLL_S.
        if poll_s is None:
            wrap_s = min(w for _, w in self.domains) / 1e6 / RAPL_MAX_WATTS
            poll_s = min(RAPL_POLL_S, max(0.1, wrap_s / 2))  # 0.1 s: no busy loop on a bogus range
        threading.Thread(target=_poll, args=(weakref.ref(self), poll_s), name="rapl-poll",
                         daemon=True).start()

    def read_joules(self) -> float:
        with self._lock:
            for i, (path, wrap) in enumerate(self.domains):
                now = int(path.read_text())
                delta = now - self._last[i]
                self._total_uj += delta if delta >= 0 else delta + wrap
                self._last[i] = now
            return self._total_uj / 1e6


def _poll(ref: weakref.ref[RaplSource], every_s: float) -> None:
    """Reads the source every ``every_s`` until it is dropped (the meter's estimate took over)
    or fails (the meter's own read finds that out and says so)."""
    while True:
        time.sleep(every_s)
        source = ref()
        if source is None:
            return
        try:
            source.read_joules()
        except (OSError, ValueError):
            return
        del source  # not kept alive by the sleep


def nvml_index(device: str) -> int:
    """NVML's index of a CUDA device. NVML numbers every GPU of the machine, CUDA only the visible
    ones: with CUDA_VISIBLE_DEVICES=2,3, cuda:0 is NVML's 2 (torch maps indices and UUIDs)."""
    index = int(device.split(":")[1]) if ":" in device else 0
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return index
    from torch.cuda import _get_nvml_device_index  # what torch.cuda.power_draw uses

    return int(_get_nvml_device_index(index))


class NvmlSource(EnergySource):
    name = "nvml"
    frozen_after_s = 5.0  # the driver's counter moves at its power sampling rate (< 1 s)

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        nvml.nvmlInit()
        # every nvmlInit is paired with one nvmlShutdown: on close(), when the source is dropped
        # (the meter's estimate took over), at exit, or here when the GPU has no counter
        self._close = weakref.finalize(self, _nvml_shutdown, nvml)
        self._nvml = nvml
        self.index = index
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self.read_joules()  # raises where the counter is not supported (before Volta)
        except BaseException:
            self.close()
            raise

    def read_joules(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0

    def close(self) -> None:
        self._close()  # once: a finalizer runs at most once


def _nvml_shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - closing must not fail a stop or a fallback
        log.debug("nvmlShutdown failed (%s: %s)", type(exc).__name__, exc)

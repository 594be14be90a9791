"""Settings of a HybridLLM client, from three sources in order of precedence:

1. constructor arguments,
2. environment variables ``HYBRIDLLM_<FIELD>`` (for example ``HYBRIDLLM_CLOUD_URL``),
3. a TOML file: ``config=PATH``, else ``$HYBRIDLLM_CONFIG``, else
   ``<user config dir>/hybridllm/config.toml`` if it exists,
then the defaults below. Read when a client is built, never at import.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from ._config_file import _read_config_file, config_file_path
from ._exceptions import ConfigError, InvalidRequestError
from ._masking import public_text, public_value
from ._message_text import check_namespace
from ._types import GenerationParams
from .backends.circuit import check_setting, check_url

SECRET_FIELDS = {"cloud_api_key"}
DEFAULT_EDGE_MODEL = "smollm2-135m-instruct"  # the one place the default model id is written
CACHE_MIN_LOGPROB = -0.825  # python -m bench.cache_floor: balanced accuracy 0.775 on 120 answers
PRIVACY_MODES = ("keep_on_device", "redact", "off")
EDGE_BACKENDS = ("llama_cpp", "onnx")
# the settings CloudBackend takes, checked by its rule (backends.circuit.check_setting)
CLOUD_RULES = {"cloud_connect_timeout_s": "seconds>0", "cloud_read_timeout_s": "seconds>0",
               "cloud_stall_timeout_s": "seconds>0|None", "cloud_max_retries": "count>=0",
               "cloud_breaker_threshold": "count>=1", "cloud_breaker_cooldown_s": "seconds>=0"}


@dataclass
class HybridLLMConfig:
    # the device
    edge_model: str = DEFAULT_EDGE_MODEL
    edge_backend: str = "llama_cpp"  # "llama_cpp" (GGUF) or "onnx" (ONNX Runtime GenAI)
    n_ctx: int = 4096
    n_threads: int | None = None
    edge_max_waiting: int = 64  # requests that may wait for the device model; more: EdgeBusyError
    edge_wait_timeout_s: float | None = 300.0  # longest wait for the device model's turn
    # the cloud (any OpenAI-compatible endpoint; several URLs are balanced)
    cloud_url: list[str] = field(default_factory=list)
    cloud_api_key: str | None = field(default=None, repr=False)  # a secret: never in a repr or a log
    cloud_model: str | None = None
    cloud_connect_timeout_s: float = 3.0
    cloud_read_timeout_s: float = 120.0  # longest wait for a read, the first token's included
    cloud_stall_timeout_s: float | None = 10.0  # longest silence between events after the first
    cloud_max_retries: int = 2
    cloud_breaker_threshold: int = 3
    cloud_breaker_cooldown_s: float = 10.0
    price_per_1k_tokens: float = 0.002  # USD, prompt and completion alike
    # cloud endpoints with a region and grid carbon intensity (hybridllm.carbon): dicts
    # {"url", "region", "carbon_intensity"} or CloudEndpoint; their URLs join cloud_url
    cloud_endpoints: list = field(default_factory=list)
    cloud_joules_per_token: float = 1.0  # energy estimate when a server reports none
    # the router and the policies
    router: str | None = None  # path to a router folder; None = the shipped default
    threshold: float | None = None  # None = the router's calibrated threshold
    privacy: str = "keep_on_device"
    # the cloud budget (hybridllm.router.budget): per sliding hour / day; dollars at price_per_1k_tokens
    max_cloud_calls_per_hour: int | None = None
    max_cloud_calls_per_day: int | None = None
    max_cloud_tokens_per_hour: int | None = None
    max_cloud_tokens_per_day: int | None = None
    max_cloud_usd_per_hour: float | None = None
    max_cloud_usd_per_day: float | None = None
    cascade: bool = False
    # the semantic cache
    cache: bool = True
    cache_path: str | None = None
    namespace: str = "default"
    cache_ttl_s: float | None = 7 * 86400
    cache_max_entries: int = 10000
    cache_verifier: str = "default"  # "default" (reranker) | "features" | "cosine" | a file path
    # answers whose mean token log-probability is below this are not stored (None: store all);
    # calibrated with `python -m bench.cache_floor` (see README, "Semantic cache")
    cache_min_logprob: float | None = CACHE_MIN_LOGPROB
    # default sampling
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cloud_url, str):
            self.cloud_url = [u.strip() for u in self.cloud_url.split(",") if u.strip()]
        else:  # a list's items stripped as the string's parts are ("https://x.example " was the
            # host "x.example%20", which never resolves); a space inside one is refused (check_url)
            self.cloud_url = [u.strip() if isinstance(u, str) else u for u in self.cloud_url]
        if self.cloud_endpoints:
            from .carbon import CloudEndpoint

            self.cloud_endpoints = [CloudEndpoint.of(e) for e in self.cloud_endpoints]
            self.cloud_url = list(self.cloud_url) + [
                e.url for e in self.cloud_endpoints if e.url not in self.cloud_url]
        for f in dataclasses.fields(self):  # an int past a float's range (cache_ttl_s=10**400)
            value = getattr(self, f.name)  # passed each comparison and failed later (OverflowError)
            if "float" in str(f.type) and isinstance(value, int) and not isinstance(value, bool):
                try:
                    float(value)
                except OverflowError:
                    raise ConfigError(f"{f.name} must be a number, got an integer past a float's "
                                      "range.") from None
        if not self.cloud_joules_per_token > 0:
            raise ConfigError("cloud_joules_per_token must be positive.")
        for url in self.cloud_url:  # the cloud client's rule: a bad port or no host too
            check_url("cloud_url", url)
        if self.edge_backend not in EDGE_BACKENDS:
            raise ConfigError(f"edge_backend must be one of {EDGE_BACKENDS}, got {self.edge_backend!r}.")
        if self.privacy not in PRIVACY_MODES:
            raise ConfigError(f"privacy must be one of {PRIVACY_MODES}, got {self.privacy!r}.")
        check_namespace(self.namespace, ConfigError)
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold must be in [0, 1], got {self.threshold}.")
        # cache_ttl_s too (None: no expiry): before, 0 or nan passed here and failed only when the
        # client opened its cache, so `hybridllm config show` printed settings that could not run
        for name in ("edge_wait_timeout_s", "cache_ttl_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be positive or None, got {value}.")
        # the cloud client's own numbers: a connect timeout of 0 failed every cloud call at once
        # and a breaker threshold of 0 kept every circuit open, so the device silently answered all.
        # The cloud client's rule (check_setting), so a value it would refuse (True, inf, "10") is
        # refused here, under the setting's name, not when the client is built (or a TypeError)
        for name, rule in CLOUD_RULES.items():
            check_setting(name, getattr(self, name), rule)
        if not math.isfinite(self.cloud_joules_per_token):
            raise ConfigError(f"cloud_joules_per_token must be finite, got {self.cloud_joules_per_token}.")
        # nan compares false with every answer's log-probability, so it stored them all
        # and a positive floor (a probability, 0.5, taken for a log-probability) stored none: a
        # mean token log-probability is never above 0, so the cache silently stayed empty
        if self.cache_min_logprob is not None and not (
                math.isfinite(self.cache_min_logprob) and self.cache_min_logprob <= 0):
            raise ConfigError(
                "cache_min_logprob must be a finite number or None, and at most 0 (a mean token "
                f"log-probability, e.g. -0.825, not a probability), got {self.cache_min_logprob}.")
        for name in ("n_ctx", "cache_max_entries", "edge_max_waiting"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.n_threads is not None and self.n_threads < 1:
            raise ConfigError(
                f"n_threads must be at least 1 (leave it out for all cores), got {self.n_threads}.")
        if self.price_per_1k_tokens < 0:
            raise ConfigError("price_per_1k_tokens must be >= 0.")
        self.budget()  # its limits checked when the settings are loaded, cloud or not
        self._check_sampling_defaults()

    def budget(self) -> Any:
        """The cloud budget's ledger these settings describe (a new, empty one)."""
        from .router.budget import Budget

        return Budget(**{name: getattr(self, name) for name in BUDGET_FIELDS},
                      price_per_1k_tokens=self.price_per_1k_tokens)

    def _check_sampling_defaults(self) -> None:
        """The default sampling settings, checked by the request's own rules (the same ranges),
        so a bad default fails when the settings are loaded rather than at the first request."""
        try:
            GenerationParams(
                max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                top_k=self.top_k, min_p=self.min_p, repeat_penalty=self.repeat_penalty, seed=self.seed,
                presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty)
        except InvalidRequestError as exc:
            raise ConfigError(str(exc)) from None

    def public_dict(self) -> dict[str, Any]:
        """The settings with secrets masked, for `hybridllm config show` and logs."""
        return {name: public_value(value, secret=name in SECRET_FIELDS)
                for name, value in dataclasses.asdict(self).items()}


BUDGET_FIELDS = ("max_cloud_calls_per_hour", "max_cloud_calls_per_day", "max_cloud_tokens_per_hour",
                 "max_cloud_tokens_per_day", "max_cloud_usd_per_hour", "max_cloud_usd_per_day")


def _coerce(name: str, raw: str, typ: Any) -> Any:
    text = str(typ)
    # the spaces around a switch or "none" ignored, as int() and float() ignore them around a
    # number: HYBRIDLLM_CACHE=" 0 " was refused while HYBRIDLLM_N_CTX=" 4096 " was read; a text
    # setting (a model name, a key) is kept as given
    word = raw.lower() if "str" in text else raw.strip().lower()
    try:
        if word in ("none", "") and "None" in text:
            return None
        if "bool" in text:
            if word in ("1", "true", "yes", "on"):
                return True
            if word in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "list" in text:
            return [p.strip() for p in raw.split(",") if p.strip()]
        if "int" in text and "float" not in text:
            return int(raw)
        if "float" in text:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"HYBRIDLLM_{name.upper()}={raw!r} is not a valid {text}.") from None


def _type_problem(name: str, value: Any, annotation: Any) -> str | None:
    """Why a value read from a TOML file does not fit a setting's type, or None when it does."""
    kinds = {part.strip() for part in str(annotation).split("|")}
    if value is None and "None" in kinds:
        return None
    if "bool" in kinds:
        fits, wanted = isinstance(value, bool), "true or false"
    elif "int" in kinds:
        fits, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif "float" in kinds:
        fits, wanted = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif "list[str]" in kinds:  # a comma-separated string is accepted too (see __post_init__)
        fits = isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value))
        wanted = "a string or a list of strings"
    elif "list" in kinds:
        fits, wanted = isinstance(value, list), "a list"
    elif "str" in kinds:
        fits, wanted = isinstance(value, str), "a string"
    else:
        return None
    # the value as shown: a wrong-typed key or a URL list's password is never printed
    shown = "***" if name in SECRET_FIELDS else public_value(value)
    return None if fits else f"{name} must be {wanted}, got {shown!r}."


def _argument_problem(name: str, value: Any, annotation: Any) -> str | None:
    """Why a constructor argument does not fit its setting, or None: the config file's rule
    (:func:`_type_problem`), taking what Python code passes besides TOML's types (a Path, a tuple,
    numpy numbers, 0 or 1 for a switch). Before, an argument was never checked: ``cascade="no"``
    and ``cache="false"`` (true, as any non-empty text) turned them on, ``n_ctx=1.5`` was kept."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    elif isinstance(value, tuple):
        value = list(value)
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = bool(value) if "bool" in str(annotation) and value in (0, 1) else int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    return _type_problem(name, value, annotation)


def _did_you_mean(unknown: set[str], fields: Any) -> str:
    """`` (did you mean: n_ctxx -> n_ctx?)`` for unknown settings close to a known one (a typo)."""
    import difflib

    guesses = [f"{u} -> {close[0]}" for u in sorted(unknown)
               if (close := difflib.get_close_matches(u.lower(), list(fields), n=1, cutoff=0.7))]
    return f" (did you mean: {', '.join(guesses)}?)" if guesses else ""


def _check_source(source: str, values: dict[str, Any]) -> None:
    """Check the settings one source gives on their own, so an error names where it came from."""
    try:
        HybridLLMConfig(**values)
    except (ConfigError, TypeError) as exc:  # the source names a URL from the environment: masked
        raise ConfigError(public_text(f"{source}: {exc}")) from None


def load_config(config: str | os.PathLike[str] | None = None, **overrides: Any) -> HybridLLMConfig:
    fields = {f.name: f for f in dataclasses.fields(HybridLLMConfig)}
    unknown = set(overrides) - set(fields)
    if unknown:
        raise ConfigError(f"Unknown setting(s) {sorted(unknown)}{_did_you_mean(unknown, fields)}; "
                          "see `hybridllm config show`.")
    for name, value in overrides.items():  # the cloud's settings are checked by its own rule
        problem = None if value is None or name in CLOUD_RULES else _argument_problem(
            name, value, fields[name].type)
        if problem:
            raise ConfigError(problem)
    values: dict[str, Any] = {}
    # a source's values are checked on their own (so an error names the source), those a later
    # source overrides excepted: arguments override the environment, which overrides the file
    given = {k for k, v in overrides.items() if v is not None}
    from_env = {n for n in fields if os.environ.get(f"HYBRIDLLM_{n.upper()}") is not None}
    path = config_file_path(config)
    if path is not None:
        try:
            # utf-8-sig: a file saved with a byte order mark (Windows Notepad) was "not valid TOML"
            text = _read_config_file(path).decode("utf-8-sig")
            # line ends as the text mode that read it before made them (a lone \r too)
            data = tomllib.loads(text.replace("\r\n", "\n").replace("\r", "\n"))
        except FileNotFoundError:
            raise ConfigError(f"Config file {path} does not exist.") from None
        except OSError as exc:  # a folder, no permission
            raise ConfigError(f"Cannot read config file {path}: {exc.strerror or exc}.") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Config file {path} is not valid TOML: {exc}.") from exc
        except RecursionError:  # arrays or tables nested past the stack: no setting is like that
            raise ConfigError(f"Config file {path} is not a hybridllm config: its values are nested "
                              "too deeply to read.") from None
        if "hybridllm" in data and len(data) > 1:
            # keys above the [hybridllm] header, or another table (a typo: [hybridlm]), were
            # silently ignored: the settings go at the top level or under [hybridllm], not both
            outside = sorted(set(data) - {"hybridllm"})
            raise ConfigError(f"Config file {path} has {outside} outside [hybridllm]; put every "
                              "setting under [hybridllm], or every one at the top level.")
        data = data.get("hybridllm", data)
        if not isinstance(data, dict):
            raise ConfigError(f"Config file {path}: [hybridllm] must be a table of settings.")
        bad = set(data) - set(fields)
        if bad:
            raise ConfigError(f"Config file {path} has unknown setting(s) {sorted(bad)}"
                              f"{_did_you_mean(bad, fields)}.")
        for name, value in data.items():
            problem = _type_problem(name, value, fields[name].type)
            if problem:
                raise ConfigError(f"Config file {path}: {problem}")
        _check_source(f"Config file {path}", {k: v for k, v in data.items() if k not in given | from_env})
        values.update(data)
    for name, f in fields.items():
        env = os.environ.get(f"HYBRIDLLM_{name.upper()}")
        if env is not None and name not in given:  # an argument overrides it, unread: even a bad one
            values[name] = _coerce(name, env, f.type)
            shown = public_value(env, secret=name in SECRET_FIELDS)
            _check_source(f"HYBRIDLLM_{name.upper()}={shown!r}", {name: values[name]})
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return HybridLLMConfig(**values)
    except TypeError as exc:
        # an argument of the wrong type (n_ctx="4096") failed a comparison: "'<' not supported
        # between instances of 'str' and 'int'" named no setting; name the argument that does not fit
        for name, value in overrides.items():
            problem = None if value is None else _type_problem(name, value, fields[name].type)
            if problem:
                raise ConfigError(problem) from exc
        raise ConfigError(public_text(f"Invalid settings: {exc}.")) from exc

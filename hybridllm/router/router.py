"""The difficulty router: a score in [0, 1] per request against a threshold (RouteLLM's way).

A router is a folder with ``router.json`` (format version, feature spec, threshold, training
record, metrics) and ``weights.npz`` (numpy arrays only, loaded with ``allow_pickle=False``).

    score = P(the edge model fails where the cloud model succeeds | features of the last user turn)
    route = "cloud" if score >= threshold and threshold < 1 else "edge"

RouteLLM's rule (the strong model when the score reaches the threshold) with its two ends made
exact: threshold 0 sends every prompt to the cloud and threshold 1 none, not even one scoring 1.0
(a score is a float in [0, 1], so without the exception no threshold could keep all of them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError, InvalidRequestError, RouterError, RouterFileError
from .._files import DAMAGED_NPZ_ERRORS, fsync_file, fsync_folder
from .._types import Message, is_real, last_user_text, normalize_messages
from ._router_file import (
    _RESERVED,
    CLASSIFIER,
    CONFIG_NAME,
    FORMAT,
    FORMAT_VERSION,
    MIXTURE_CLASSIFIER,
    MIXTURE_FORMAT_VERSION,
    TRAIN_HASHES,
    WEIGHTS_NAME,
    _number_field,
    _read_config,
)
from .classifier import GainScorer
from .features import (
    EMBEDDER_ID,
    EMBEDDING_DIM,
    TEXT_FEATURES,
    embed_one,
    embed_texts,
    feature_matrix,
)
from .features import text_features as _text_features
from .mixture import SourceMixture

DEFAULT_LOGPROB_THRESHOLD = -1.0  # used by should_escalate when the router carries no calibration
NEVER_CLOUD = 1.0  # the threshold that sends no prompt to the cloud by its score


def routable(score: float) -> float:
    """``score``, or a RouterError when it is NaN: NaN compares false with every bound, so the
    prompt stayed on the device (reason "score nan < threshold"), whatever it asked (weights that
    overflow on it, a custom scorer)."""
    if math.isnan(score):
        raise RouterError("The router scored the prompt NaN, so it cannot route it; nothing was "
                          "sent. Check or retrain the router (its weights overflow on this prompt).")
    return score


def sends_to_cloud(scores: Any, threshold: float) -> np.ndarray:
    """The routing rule on one score or an array of them: ``score >= threshold``, and nothing at
    threshold 1 (see the module's doc). Every place that routes by the score goes through here."""
    return np.logical_and(np.asarray(scores) >= threshold, threshold < NEVER_CLOUD)


@dataclass
class Router:
    """A trained scorer plus its threshold. ``score`` and ``route`` take OpenAI-style messages."""

    scorer: GainScorer | SourceMixture
    threshold: float
    use_embedding: bool = True
    logprob_threshold: float = DEFAULT_LOGPROB_THRESHOLD
    info: dict[str, Any] = field(default_factory=dict)
    # hashes of the training prompts (:func:`.dataset.prompt_hashes`, sorted): `router eval` counts a
    # held-out file's prompts the router was trained on; None in routers saved before them
    train_hashes: np.ndarray | None = None

    def __post_init__(self) -> None:
        t, lp = self.threshold, self.logprob_threshold
        # is_real: numpy's float32 (a score array's element) is no float, and was refused
        if not is_real(t) or not 0.0 <= t <= 1.0:
            raise RouterError(f"threshold must be a number in [0, 1] (1: never the cloud), got {t!r}.")
        if not is_real(lp) or math.isnan(lp):  # NaN: no mean_logprob is below it, no escalation
            raise RouterError(f"logprob_threshold must be a number (a mean token log-probability, "
                              f"such as -1.0), got {lp!r}.")
        self.threshold, self.logprob_threshold = float(t), float(lp)  # JSON numbers when saved
        expected = len(TEXT_FEATURES) + (EMBEDDING_DIM if self.use_embedding else 0)
        mixture = isinstance(self.scorer, SourceMixture)
        needs_emb = mixture or self.scorer.uses_neighbors or self.scorer.uses_topics
        if needs_emb and not self.use_embedding:
            raise RouterFileError("The router's neighbor part needs embeddings; retrain it.")
        if self.scorer.num_features != expected:
            raise RouterFileError(
                f"The router's classifier takes {self.scorer.num_features} features but this "
                f"version computes {expected}; retrain it with `hybridllm router train`."
            )
        # the embedding parts' width, else a numpy broadcast error at the first request
        widths = _embedding_widths(self.scorer) if self.use_embedding else set()
        if widths - {EMBEDDING_DIM}:
            raise RouterFileError(
                f"The router's embedding part takes {sorted(widths)}-float vectors but the embedder "
                f"{EMBEDDER_ID} gives {EMBEDDING_DIM}; retrain it with `hybridllm router train`."
            )

    # scoring -------------------------------------------------------------------------------
    def score_text(self, text: str, *, embedding: np.ndarray | None = None) -> float:
        """Score one prompt. Pass ``embedding`` (``[384]``) to reuse one the cache computed."""
        if not isinstance(text, str):  # else a TypeError from len() or a regex deep in the features
            raise InvalidRequestError(
                f"score_text() takes the prompt's text, got {type(text).__name__}; "
                "use score() for a message list (it scores the last user turn)."
            )
        feats = _text_features(text)
        emb = None
        if self.use_embedding:
            emb = embed_one(text) if embedding is None else _checked_embeddings(embedding, 1)
            emb = emb.reshape(-1)
            feats = np.concatenate([feats, emb])
        return float(self.scorer.predict(feats, emb)[0])

    def score(
        self, messages: str | Sequence[Message], *, embedding: np.ndarray | None = None
    ) -> float:
        return self.score_text(last_user_text(normalize_messages(messages)), embedding=embedding)

    def score_texts(
        self, texts: Sequence[str], *, embeddings: np.ndarray | None = None
    ) -> np.ndarray:
        """Score many prompts at once: ``[n]`` float64, each as :meth:`score_text` scores it (the
        prompts are embedded one at a time, as at run time; see :meth:`Embedder.embed`)."""
        if isinstance(texts, str | bytes):
            # a string is a sequence too: each of its characters would be scored as a prompt
            raise InvalidRequestError(
                f"score_texts() takes a list of prompts, got {type(texts).__name__}; "
                "use score() for one prompt."
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):  # else a TypeError from a regex deep in the features
                raise InvalidRequestError(
                    f"score_texts() takes prompt strings, but texts[{i}] is {type(text).__name__}; "
                    "use score() for a message list (it scores the last user turn)."
                )
        if self.use_embedding:
            embeddings = embed_texts(texts) if embeddings is None else _checked_embeddings(
                embeddings, len(texts))
        x = feature_matrix(texts, use_embedding=self.use_embedding, embeddings=embeddings)
        emb = embeddings if self.use_embedding else None
        return np.asarray(self.scorer.predict(x, emb), dtype=np.float64)

    def route(
        self, messages: str | Sequence[Message], *, embedding: np.ndarray | None = None
    ) -> tuple[str, float]:
        s = routable(self.score(messages, embedding=embedding))
        return ("cloud" if sends_to_cloud(s, self.threshold) else "edge"), s

    def calibrated(
        self, prompts: Sequence[str | Sequence[Message]], cloud_fraction: float
    ) -> Router:
        """A copy of this router whose threshold sends ``cloud_fraction`` (0..1) of ``prompts`` to
        the cloud, as ``hybridllm router calibrate`` sets it. ``prompts`` is a sample of your traffic:
        strings or OpenAI-style message lists (each scored on its last user turn, as at run time).
        ``cloud_fraction`` 0 gives threshold 1 (no prompt goes), 1 gives threshold 0. This router
        is left as it is; ``.save(folder)`` keeps the copy."""

        cf = cloud_fraction
        if not is_real(cf) or not 0.0 <= cf <= 1.0:
            raise InvalidRequestError(
                f"cloud_fraction must be a number between 0 and 1 (the share of prompts sent to "
                f"the cloud), got {cf!r}."
            )
        texts = _prompt_texts(prompts)  # every prompt checked before minutes of embedding
        threshold = calibrate_threshold(self.score_texts(texts), float(cf))
        return dataclasses.replace(self, threshold=threshold, info=dict(self.info))

    def should_escalate(self, mean_logprob: float | None) -> bool:
        """Cascade: hand the request to the cloud when the edge answer's confidence is low. None
        (a backend that gave no log-probabilities) is no confidence, as in the client's pipeline."""
        if mean_logprob is None:
            return True
        if not is_real(mean_logprob):  # a string raised a bare TypeError from math.isfinite
            raise InvalidRequestError(
                f"should_escalate() takes the edge answer's mean token log-probability (a number, "
                f"or None), got {type(mean_logprob).__name__}."
            )
        # bool(): a numpy number gave numpy's bool, which json.dumps refuses
        return bool(not math.isfinite(mean_logprob) or mean_logprob < self.logprob_threshold)

    # files ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write ``router.json`` and ``weights.npz`` into ``folder``. Each is written beside its
        place and renamed over it, so a crash leaves the router that was there whole; both carry
        one ``save_id``, so a crash between the two renames is refused, never loaded as half of each."""
        out = Path(folder)
        if out.exists() and not out.is_dir():
            raise RouterFileError(f"{out} is a file; pass a folder for the router.")
        out.mkdir(parents=True, exist_ok=True)
        save_id = uuid.uuid4().hex
        mixture = isinstance(self.scorer, SourceMixture)
        config = {
            "format": FORMAT,
            "format_version": MIXTURE_FORMAT_VERSION if mixture else FORMAT_VERSION,
            "classifier": MIXTURE_CLASSIFIER if mixture else CLASSIFIER,
            "text_features": list(TEXT_FEATURES),
            "embedding": EMBEDDER_ID if self.use_embedding else None,
            "threshold": self.threshold,
            "logprob_threshold": self.logprob_threshold,
            "save_id": save_id,
            **{k: v for k, v in self.info.items() if k not in _RESERVED},
        }
        weights, cfg = (out / f".{name}.{os.getpid()}.tmp" for name in (WEIGHTS_NAME, CONFIG_NAME))
        try:
            with weights.open("wb") as fh:
                hashes = self.train_hashes
                extra = {} if hashes is None else {TRAIN_HASHES: np.asarray(hashes, np.uint64)}
                np.savez(fh, save_id=np.array(save_id), **extra, **self.scorer.to_arrays())  # type: ignore[arg-type]
            cfg.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            # on the disk before either rename, as the other writers' files (_files.replacing): a
            # power cut after the renames left the folder's names on files the disk never got
            fsync_file(weights)
            fsync_file(cfg)
            try:
                weights.replace(out / WEIGHTS_NAME)
            finally:
                # once the new weights are in place their config follows them, a Ctrl-C there or
                # not: both are whole on disk by now. Left to the interrupt, the folder held the new
                # weights under the old router.json, refused as two saves: the router that was
                # there lost to a Ctrl-C as `train --out` or `calibrate` in place finished
                if not weights.exists():
                    cfg.replace(out / CONFIG_NAME)
            fsync_folder(out)
        finally:
            weights.unlink(missing_ok=True)
            cfg.unlink(missing_ok=True)
        return out


def _embedding_widths(scorer: GainScorer | SourceMixture) -> set[int]:
    """The embedding widths the scorer's gate and projections take (none: linear part only)."""
    if isinstance(scorer, SourceMixture):
        return {scorer.gate_mean.shape[0]}.union(*(_embedding_widths(e) for e in scorer.experts))
    return set() if scorer.proj_mean is None else {scorer.proj_mean.shape[0]}


def _prompt_texts(prompts: Sequence[str | Sequence[Message]]) -> list[str]:
    """The text the router scores of each prompt (a string, or messages: the last user turn);
    an empty or malformed one is refused with its index."""
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
        raise InvalidRequestError(
            f"Pass a list of prompts (strings or message lists), got {type(prompts).__name__}."
        )
    if len(prompts) == 0:
        raise InvalidRequestError("The list of prompts is empty: pass at least one prompt.")
    texts = []
    for i, prompt in enumerate(prompts):
        try:
            texts.append(last_user_text(normalize_messages(prompt)))
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"prompts[{i}]: {exc}") from exc
    return texts


def _checked_embeddings(embeddings: Any, n: int) -> np.ndarray:
    """``embeddings`` as ``[n, EMBEDDING_DIM]`` float32 (``[EMBEDDING_DIM]`` for one prompt), or
    an :class:`InvalidRequestError`: a wrong shape would be a numpy error deep in the scorer, and a
    NaN a NaN score, which never reaches the threshold (the prompt would stay on the device)."""
    emb = np.asarray(embeddings, dtype=np.float32)
    want = (n, EMBEDDING_DIM)
    if emb.shape != want and not (n == 1 and emb.shape == (EMBEDDING_DIM,)):
        raise InvalidRequestError(
            f"The embeddings have shape {emb.shape}; the router needs {want} (one "
            f"{EMBEDDING_DIM}-float vector per prompt, from the shared embedder)."
        )
    if not np.all(np.isfinite(emb)):
        raise InvalidRequestError("The embeddings hold NaN or inf; pass the embedder's vectors.")
    return emb.reshape(want)


def default_router_dir() -> Path:
    from .._paths import assets_dir

    return assets_dir() / "router"


def load_router(path: str | Path | None = None) -> Router:
    """Load a router folder (or its ``router.json``); ``None`` loads the shipped default."""
    folder = default_router_dir() if path is None else Path(path).expanduser()
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise RouterFileError(
            f"Router folder {folder} does not exist; pass the folder `hybridllm router train --out` "
            "wrote (or its router.json), or leave the router path out for the shipped router."
        )
    config = _read_config(folder)
    use_embedding = config.get("embedding") is not None
    num_features = len(TEXT_FEATURES) + (EMBEDDING_DIM if use_embedding else 0)
    weights = folder / WEIGHTS_NAME
    try:
        loaded = np.load(weights, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # one bare .npy array under the name
            raise ValueError("a single array, not an .npz archive of the router's arrays")
        with loaded as npz:
            arrays = {k: np.asarray(npz[k]) for k in npz.files}
    except FileNotFoundError as exc:
        raise RouterFileError(f"{weights} is missing; retrain or re-copy the router.") from exc
    except DAMAGED_NPZ_ERRORS as exc:
        raise RouterFileError(f"{weights} is corrupt ({exc}); retrain or re-copy it.") from exc
    save_id = arrays.pop("save_id", None)  # none in files written before it
    train_hashes = arrays.pop(TRAIN_HASHES, None)  # none in files written before it
    if train_hashes is not None and (train_hashes.dtype != np.uint64 or train_hashes.ndim != 1):
        train_hashes = None  # only `router eval`'s overlap count uses it: never refuse a router over it
    if config.get("save_id") != (None if save_id is None else str(save_id)):
        raise RouterFileError(
            f"{folder}: {CONFIG_NAME} and {WEIGHTS_NAME} are from two different saves (one was "
            "interrupted); retrain or re-copy the router."
        )
    scorer: GainScorer | SourceMixture
    try:
        if config.get("classifier") == MIXTURE_CLASSIFIER:
            scorer = SourceMixture.from_arrays(arrays, num_features=num_features)
        else:
            scorer = GainScorer.from_arrays(arrays, num_features=num_features)
    except RouterFileError as exc:  # say which file: the messages name only the array
        raise RouterFileError(f"{weights}: {exc}") from exc
    except (ValueError, TypeError, IndexError) as exc:  # a hand-edited array: text, or no dimension
        raise RouterFileError(f"{weights} is corrupt ({exc}); retrain or re-copy it.") from exc
    path = folder / CONFIG_NAME
    threshold = _number_field(config, "threshold", path, "a number in [0, 1] (1: never the cloud)",
                              lambda v: 0.0 <= v <= 1.0)
    logprob_threshold = _number_field(
        config, "logprob_threshold", path, "a number (a mean token log-probability, such as -1.0)",
        lambda v: not math.isnan(v), default=DEFAULT_LOGPROB_THRESHOLD,
    )
    info = {k: v for k, v in config.items() if k not in _RESERVED}
    try:
        return Router(scorer=scorer, threshold=threshold, use_embedding=use_embedding,
                      logprob_threshold=logprob_threshold, info=info, train_hashes=train_hashes)
    except RouterError as exc:  # the file's arrays and config disagree: name the folder
        raise RouterFileError(f"{folder}: {exc}") from exc


def calibrate_threshold(scores: Any, cloud_fraction: float) -> float:
    """The threshold that routes ``cloud_fraction`` of ``scores`` to the cloud: 0 gives 1.0 (no
    prompt, whatever it scores) and 1 gives 0.0 (every prompt). Prompts tied at the boundary all
    go one way: the count of the two nearer the share asked for, the smaller on a tie."""
    if not 0.0 <= cloud_fraction <= 1.0:
        raise DataError(f"cloud_fraction must be between 0 and 1, got {cloud_fraction}.")
    s = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))
    if len(s) == 0:
        raise DataError("Calibration needs at least one prompt.")
    if not np.all(np.isfinite(s)):  # np.sort puts NaN last: the threshold would come out NaN
        raise DataError("Calibration got NaN or inf scores; check the router file.")
    if s[0] < 0.0 or s[-1] > 1.0:
        # a threshold is a number in [0, 1]: on a custom scorer's 0-10 scores the one returned was
        # clamped below 1 and sent 90% of the prompts where 30% was asked, without a word
        raise DataError(
            f"Calibration takes router scores in [0, 1], got scores from {s[0]:g} to {s[-1]:g}; "
            "map a custom scorer's scores to [0, 1] (higher: the cloud adds more)."
        )
    # the ends are the user's words, "none" and "all", for prompts outside the sample too
    if cloud_fraction == 0.0:
        return NEVER_CLOUD
    if cloud_fraction == 1.0:
        return 0.0
    n = len(s)
    n_cloud = min(int(round(cloud_fraction * n)), n)
    cut = n - n_cloud  # s[cut:] go to the cloud
    if 0 < cut < n and s[cut - 1] == s[cut]:
        # prompts that score alike go the same way: of sending all of the tied ones or none, the
        # count nearer the share asked for (the smaller where both are as near)
        first, after = np.searchsorted(s, s[cut], "left"), np.searchsorted(s, s[cut], "right")
        cut = int(first if n_cloud - (n - after) > (n - first) - n_cloud else after)
    if cut == n:  # no prompt (a share too small for the sample): just above its highest score
        return float(min(NEVER_CLOUD, np.nextafter(s[-1], np.inf)))
    if cut == 0:  # every prompt: the lowest score, below 1 as below (1.0 is "never")
        return float(min(s[0], np.nextafter(NEVER_CLOUD, 0.0)))
    # midway between the last edge score and the first cloud score generalizes best, but above
    # the edge score (the mean of two neighbouring floats may round down to it); below 1, where
    # the first cloud score is 1.0 (threshold 1 would keep it on the device)
    mid = max((s[cut - 1] + s[cut]) / 2.0, np.nextafter(s[cut - 1], np.inf))
    return float(min(mid, np.nextafter(NEVER_CLOUD, 0.0)))

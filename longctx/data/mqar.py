"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", arXiv 2312.04927 §3), written
as word-token text for memories:

    python -m longctx.data synth mqar --out data/mqar --min_distance 32 --max_distance 128

One episode per line. K key/value bindings `k12 v803 k7 v95 ...` (K distinct keys from the key words
`k0 .. k{keys-1}`, K distinct values from the value words `v0 .. v{values-1}`), then filler and K
queries: each key once more, followed by the value bound to it (`... f31 k7 v95 f8 ...`), every query
after all the bindings, as in zoology's `multiquery_ar` (HazyResearch/zoology,
`zoology/data/multiquery_ar.py`). Read with `--data.corpus text_files --data.tokenizer words`: one
token per word and one `<eos>` per line, so every key and every value is one token.

The answer of a query is its value token; its *distance* is the answer's offset minus the offset of
the value in the binding, in tokens. Where the queries go (`gap_law`):

- `uniform` (default): each key, in a random order, takes a distance drawn uniformly from those in
  [min_distance, max_distance] whose query slot (key, value) is still free and lies after the
  bindings; the episode ends with its last query (or is padded with filler to `episode_tokens`). So
  the answers can sit beyond one segment and within, or beyond, a memory's reach.
- `zoology`: zoology's placement in an episode of `episode_tokens` T: the query region after the 2K
  binding tokens has (T − 2K)/2 two-token slots; slot g is drawn with probability ∝ g^(power_a − 1)
  (g = 1, 2, ...; power_a 0.01 puts most queries right after the bindings), without replacement, the
  j-th draw for the j-th bound key.

Filler (`filler`): `separate` words `f0 .. f{filler_vocab-1}`, never a key or a value, so nothing
between a binding and its query mentions the key or the value; or `random`, zoology's "random
non-query" tokens, drawn uniformly from the key and value words (zoology draws from its whole
vocabulary, token 0 included, which is not a word here).

**Fresh episodes.** No episode (line) is written twice, within a split or across splits (train is
generated first; an episode already written is drawn again), deterministically by (seed, split).
Training on a file of at least max_steps × batch_size × tgt_len tokens (`train_tokens`) therefore
never shows an episode twice: Transformer-XL's stream reads the file once per epoch, and resuming
a fit resumes the stream exactly (`SegmentStream` state in the checkpoint).

Marks (`<split>.marks.npz`, `longctx.data.synth.load_marks`), one entry per answer, sorted by offset:
`offset` (index of the answer token in the split's token stream under `tokenizer: words`, `<eos>`
counted), `distance` (tokens), `query` (0 = the first query of its episode in text order),
`pairs` (K), `episode` (index of the episode in the split), and the scalars `tokenizer` ("words")
and `text_blake2b` (the digest of the text file they belong to).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from longctx.data.cache import SPLITS, WORDS_TOKENIZER
from longctx.runtime.atomic import atomic_path, write_json_atomic

GapLaw = Literal["uniform", "zoology"]
Filler = Literal["separate", "random"]
MARKS_SUFFIX = ".marks.npz"  # as `longctx.data.synth`'s
MAX_REDRAWS = 1000  # episodes drawn in a row that were all written before: the settings are exhausted

# zoology's smallest MQAR cell (their Figure 2; `MQARConfig`/`multiquery_ar` defaults): vocabulary
# 8,192 = token 0 + 4,095 keys [1, 4096) + 4,096 values [4096, 8192), 64-token examples, 4 pairs,
# queries by the power law with power_a 0.01, random non-query tokens.
PRESETS: dict[str, dict[str, Any]] = {
    "zoology": {
        "keys": 4095,
        "values": 4096,
        "pairs": 4,
        "filler": "random",
        "gap_law": "zoology",
        "episode_tokens": 64,
        "power_a": 0.01,
    },
}


@dataclass(frozen=True)
class MQARSettings:
    """What `generate` writes (see the module doc). pairs: K, bindings and queries per episode.
    keys / values / filler_vocab: words of each kind. min_distance / max_distance: the range of the
    answers' distances (uniform law). episode_tokens: fixed episode length (required by the zoology
    law; optional padding for the uniform one). power_a: the zoology law's exponent. train_tokens /
    eval_tokens: size of train / of valid and test each, in tokens (`<eos>` counted; whole episodes:
    a split ends with the first episode that reaches it)."""

    pairs: int = 4
    keys: int = 1024
    values: int = 1024
    filler: Filler = "separate"
    filler_vocab: int = 1024
    gap_law: GapLaw = "uniform"
    min_distance: int | None = 32
    max_distance: int | None = 128
    episode_tokens: int | None = None
    power_a: float = 0.01
    train_tokens: int = 2_000_000
    eval_tokens: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("pairs", "keys", "values", "filler_vocab", "train_tokens", "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.filler not in ("separate", "random"):
            raise ValueError(f"--filler must be separate or random, got {self.filler!r}")
        if self.pairs > min(self.keys, self.values):
            raise ValueError(
                f"--pairs ({self.pairs}) needs as many distinct keys and values per episode: "
                f"--keys {self.keys} and --values {self.values} are too few"
            )
        if self.gap_law == "uniform":
            self._check_uniform()
        elif self.gap_law == "zoology":
            self._check_zoology()
        else:
            raise ValueError(f"--gap_law must be uniform or zoology, got {self.gap_law!r}")

    def _check_uniform(self) -> None:
        if self.min_distance is None or self.max_distance is None:
            raise ValueError("--gap_law uniform needs --min_distance and --max_distance")
        if not 2 <= self.min_distance <= self.max_distance:
            raise ValueError(
                f"--min_distance ({self.min_distance}) must be at least 2 and at most --max_distance "
                f"({self.max_distance})"
            )
        # The first key's query comes after all 2K binding tokens; each query placed before blocks at
        # most 3 distances of another key's: this many distances always leave a free slot.
        need = max(self.min_distance, 2 * self.pairs) + 3 * self.pairs - 3
        if self.max_distance < need:
            raise ValueError(
                f"--max_distance must be at least {need} for {self.pairs} queries after {self.pairs} "
                f"bindings with --min_distance {self.min_distance} (max(min_distance, 2K) + 3K - 3)"
            )
        longest = 2 * self.pairs + self.max_distance  # the last binding's value + its farthest query
        if self.episode_tokens is not None and self.episode_tokens < longest:
            raise ValueError(
                f"--episode_tokens ({self.episode_tokens}) must hold the farthest query: at least "
                f"{longest} (2K + max_distance)"
            )

    def _check_zoology(self) -> None:
        if self.min_distance is not None or self.max_distance is not None:
            raise ValueError(
                "--gap_law zoology places the queries by zoology's power law; --min_distance and "
                "--max_distance are for --gap_law uniform (pass them as null/none)"
            )
        T = self.episode_tokens
        if T is None or T % 2 or 4 * self.pairs > T:
            raise ValueError(
                f"--gap_law zoology needs an even --episode_tokens of at least 4K = {4 * self.pairs} "
                f"(K bindings and K queries of two tokens; zoology's assertion), got {T}"
            )
        if self.power_a <= 0:
            raise ValueError(f"--power_a must be positive, got {self.power_a}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> MQARSettings:
        """The settings of preset `name` (`PRESETS`) with `overrides` (those not None) on top; the
        zoology law takes no distance range, so the uniform defaults are dropped under it."""
        base = dict(PRESETS[name])
        given = {key: value for key, value in overrides.items() if value is not None}
        if {**base, **given}.get("gap_law") == "zoology":
            base.update(min_distance=None, max_distance=None)
        return cls(**{**base, **given})

    def split_tokens(self, split: str) -> int:
        return self.train_tokens if split == "train" else self.eval_tokens

    @property
    def words(self) -> list[str]:
        """Every word the episodes use, by code: keys, then values, then filler (separate filler only)."""
        filler = [f"f{i}" for i in range(self.filler_vocab)] if self.filler == "separate" else []
        return [f"k{i}" for i in range(self.keys)] + [f"v{i}" for i in range(self.values)] + filler


@dataclass
class Episode:
    """codes: (T,) word codes (keys, values, filler; `MQARSettings.words`); answers: (K,) positions of
    the query values in text order; distances: (K,) each one's distance to its binding's value."""

    codes: np.ndarray
    answers: np.ndarray
    distances: np.ndarray


def query_slots(settings: MQARSettings, rng: np.random.Generator) -> np.ndarray:
    """(K,) position of each bound key's query value, key j bound at positions (2j, 2j + 1)."""
    K = settings.pairs
    if settings.gap_law == "zoology":
        space = (settings.episode_tokens - 2 * K) // 2
        p = settings.power_a * np.arange(1, space + 1) ** (settings.power_a - 1)
        gaps = rng.choice(space, size=K, replace=False, p=p / p.sum())
        return 2 * K + 2 * gaps + 1
    low, high = settings.min_distance, settings.max_distance
    free = np.ones(2 * K + high + 1, dtype=bool)  # positions an episode's slots may take
    free[: 2 * K] = False  # the bindings
    answers = np.zeros(K, dtype=np.int64)
    for j in rng.permutation(K):
        bound = 2 * j + 1
        q = bound + np.arange(low, high + 1)  # the answer positions of the allowed distances
        q = q[(q - 1 >= 2 * K) & free[q - 1] & free[q]]
        answers[j] = q[rng.integers(len(q))]
        free[answers[j] - 1 : answers[j] + 1] = False
    return answers


def episode(settings: MQARSettings, rng: np.random.Generator) -> Episode:
    """One episode: bindings, then filler with the K queries at `query_slots`."""
    K, n_keys = settings.pairs, settings.keys
    keys = rng.choice(n_keys, size=K, replace=False)
    values = n_keys + rng.choice(settings.values, size=K, replace=False)
    answers = query_slots(settings, rng)
    length = settings.episode_tokens or int(answers.max()) + 1
    if settings.filler == "separate":
        codes = n_keys + settings.values + rng.integers(settings.filler_vocab, size=length)
    else:
        codes = rng.integers(n_keys + settings.values, size=length)
    codes[0 : 2 * K : 2], codes[1 : 2 * K : 2] = keys, values
    codes[answers - 1], codes[answers] = keys, values
    order = np.argsort(answers)
    return Episode(codes, answers[order], (answers - (2 * np.arange(K) + 1))[order])


@dataclass
class SplitMarks:
    """The answers of a split as it is written (see the module doc for the keys)."""

    offset: list[np.ndarray]
    distance: list[np.ndarray]
    episode: list[int]

    def arrays(self, pairs: int, text_digest: str) -> dict[str, np.ndarray]:
        n_episodes = len(self.episode)
        return {
            "offset": np.concatenate(self.offset).astype(np.int64),
            "distance": np.concatenate(self.distance).astype(np.int64),
            "query": np.tile(np.arange(pairs, dtype=np.int64), n_episodes),
            "pairs": np.full(n_episodes * pairs, pairs, dtype=np.int64),
            "episode": np.repeat(np.asarray(self.episode, dtype=np.int64), pairs),
            "tokenizer": np.array(WORDS_TOKENIZER),
            "text_blake2b": np.array(text_digest),
        }


def split_episodes(settings: MQARSettings, split: str, seen: set[bytes]) -> Iterator[tuple[Episode, int]]:
    """(episode, its first token's offset) until the split holds `split_tokens(split)` tokens; seeded
    by (seed, split). An episode in `seen` (written before, in this split or another) is drawn again;
    each one yielded is added to it."""
    rng = np.random.default_rng([settings.seed, SPLITS.index(split)])
    offset, target, redrawn = 0, settings.split_tokens(split), 0
    while offset < target:
        drawn = episode(settings, rng)
        key = hashlib.blake2b(drawn.codes.astype(np.int64).tobytes(), digest_size=16).digest()
        if key in seen:
            redrawn += 1
            if redrawn == MAX_REDRAWS:
                raise ValueError(
                    f"{split}: {MAX_REDRAWS} episodes in a row were written before ({len(seen):,} distinct "
                    f"so far, {offset:,} of {target:,} tokens): these settings allow too few distinct "
                    "episodes; raise --keys, --values or --filler_vocab, or lower --train_tokens or "
                    "--eval_tokens"
                )
            continue
        redrawn = 0
        seen.add(key)
        yield drawn, offset
        offset += len(drawn.codes) + 1  # the episode, then <eos>


def generate(settings: MQARSettings, out_dir: Path | str) -> dict[str, dict[str, int]]:
    """Write the three splits, their marks and `synth.json` into `out_dir`; return counts per split."""
    out_dir = Path(out_dir)
    words = np.array(settings.words, dtype=object)
    seen: set[bytes] = set()
    counts: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        marks = SplitMarks([], [], [])
        digest = hashlib.blake2b(digest_size=16)
        tokens = 0
        with atomic_path(out_dir / f"{split}.txt") as tmp, open(tmp, "wb") as f:
            for number, (drawn, offset) in enumerate(split_episodes(settings, split, seen)):
                line = (" ".join(words[drawn.codes]) + "\n").encode("ascii")
                f.write(line)
                digest.update(line)
                marks.offset.append(offset + drawn.answers)
                marks.distance.append(drawn.distances)
                marks.episode.append(number)
                tokens = offset + len(drawn.codes) + 1
        arrays = marks.arrays(settings.pairs, digest.hexdigest())
        with atomic_path(out_dir / f"{split}{MARKS_SUFFIX}") as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
        counts[split] = {
            "tokens": tokens,
            "episodes": len(marks.episode),
            "answers": len(arrays["offset"]),
            "min_distance": int(arrays["distance"].min()),
            "max_distance": int(arrays["distance"].max()),
        }
    write_json_atomic(
        out_dir / "synth.json",
        {
            "task": "mqar",
            "settings": asdict(settings),
            "splits": counts,
            "vocabulary": {"keys": settings.keys, "values": settings.values, "words": len(settings.words)},
        },
    )
    return counts


def settings_from_flags(flags: dict[str, Any], preset: str | None) -> MQARSettings:
    """The settings named by command-line flags (None: not given) over a preset or the defaults."""
    names = {field.name for field in fields(MQARSettings)}
    given = {key: value for key, value in flags.items() if key in names and value is not None}
    if preset is not None:
        return MQARSettings.preset(preset, **given)
    if given.get("gap_law") == "zoology":  # no distance range under the power law
        given = {"min_distance": None, "max_distance": None, **given}
    return MQARSettings(**given)

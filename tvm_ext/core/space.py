"""Knob spaces: finite typed choices, frozen configs, and the integer index encoding.

The genetic tuner (``search.GeneticSearch``) works on index vectors, one gene per knob, so a
space maps a config to an ``np.ndarray`` of choice indices and back.  Constraints
mark configs infeasible *before* anything is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from .errors import TvmExtError


@dataclass(frozen=True)
class Knob:
    """One schedule parameter with a finite, ordered list of allowed values."""

    name: str
    choices: tuple
    doc: str = ""
    # the value configs written before this knob existed had (their kernels were built as with it);
    # None: the knob was there from the first record (``Space.completed``)
    before: Any = None

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"knob {self.name!r} has no choices")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"knob {self.name!r} has duplicate choices {self.choices}")

    @cached_property
    def _positions(self) -> dict[Any, int]:
        return {choice: i for i, choice in enumerate(self.choices)}  # unique: __post_init__

    def index(self, value: Any) -> int:
        try:
            return self._positions[value]
        except (KeyError, TypeError):
            pass
        try:
            return self.choices.index(value)
        except ValueError:
            raise TvmExtError(
                f"knob {self.name}={value!r} is not allowed; allowed values: "
                + ", ".join(map(str, self.choices))
            ) from None


@dataclass(frozen=True, eq=False)
class Config:
    """A frozen, hashable assignment of a value to every knob.

    Items keep the space's knob order for display; equality and hashing ignore the
    order, so a config read back from a record (keys sorted) equals the decoded one.
    """

    items: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        # each knob's value by name (the first of a repeated name, as the items are read), and as an
        # attribute where the class has none of that name, so that ``cfg.knob`` is a plain lookup:
        # the feasibility checks read knobs millions of times
        values = dict(reversed(self.items))
        object.__setattr__(self, "_values", values)
        taken = _CONFIG_NAMES if type(self) is Config else frozenset(dir(type(self))) | {"_values"}
        self.__dict__.update({k: v for k, v in values.items() if k not in taken})

    def _key(self) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted(self.items, key=lambda kv: kv[0]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> "Config":
        return cls(tuple(mapping.items()))

    def __getitem__(self, name: str) -> Any:
        return self.__dict__["_values"][name]

    def __getattr__(self, name: str) -> Any:
        # Lets templates write ``cfg.wg_x``; dataclass fields resolve first.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items)

    def replace(self, **changes: Any) -> "Config":
        values = self.as_dict()
        unknown = set(changes) - set(values)
        if unknown:
            raise KeyError(f"unknown knobs {sorted(unknown)}")
        values.update(changes)
        return Config.of(values)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items)


_CONFIG_NAMES = frozenset(dir(Config)) | {"_values"}  # names a knob's value must not shadow

Constraint = Callable[[Config], "str | None"]
"""Returns ``None`` when the config is allowed, else the reason it is not."""


@dataclass(frozen=True)
class Space:
    """The cross product of the knobs' choices, minus what the constraints reject."""

    knobs: tuple[Knob, ...]
    constraints: tuple[Constraint, ...] = field(default=(), compare=False)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    @property
    def cardinalities(self) -> np.ndarray:
        """Number of choices per gene, the upper bound of each index."""
        return np.array([len(k.choices) for k in self.knobs], dtype=np.int64)

    @property
    def size(self) -> int:
        return int(np.prod(self.cardinalities, dtype=object))

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise TvmExtError(f"unknown knob {name!r}; knobs: {', '.join(self.names)}")

    def encode(self, config: Config) -> np.ndarray:
        values = config.as_dict()
        if set(values) != set(self.names):
            raise TvmExtError(
                f"config knobs {sorted(values)} do not match the space's {sorted(self.names)}"
            )
        return np.array([k.index(values[k.name]) for k in self.knobs], dtype=np.int64)

    def decode(self, index: Iterable[int]) -> Config:
        idx = [int(i) for i in index]
        if len(idx) != len(self.knobs):
            raise ValueError(f"index vector has {len(idx)} genes, space has {len(self.knobs)}")
        return Config(tuple((k.name, k.choices[i]) for k, i in zip(self.knobs, idx)))

    def make(self, **values: Any) -> Config:
        """A config from keyword values, validated against the choices."""
        missing = set(self.names).difference(values)
        if missing:
            raise TvmExtError(f"config is missing knobs {sorted(missing)}")
        for k in self.knobs:
            k.index(values[k.name])  # each value one of its knob's choices
        return Config(tuple((k.name, values[k.name]) for k in self.knobs))

    def completed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (a config written by an earlier version of this space: a record, a bucket
        database, an operators file) with each knob added since at its earlier value
        (``Knob.before``), so it names the kernel it measured."""
        added = {k.name: k.before for k in self.knobs if k.before is not None and k.name not in values}
        return {**added, **values}

    def outside_reason(self, config: Config, knobs_only: bool = False) -> str | None:
        """Why ``config`` is not a point of this space (unknown or missing knobs, a value that
        is not a choice, a bool for a number), short; ``None`` when it is one.  With
        ``knobs_only`` only the values of the knobs both have are asked (a config of another
        version of the space, which had other knobs).  Feasibility is not asked: a record
        read back is checked against the knobs its template has."""
        values = config.as_dict()
        unknown = sorted(set(values) - set(self.names))
        if unknown and not knobs_only:
            return f"unknown knob {unknown[0][:40]!r}"
        missing = sorted(set(self.names) - set(values))
        if missing and not knobs_only:
            return f"knob {missing[0]} missing"
        for knob in self.knobs:
            if knob.name not in values:
                continue
            value = values[knob.name]
            if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in knob.choices):
                return f"{knob.name}={str(value)[:40]} is not a choice"
        return None

    def infeasible_reason(self, config: Config) -> str | None:
        for constraint in self.constraints:
            reason = constraint(config)
            if reason:
                return reason
        return None

    def is_feasible(self, config: Config) -> bool:
        return self.infeasible_reason(config) is None

    def random_indices(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` uniformly drawn index vectors, shape (count, genes)."""
        return rng.integers(0, self.cardinalities, size=(count, len(self.knobs)))

    def random_feasible_indices(self, rng: np.random.Generator, count: int,
                                max_draws: int = 10_000) -> np.ndarray:
        """Up to ``count`` distinct feasible index vectors by rejection sampling."""
        found: dict[tuple[int, ...], None] = {}
        draws = 0
        while len(found) < count and draws < max_draws:
            batch = self.random_indices(rng, max(count, 64))
            draws += len(batch)
            for row in batch:
                key = tuple(int(v) for v in row)
                if key not in found and self.is_feasible(self.decode(key)):
                    found[key] = None
                    if len(found) == count:
                        break
        return np.array(list(found), dtype=np.int64).reshape(-1, len(self.knobs))

    def __iter__(self) -> Iterator[Config]:
        """Every config in index order (feasible or not)."""
        for flat in np.ndindex(*self.cardinalities):
            yield self.decode(flat)

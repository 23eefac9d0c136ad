"""An XGBoost cost model: ranks candidates of a workload before they are measured.

Training target: throughput normalized per workload (the workload's fastest known
config = 1.0, a failed run = 0), so records of different shapes share one scale.  The
model is retrained from scratch each time it is asked to (records grow by a batch per
generation; a few hundred rows train in tens of milliseconds).

Transfer: records of *other shapes* of the same template on the same target train a
base booster first; the current workload's model continues boosting from it
(``xgb_model=``), so the first ranking is informed before anything of this shape
was measured, and its own records correct the base as they arrive.
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from scipy.stats import spearmanr

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.records import Record
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo
from tvm_ext.operators import template_of
from tvm_ext.core.template import Template

from .features import Featurizer


@dataclass(frozen=True)
class ModelSettings:
    """XGBoost hyper-parameters (chosen for a few dozen to a few thousand rows)."""

    rounds: int = 120  # boosting rounds per fit (transfer base: the same)
    max_depth: int = 5
    eta: float = 0.15
    subsample: float = 0.9
    colsample_bytree: float = 0.9
    min_child_weight: float = 1.0
    reg_lambda: float = 1.0
    objective: str = "reg:squarederror"
    nthread: int = 1  # tiny data: threads cost more in synchronisation than they save
    min_train: int = 8  # records of this workload before the model is trusted without transfer


def normalized_throughput(costs: np.ndarray) -> np.ndarray:
    """best/cost per row (1.0 = the fastest known), 0 for failed (+inf) runs."""
    costs = np.asarray(costs, dtype=np.float64)
    ok = np.isfinite(costs) & (costs > 0)
    if not ok.any():
        return np.zeros_like(costs)
    best = costs[ok].min()
    return np.where(ok, best / np.where(ok, costs, 1.0), 0.0)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when undefined."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):  # constant: no ranking to correlate
        return math.nan
    return float(spearmanr(x, y).statistic)


class XGBCostModel:
    """Predicts normalized throughput of configs of one workload (higher = faster)."""

    def __init__(self, template: Template, target: TargetInfo, settings: ModelSettings | None = None,
                 seed: int = 0, ptxas: Any = None):
        self.template = template
        self.target = target
        self.settings = settings or ModelSettings()
        self.seed = seed
        self.featurizer = Featurizer(template, target, ptxas)
        self._current: dict[Config, float] = {}
        self._transfer: list[tuple[np.ndarray, np.ndarray]] = []  # (X, y) per other workload
        self.base: Any = None  # booster trained on other shapes only
        self.booster: Any = None
        self.trained_on = 0  # rows of this workload in the last fit
        self.fill_ptxas = False  # compute missing ptxas features before ranking (slow, CUDA only)
        self.ptxas_workers: int | None = None

    # ---- data ------------------------------------------------------------------------------
    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.featurizer.names

    @property
    def n_current(self) -> int:
        return len(self._current)

    @property
    def ready(self) -> bool:
        """Whether predictions mean anything: a fitted model (own records or transfer)."""
        return self.booster is not None

    def observe(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        """Measured costs (seconds, +inf = failed) of this workload's configs."""
        for cfg, cost in zip(configs, costs):
            self._current[cfg] = float(cost)

    def forget_observations(self) -> None:
        """Drop this workload's observations (for a caller that refits from its own list)."""
        self._current.clear()

    def add_records(self, records: Iterable[Record], workload_key: str) -> int:
        """Take records of a store: this workload's become observations, other shapes of the
        same template on the same target become transfer data.  Returns transfer rows added."""
        by_workload: dict[str, list[Record]] = defaultdict(list)
        target_key = self.target.key()
        for rec in records:
            if rec.workload.get("template") != self.template.name or rec.workload.get("target") != target_key:
                continue
            by_workload[rec.workload_key].append(rec)
        added = 0
        for key, recs in by_workload.items():
            if key == workload_key:
                space = self.featurizer.space
                for r in recs:
                    try:
                        self._current[space.make(**space.completed(r.config))] = r.cost
                    except TvmExtError:
                        continue  # a knob was renamed or removed since the record
                continue
            added += self._add_transfer(recs)
        if added:
            self.base = None
        return added

    def _add_transfer(self, recs: list[Record]) -> int:
        other = template_of(recs[0].workload)
        if other is None:
            return 0
        feats = Featurizer(other, self.target, self.featurizer.ptxas)
        if feats.names != self.feature_names:
            return 0
        configs, costs = [], []
        for r in recs:
            try:  # a record older than a knob: the value its kernel had (``Space.completed``)
                configs.append(feats.space.make(**feats.space.completed(r.config)))
                costs.append(r.cost)
            except TvmExtError:
                continue
        if len(configs) < 2:
            return 0
        self._transfer.append((feats(configs), normalized_throughput(np.array(costs))))
        return len(configs)

    # ---- training and prediction -------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        s = self.settings
        return {"objective": s.objective, "max_depth": s.max_depth, "eta": s.eta, "subsample": s.subsample,
                "colsample_bytree": s.colsample_bytree, "min_child_weight": s.min_child_weight,
                "lambda": s.reg_lambda, "nthread": s.nthread, "seed": self.seed, "verbosity": 0}

    def _dmatrix(self, x: np.ndarray, y: np.ndarray | None = None, groups: Sequence[int] | None = None) -> Any:
        import xgboost as xgb

        d = xgb.DMatrix(x, label=y, feature_names=list(self.feature_names), missing=np.nan)
        if groups is not None:
            d.set_group(list(groups))
        return d

    def _fit_base(self) -> None:
        import xgboost as xgb

        if self.base is not None or not self._transfer:
            return
        x = np.concatenate([t[0] for t in self._transfer])
        y = np.concatenate([t[1] for t in self._transfer])
        self.base = xgb.train(self._params(), self._dmatrix(x, y, [len(t[1]) for t in self._transfer]),
                              num_boost_round=self.settings.rounds)

    def fit(self) -> bool:
        """(Re)train on everything known; False when there is nothing to learn from yet."""
        import xgboost as xgb

        self._fit_base()
        if len(self._current) < self.settings.min_train:
            self.booster = self.base
            self.trained_on = 0
            return self.booster is not None
        configs = list(self._current)
        x = self.featurizer(configs)
        y = normalized_throughput(np.array([self._current[c] for c in configs]))
        rounds = self.settings.rounds
        if self.base is not None:  # a warm start corrects the base: fewer, gentler rounds
            rounds = max(10, min(rounds, 2 * len(configs)))
        self.booster = xgb.train(self._params(), self._dmatrix(x, y, [len(y)]), num_boost_round=rounds,
                                 xgb_model=self.base)
        self.trained_on = len(configs)
        return True

    def prepare(self, configs: Sequence[Config]) -> None:
        """Before ranking: compute the ptxas features the cache lacks (when enabled)."""
        cache = self.featurizer.ptxas
        if self.fill_ptxas and cache is not None:
            cache.fill(self.template, list(configs), self.target, self.ptxas_workers)

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Predicted normalized throughput; raises if the model was never fitted."""
        if self.booster is None:
            raise TvmExtError("the cost model has not been trained")
        if not configs:
            return np.zeros(0)
        return self.booster.predict(self._dmatrix(self.featurizer(configs)))

    def train_regressor(self, x: np.ndarray, y: np.ndarray) -> Any:
        """A booster on another target ``y`` over this model's features (rows ``x`` from
        ``featurizer``), with its settings and seed: e.g. an error predicted beside the speed."""
        import xgboost as xgb

        return xgb.train(self._params(), self._dmatrix(x, y), num_boost_round=self.settings.rounds)

    def regressor_predict(self, booster: Any, x: np.ndarray) -> np.ndarray:
        """Predictions of a booster from ``train_regressor`` for feature rows ``x``."""
        return booster.predict(self._dmatrix(x))

    # ---- persistence -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """XGBoost's JSON model with our feature names and settings as attributes."""
        if self.booster is None:
            raise TvmExtError("the cost model has not been trained; nothing to save")
        path = os.fspath(path)
        self.booster.set_attr(tvm_ext_features=json.dumps(self.feature_names),
                              tvm_ext_template=self.template.name,
                              tvm_ext_settings=json.dumps(asdict(self.settings)))
        tmp = f"{path}.{os.getpid()}.tmp.json"
        self.booster.save_model(tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], template: Template, target: TargetInfo,
             seed: int = 0, ptxas: Any = None) -> "XGBCostModel":
        """A model saved by :meth:`save`, checked against this template's features."""
        import xgboost as xgb

        path = os.fspath(path)
        try:
            booster = xgb.Booster(model_file=path)
        except (xgb.core.XGBoostError, OSError) as exc:
            raise TvmExtError(f"cannot load cost model {path}: {str(exc).splitlines()[0]}") from None
        settings = ModelSettings(**json.loads(booster.attr("tvm_ext_settings") or "{}"))
        model = cls(template, target, settings, seed, ptxas)
        saved = tuple(json.loads(booster.attr("tvm_ext_features") or "[]"))
        if saved != model.feature_names or booster.attr("tvm_ext_template") != template.name:
            raise TvmExtError(f"cost model {path} was trained for other features or another template")
        model.booster = model.base = booster
        return model


def model_path(records_path: str | os.PathLike[str]) -> str:
    """Where the model of a records file lives: ``RECORDS.xgb.json`` beside it."""
    from tvm_ext.core.records import side_file

    return side_file(records_path, "model")

"""The predictor of method 003's S6 for mixed-precision programs.

Two XGBoost regressors on the same features (each precision parameter's mantissa
bits, how many were lowered, the shape): the tuning core's ``XGBCostModel`` for
speed (normalized throughput, like every search here) and one for the error
(log10 of the measured relative error).  A candidate predicted to exceed the error
bound scores below every candidate predicted to respect it; among those, the
faster the better.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo

from .model import ModelSettings, XGBCostModel

ERROR_FLOOR = 1e-12  # errors below this are "exact" for the model


class PrecisionPredictor:
    """Scores mixed-precision configs (higher = better) from what was measured so far."""

    def __init__(self, program: Any, target: TargetInfo, error_bound: float, seed: int = 0,
                 settings: ModelSettings | None = None):
        self.error_bound = error_bound
        self.settings = settings or ModelSettings(min_train=6)
        self.speed = XGBCostModel(program, target, self.settings, seed)
        self.seed = seed
        self.error_booster: Any = None

    def fit(self, configs: Sequence[Config], costs: Sequence[float], errors: Sequence[float]) -> bool:
        self.speed.forget_observations()
        self.speed.observe(configs, costs)
        if not self.speed.fit():
            return False
        ok = [(c, e) for c, cost, e in zip(configs, costs, errors) if math.isfinite(cost) and math.isfinite(e)]
        self.error_booster = None
        if len(ok) >= self.settings.min_train:
            x = self.speed.featurizer([c for c, _ in ok])
            y = np.log10(np.maximum([e for _, e in ok], ERROR_FLOOR))
            self.error_booster = self.speed.train_regressor(x, y)
        return True

    def predicted_error(self, configs: Sequence[Config]) -> np.ndarray:
        if self.error_booster is None:
            return np.zeros(len(configs))
        x = self.speed.featurizer(list(configs))
        return 10.0 ** self.speed.regressor_predict(self.error_booster, x)

    def score(self, configs: Sequence[Config]) -> np.ndarray:
        speed = self.speed.predict(list(configs))
        over = self.predicted_error(configs) > self.error_bound
        return np.where(over, speed - 10.0, speed)

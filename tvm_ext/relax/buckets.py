"""A symbolic dimension tuned at buckets of its size and dispatched on it at run time.

A Relax function whose inputs have a symbolic dimension (tokens, a sequence length) gets no
tuned kernel: our templates take static shapes, as meta_schedule does, so every function falls
back to dlight.  ``tune_buckets`` binds the dimension to each bucket size
(``relax.transform.BindSymbolicVars``) and tunes that static model like any other, all buckets
into one records file and database.  The best config of every call at every bucket goes to
``BUCKETS_FILE`` beside the database, keyed by the call's place among the function's
``call_tir`` bindings: the same graph lowers to the same calls in the same order at every size,
while the callees' names shift (two calls whose functions are identical at one size share one
function there and not at another).  ``BucketedModel`` dispatches each call on the dimension's
size: a size is compiled once and kept; its functions are scheduled by the database where that
size was tuned, else by a bucket's config the template accepts at this size, refitted by the
template where needed (the nearest bucket by ratio first: ``Buckets.nearest``) and resized for
this size (``Template.resized``: a wgmma pipeline shallow enough for more blocks than SMs to share
them), else by dlight.
``BucketedModel.schedules`` says which, per function.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..core.errors import TvmExtError
from ..core.space import Config
from ..target import TargetInfo

BUCKETS_FILE = "tvm_ext_buckets.json"  # in the database folder: the buckets and each call's configs
COMPILED_KEPT = 8  # sizes a BucketedModel keeps compiled
Borrowed = Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]]  # function -> (bucket, config), tried in order


@dataclass(frozen=True)
class Buckets:
    """The sizes a symbolic dimension (``var``, by name) is tuned at."""

    var: str
    sizes: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> "Buckets":
        """``NAME=S1,S2,...`` (``n=1,16,128,512``): sizes are positive integers, sorted here."""
        name, eq, values = text.partition("=")
        if not eq or not name.strip().isidentifier():
            raise TvmExtError(f"buckets {text!r}: expected NAME=SIZE,SIZE,... (e.g. n=1,16,128)")
        try:
            sizes = sorted({int(v) for v in values.split(",") if v.strip()})
        except ValueError:
            raise TvmExtError(f"buckets {text!r}: sizes must be integers") from None
        if not sizes or sizes[0] < 1:
            raise TvmExtError(f"buckets {text!r}: give at least one size, each at least 1")
        return cls(name.strip(), tuple(sizes))

    def nearest(self, size: int) -> tuple[int, ...]:
        """The buckets whose configs a size borrows, in the order tried: nearest by ratio first (a
        tile's count of blocks, what its choice weighs, scales with the rows), the larger of two as
        near.  Kernels guard the rows a tile has past the size, so a smaller bucket's config serves
        as well as a larger one's."""
        return tuple(sorted(self.sizes, key=lambda b: (abs(math.log(b / size)), -b)))


def symbolic_vars(mod: Any, function: str | None = None) -> dict[str, list[tuple[int, int]]]:
    """Each symbolic dimension of the function's inputs by name: (input, axis) where it appears."""
    from .relax_opencl import relax_function_name

    func = mod[relax_function_name(mod, function)]
    found: dict[str, list[tuple[int, int]]] = {}
    for i, param in enumerate(func.params):
        shape = getattr(getattr(param, "ty", None), "shape", None)
        for axis, dim in enumerate(getattr(shape, "values", None) or ()):
            if not hasattr(dim, "value"):
                found.setdefault(str(dim), []).append((i, axis))
    return found


def specialize(mod: Any, var: str, size: int) -> Any:
    """``mod`` with the symbolic dimension ``var`` bound to ``size`` everywhere."""
    from tvm import relax

    return relax.transform.BindSymbolicVars({var: size})(mod)


def check_buckets(mod: Any, buckets: Buckets, function: str | None = None) -> None:
    """A clear error unless ``buckets.var`` is the function's one symbolic dimension."""
    names = sorted(symbolic_vars(mod, function))
    if buckets.var not in names:
        raise TvmExtError(f"buckets for {buckets.var!r}, but the model's symbolic dimensions are "
                          f"{', '.join(names) or 'none'}")
    if len(names) > 1:
        raise TvmExtError(f"the model has symbolic dimensions {', '.join(names)}; buckets bind one")


# ---- tuning -------------------------------------------------------------------------------------
def tune_buckets(mod: Any, target: TargetInfo, records: str, database: str, buckets: Buckets,
                 tune: Callable[[Any], Any], without: Collection[str] = (), function: str | None = None,
                 gru_storage: str | None = None) -> list[Any]:
    """``tune(static_module)`` (``tune_relax`` with the caller's settings) at each bucket size,
    then the best config of every call and every GRU layer (by their order) at every bucket into
    ``BUCKETS_FILE``; the results in bucket order (a stopped run stops there, its configs so far
    written)."""
    from ..core.records import RecordStore

    from .pipeline import legalize_and_fuse
    from .relax_gru import find_grus
    from .tvm_export import ranked_records

    check_buckets(mod, buckets, function)
    results, calls, grus = [], {}, {}
    for size in buckets.sizes:
        static = specialize(mod, buckets.var, size)
        result = tune(static)
        results.append(result)
        lowered = legalize_and_fuse(static, target)
        store = RecordStore(records)  # what this size's tuning wrote
        best = best_configs(lowered, target, store, without)
        for place, name in enumerate(call_sites(lowered, function)):
            if name in best:
                calls.setdefault(str(place), {})[str(size)] = {"function": name, "config": best[name]}
        for place, gru in enumerate(find_grus(static, target, gru_storage)):
            ranked = ranked_records(store, gru.template, target)
            if ranked:
                grus.setdefault(str(place), {})[str(size)] = {"function": gru.var, "config": dict(ranked[0].config)}
        if getattr(result, "interrupted", False):
            break
    write_buckets(database, buckets, calls, grus)
    return results


def call_sites(lowered: Any, function: str | None = None) -> list[str]:
    """The callee of each ``call_tir`` of the Relax function, in binding order."""
    import tvm
    from tvm import relax

    from .relax_opencl import relax_function_name

    call_tir = tvm.ir.Op.get("relax.call_tir")
    names = []
    for block in lowered[relax_function_name(lowered, function)].body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                names.append(value.args[0].name_hint)
    return names


def best_configs(lowered: Any, target: TargetInfo, store: Any, without: Collection[str] = ()) -> dict[str, dict]:
    """Each matched function of a lowered static model with its template's best record: name -> config."""
    import tvm

    from .tasks import match_task
    from .tvm_export import ranked_records

    best = {}
    for gv, func in lowered.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            match = match_task(gv.name_hint, as_task(func), target, without)
            ranked = ranked_records(store, match, target) if match.matched else []
            if ranked:
                best[gv.name_hint] = dict(ranked[0].config)
    return best


def accepted(space: Any, values: Mapping[str, Any],
             fitted: Callable[[Config], Config] | None = None) -> Config | None:
    """``values`` as a config of ``space`` (knobs renamed since read as today's), refitted by
    ``fitted`` (the template's: knobs that count the tiles) where the space refuses it as it is;
    None where it refuses both: a value it does not offer, or an infeasible combination at this size.
    Knobs added since ``values`` were written take their earlier value (``Space.completed``)."""
    try:
        config = space.decode(space.encode(Config.of(space.completed(values))))
    except TvmExtError:
        return None
    reason = space.infeasible_reason(config)
    if reason and fitted is not None:
        config = fitted(config)
        reason = space.infeasible_reason(config)
    return None if reason else config


def as_task(func: Any) -> Any:
    """A module's PrimFunc as meta_schedule's task holds it (named ``main``: templates build it)."""
    return func.with_attr("global_symbol", "main")


def write_buckets(database: str, buckets: Buckets, calls: Mapping[str, Mapping[str, Any]],
                  grus: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    os.makedirs(database, exist_ok=True)
    data = {"version": 1, "var": buckets.var, "sizes": list(buckets.sizes), "calls": calls, "grus": grus or {}}
    fd, tmp = tempfile.mkstemp(dir=database, prefix=".buckets")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(database, BUCKETS_FILE))


ByPlace = dict[int, dict[int, dict]]  # call (or GRU layer) place -> bucket -> config


def read_buckets(database: str) -> tuple[Buckets, ByPlace, ByPlace]:
    """``BUCKETS_FILE`` of a database folder: the buckets, and place -> bucket -> config of the
    calls and of the GRU layers."""
    path = os.path.join(database, BUCKETS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        buckets = Buckets(str(data["var"]), tuple(int(s) for s in data["sizes"]))
        calls, grus = ({int(place): {int(size): dict(dict(entry)["config"]) for size, entry in dict(by_size).items()}
                        for place, by_size in dict(data.get(part, {})).items()} for part in ("calls", "grus"))
    except FileNotFoundError:
        raise TvmExtError(f"{database} has no {BUCKETS_FILE}: tune the model with buckets first") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TvmExtError(f"{path} is not a tvm_ext buckets file: {exc}") from None
    return buckets, calls, grus


# ---- compiling a size ----------------------------------------------------------------------------
def borrow_schedules(mod: Any, target: TargetInfo, borrowed: Borrowed,
                     without: Collection[str] = ()) -> tuple[Any, dict[str, str]]:
    """Every unscheduled function of ``borrowed`` scheduled by the first of its buckets' configs
    that its template (at this function's size) accepts and that lowers, resized for this size
    by the template (``Template.resized``); where none does, by the template's own pick at this
    size (``default_config``: no measurement).  Returns the module and, for each function of
    ``borrowed``, what schedules it: "database" (scheduled already), "bucket B" (B's config; the
    knobs resized named after it), "pick" or "dlight" (no template takes it)."""
    import tvm

    from .tasks import match_task

    how = {}
    for gv, func in list(mod.functions_items()):
        name = gv.name_hint
        if not isinstance(func, tvm.tirx.PrimFunc) or name not in borrowed:
            continue
        if func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"]):
            how[name] = "database"
            continue
        how[name] = "dlight"
        func = as_task(func)
        match = match_task(name, func, target, without)
        if not match.matched:
            continue
        space = match.template.space(target)
        for bucket, values in borrowed[name]:
            try:
                config = accepted(space, values, match.template.fitted)  # None where this size cannot take it
                if config is None:
                    continue
                resized = match.template.resized(config, target)
                scheduled = _scheduled(match, func, resized, target)
            except Exception:  # noqa: BLE001 - a config this size cannot take: the next bucket's
                continue
            mod[gv] = scheduled.without_attr("global_symbol")  # private again, as the module had it
            before, after = config.as_dict(), resized.as_dict()
            changed = [f"{k} {after[k]}" for k in sorted(after) if before.get(k) != after[k]]
            how[name] = f"bucket {bucket}" + (f" ({', '.join(changed)} here)" if changed else "")
            break
        else:  # no bucket's config fits this size (e.g. K split where M is ragged): the template's pick
            try:
                mod[gv] = _scheduled(match, func, match.template.default_config(target), target) \
                    .without_attr("global_symbol")
                how[name] = "pick"
            except Exception:  # noqa: BLE001 - no config of the template at this size: dlight's
                pass
    return mod, how


def _scheduled(match: Any, func: Any, config: Any, target: TargetInfo) -> Any:
    """``func`` (a matched task) scheduled by ``config`` of its template: the template's kernel in
    its place where the matcher substitutes, else the config's schedule replayed on it."""
    import tvm

    from .tasks import MATCHERS
    from .tvm_export import replay

    if match.substitutes:
        return MATCHERS[match.matcher].substitute(func, match.template, match.site, config, target)
    return replay(match, config, tvm.IRModule({"main": func}), target).mod["main"].with_attr("tirx.is_scheduled", True)


class BucketedModel:
    """A model with a symbolic dimension, run at any size: each call dispatched on the size to its
    compiled model (compiled on the size's first call and kept, the last ``COMPILED_KEPT`` sizes),
    scheduled from the database and the buckets' configs (``read_buckets``)."""

    def __init__(self, mod: Any, target: TargetInfo, database: str, function: str | None = None,
                 log: Callable[[str], None] | None = None, without: Collection[str] = (),
                 gru_storage: str | None = None):
        self.buckets, self.calls, self.grus = read_buckets(database)
        check_buckets(mod, self.buckets, function)
        self.mod, self.target, self.database, self.function = mod, target, database, function
        self.log, self.without, self.gru_storage = log, tuple(without), gru_storage
        self.where = symbolic_vars(mod, function)[self.buckets.var]  # (input, axis) of the dimension
        # size -> function -> "database" | "bucket B" | "pick" | "dlight"
        self.schedules: dict[int, dict[str, str]] = {}
        self._compiled: OrderedDict[int, Any] = OrderedDict()

    def size_of(self, inputs: Sequence[np.ndarray]) -> int:
        sizes = {int(np.shape(inputs[i])[axis]) for i, axis in self.where if i < len(inputs)}
        if len(sizes) != 1:
            raise TvmExtError(f"inputs give {self.buckets.var} = {sorted(sizes) or 'nothing'}: one size expected")
        (size,) = sizes
        if size < 1:
            raise TvmExtError(f"{self.buckets.var} = {size}: at least 1")
        return size

    def model(self, size: int) -> Any:
        """The compiled model at ``size`` (compiled on first use)."""
        from ..measure.cases import kept

        return kept(self._compiled, size, lambda: self._compile(size), COMPILED_KEPT)

    def _compile(self, size: int) -> Any:
        from .pipeline import CompiledModel, apply_tuned, schedule_rest

        static = specialize(self.mod, self.buckets.var, size)
        tuned = apply_tuned(static, self.target, self.database, self.log, self.without, self.gru_storage,
                            gru_fallback=self._gru_configs(static, size))
        borrowed: dict[str, list[tuple[int, dict]]] = {}
        for place, name in enumerate(call_sites(tuned, self.function)):  # a function called twice: its first call's
            by_size = self.calls.get(place, {})
            if name not in borrowed and by_size:
                borrowed[name] = [(b, by_size[b]) for b in self.buckets.nearest(size) if b in by_size]
        tuned, how = borrow_schedules(tuned, self.target, borrowed, self.without)
        self.schedules[size] = {**how, **self.schedules[size]}  # the GRU layers' entries made by apply_tuned
        return CompiledModel(schedule_rest(tuned, self.target, self.log), self.target, self.function)

    def _gru_configs(self, static: Any, size: int) -> Callable[[Any], Config | None]:
        """The GRU layers' configs at ``size`` where the database has none: each layer's nearest
        bucket's config that its template accepts, refitted where needed (by the layers' order);
        what each layer took goes to ``schedules`` when it is asked for ("database" where it is not)."""
        from .relax_gru import find_grus

        chosen: dict[Any, tuple[Config, str, str]] = {}  # template -> (config, layer, "bucket B")
        how = self.schedules.setdefault(size, {})
        for place, gru in enumerate(find_grus(static, self.target, self.gru_storage)):
            how[f"{gru.template.name} {gru.var}"] = "database"
            space = gru.template.space(self.target)
            for bucket in self.buckets.nearest(size):
                values = self.grus.get(place, {}).get(bucket)
                config = None if values is None else accepted(space, values, gru.template.fitted)
                if config is not None:
                    chosen.setdefault(gru.template, (config, f"{gru.template.name} {gru.var}", f"bucket {bucket}"))
                    break

        def fallback(template: Any) -> Config | None:
            if template not in chosen:
                return None
            config, name, label = chosen[template]
            how[name] = label
            return config

        return fallback

    def __call__(self, *inputs: np.ndarray) -> Any:
        return self.model(self.size_of(inputs))(*inputs)

    def time(self, *inputs: np.ndarray, repeat: int = 10) -> float:
        return self.model(self.size_of(inputs)).time(*inputs, repeat=repeat)

"""The template interface: what an operator file in ``schedules/`` provides.

One file per operator (or one package, for an operator of several kernels) holds its TE
compute, its knobs, its schedule and its numpy reference, so a reader finds everything
about an operator in one place.  The core (builder, runner, tuner, CLI) only talks to
this interface: ``build_program``, ``measured_operator``, ``run_plan``, ``output_check``
and ``analytic_pick`` have defaults for a one-kernel operator, which an operator with a
host plan (the GRU) or a search over another operator (mixed precision) overrides.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ..measure.checks import NormwiseCheck, OutputCheck
from ..measure.program import RunPlan, UniformInputs
from ..precision.precision import cast, np_dtype
from ..measure.program import Artifact, CompiledProgram, TensorSpec, compile_schedule
from .space import Config, Space
from ..target import TargetInfo

__all__ = ["NamedBuffers", "Template", "TensorSpec", "Workload"]  # rebuilding a template by name: ``tvm_ext.operators``


OPERATOR_PACKAGES = "tvm_ext.schedules"  # an operator in a subpackage of it is hashed whole
# subpackages that group several operators (each a module): one is hashed with what it imports,
# not with its whole family, and the family's ``__init__`` is no kernel
FAMILY_PACKAGES = ("tvm_ext.schedules.gemm", "tvm_ext.schedules.reduce")


def _imported_schedule_modules(module_name: str) -> set[str]:
    """The ``tvm_ext.schedules`` modules that ``module_name``'s source imports, at any depth of
    its code (imports inside functions count: they build the kernel too)."""
    module = importlib.import_module(module_name)
    is_package = hasattr(module, "__path__")
    package = module_name if is_package else module_name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for name in targets:
            if (name == OPERATOR_PACKAGES or name.startswith(OPERATOR_PACKAGES + ".")) and _is_module(name):
                found.add(name)
    return found


def _is_module(name: str) -> bool:
    """Whether ``name`` names a module (``from .wgmma import KNOBS`` also yields ``wgmma.KNOBS``)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def schedule_modules(module_name: str) -> list[str]:
    """``module_name``, the rest of its operator package (``tvm_ext.schedules.gru``) and every
    ``tvm_ext.schedules`` module they import transitively, sorted: what a template's hash covers.
    The package ``tvm_ext.schedules`` itself (its registry) and the families' packages are left out."""
    start = {module_name}
    package = module_name.rpartition(".")[0]
    if package.startswith(OPERATOR_PACKAGES + ".") and package not in FAMILY_PACKAGES:
        folder = os.path.dirname(os.path.abspath(importlib.import_module(package).__file__))
        start |= {package} | {f"{package}.{n[:-3]}" for n in os.listdir(folder)
                              if n.endswith(".py") and n != "__init__.py"}
    seen: set[str] = set()
    todo = sorted(start)
    while todo:
        name = todo.pop()
        if name in seen or name == OPERATOR_PACKAGES or name in FAMILY_PACKAGES:
            continue
        seen.add(name)
        todo.extend(sorted(_imported_schedule_modules(name) - seen))
    return sorted(seen)


@functools.lru_cache(maxsize=None)
def modules_hash(module_name: str) -> str:
    """Hash of the sources of ``schedule_modules(module_name)``: once a process (an imported
    module's source does not change), not once a template instance (each parses its modules)."""
    source = "".join(inspect.getsource(importlib.import_module(name)) for name in schedule_modules(module_name))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class Template(ABC):
    """An operator at one shape: compute, knob space, schedule, reference.

    Instances are small and picklable: builder workers receive them.
    """

    name: ClassVar[str]

    @property
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The shape and dtype parameters that, with the template, define the workload."""

    @abstractmethod
    def space(self, target: TargetInfo) -> Space: ...

    @abstractmethod
    def default_config(self, target: TargetInfo) -> Config:
        """A reasonable hand-picked config: the baseline the tuner must beat."""

    @abstractmethod
    def schedule(self, config: Config, target: TargetInfo) -> Any:
        """Return the scheduled ``tvm.s_tir.Schedule`` for ``config``."""

    @abstractmethod
    def inputs(self) -> list[TensorSpec]: ...

    @abstractmethod
    def outputs(self) -> list[TensorSpec]: ...

    def fitted(self, config: Config) -> Config:
        """``config`` (tuned at another shape: a bucket's) with the knobs that count this shape's
        tiles refitted to it where it would refuse them; by default ``config`` itself."""
        return config

    def resized(self, config: Config, target: TargetInfo) -> Config:
        """``config`` (tuned at another shape: a bucket's; accepted at this one) changed where this
        shape's count of blocks calls for it on ``target``; by default ``config`` itself."""
        return config

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """PassContext options ``tvm.compile`` needs for ``config`` (e.g. cp.async copies are
        only emitted with ``tirx.use_async_copy``); part of what the builder compiles with."""
        return {}

    def scratch(self) -> list[TensorSpec]:
        """Intermediate buffers passed as trailing parameters (e.g. partial sums of a
        two-stage reduction): allocated by the runner, never checked."""
        return []

    @abstractmethod
    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """float64 numpy result for the given inputs."""

    input_range: ClassVar[tuple[float, float]] = (-1.0, 1.0)  # where ``make_inputs`` draws from

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Fresh random inputs, uniform in ``input_range`` (never zeros: they hide unwritten
        outputs).  A template drawing its own overrides this; the standard draw is data a
        measuring worker repeats from the seed (``measure.UniformInputs``)."""
        return UniformInputs(*self.input_range).draw(rng, self.inputs())

    @property
    def draws_uniform_inputs(self) -> bool:
        """Whether ``make_inputs`` is the standard draw (not overridden)."""
        return type(self).make_inputs is Template.make_inputs

    @property
    def case_drawn_from_seed(self) -> bool:
        """Whether a measuring worker can make this operator's inputs itself: the full-precision
        inputs are the standard draw and ``make_case`` only rounds them (an operator that
        makes its inputs otherwise, e.g. scaled and transposed into 8 bits, sends them)."""
        return self.full_precision().draws_uniform_inputs and type(self).make_case is Template.make_case

    def full_precision(self) -> "Template":
        """The all-float32 version of this operator (itself unless precision was lowered)."""
        return self

    def make_case(self, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs in this template's dtypes and the float64 reference of the full-precision
        values they were rounded from, so a lowered program's error includes the rounding
        of its inputs and weights (what a user converting fp32 data would see)."""
        full = self.full_precision()
        values = full.make_inputs(rng)
        refs = full.reference(values)
        inputs = [x if x.dtype == np_dtype(s.dtype) else cast(x, s.dtype)
                  for x, s in zip(values, self.inputs())]
        return inputs, refs

    def output_check(self, refs: list[np.ndarray]) -> OutputCheck:
        """How outputs are compared with ``refs`` (data a runner's worker applies): each
        output's normwise relative error within ``tolerance``."""
        return NormwiseCheck(self.tolerance)

    def check(self, outputs: list[np.ndarray], refs: list[np.ndarray]) -> str | None:
        """``None`` if outputs match the reference, else what is wrong."""
        return self.output_check(refs)(outputs, refs)

    tolerance: ClassVar[float] = 1e-4

    def flops(self) -> float:
        """Floating-point operations of one run (0 when speed is a bandwidth figure)."""
        return 0.0

    def bytes_moved(self) -> float:
        """The fewest bytes one run must read and write."""
        size = lambda s: int(np.prod(s.shape)) * np_dtype(s.dtype).itemsize  # noqa: E731
        return float(sum(size(s) for s in self.inputs() + self.outputs()))

    # ---- building and measuring: what the builder, the runner and the CLI ask every template ----
    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        """Every kernel of ``config`` compiled into one module, with the plan that runs it: by
        default ``schedule``'s one PrimFunc, called once with every buffer.  An operator of
        several kernels and a host plan (the GRU) compiles them all and gives its plan."""
        return compile_schedule(self.schedule(config, target), target, self.pass_config(config, target))

    def for_target(self, target: TargetInfo) -> "Template":
        """This operator as it runs on ``target`` (e.g. with the tensor-core tiles it picks
        there): what the command line tunes.  By default the template itself."""
        return self

    def measured_operator(self, config: Config) -> "Template":
        """The operator whose buffers, inputs, reference and check judge ``config``'s program:
        the template itself (a precision search's: the operator at that precision)."""
        return self

    def run_plan(self, config: Config, artifact: Artifact) -> RunPlan:
        """How ``config``'s program is run and timed beyond its launches: the device's timer,
        inputs rotated when they fit in L2, no failure flag, no stage times."""
        return RunPlan()

    # whether ``default_config`` is a pick made without measuring (the wgmma GEMMs' tile picks):
    # then it is the template's ``analytic_pick`` too
    default_is_pick: ClassVar[bool] = False

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str] | None:
        """A config chosen without measuring and why (``--strategy analytic``), or None when
        the template has no rule of its own (the analytic GEMM tile selection of
        ``cost_model.analytic`` applies)."""
        if self.default_is_pick:
            config = self.default_config(target)
            return config, f"{self.name}: its default config, a tile picked without measuring"
        return None

    def known_good(self, target: TargetInfo) -> list[Config]:
        """Configs measured best on this kind of device at other shapes, feasible here: more
        seeds for a search (none by default)."""
        return []

    @cached_property
    def source_hash(self) -> str:
        """Hash of the template's source file (every file of its package for an operator that is
        a package, ``tvm_ext.schedules.gru``) and of every ``tvm_ext.schedules`` module those
        import, however deep: an edit of a kernel the template builds on (the wgmma kernel
        under the 3xTF32 template) invalidates old records as an edit of the template does."""
        return modules_hash(inspect.getmodule(type(self)).__name__)

    def describe(self) -> str:
        shown = {k: v for k, v in self.params.items() if not (k.endswith("_dtype") and v == "float32")}
        return f"{self.name} " + " ".join(f"{k}={v}" for k, v in shown.items())

    def shown_knobs(self, config: Config) -> tuple[str, ...]:
        """The knobs that change the kernel of ``config``: summaries print only these
        (a template hides e.g. the knobs of a kernel the config does not use)."""
        return tuple(name for name, _ in config.items)


class NamedBuffers:
    """Mixin for a template of several kernels whose buffers are named specs (``input_specs``,
    ``output_specs``, ``scratch_specs``; the GRU's, the LSTM's): the plan's buffers by name and the
    template's inputs, outputs and scratch in that order."""

    def buffers(self) -> dict[str, TensorSpec]:
        """Every buffer of the plan by name: inputs, outputs, then scratch."""
        return {**self.input_specs(), **self.output_specs(), **self.scratch_specs()}  # type: ignore[attr-defined]

    def inputs(self) -> list[TensorSpec]:
        return list(self.input_specs().values())  # type: ignore[attr-defined]

    def outputs(self) -> list[TensorSpec]:
        return list(self.output_specs().values())  # type: ignore[attr-defined]

    def scratch(self) -> list[TensorSpec]:
        return list(self.scratch_specs().values())  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Workload:
    """Everything that changes the kernel: the cache key of a record."""

    template: str
    params: tuple[tuple[str, Any], ...]
    target: tuple[tuple[str, Any], ...]
    tvm_version: str
    template_hash: str

    @classmethod
    def of(cls, template: Template, target: TargetInfo) -> "Workload":
        import tvm

        return cls(
            template=template.name,
            params=tuple(sorted((k, _plain(v)) for k, v in template.params.items())),
            target=tuple(sorted(target.key().items())),
            tvm_version=str(tvm.__version__),
            template_hash=template.source_hash,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "params": dict(self.params),
            "target": dict(self.target),
            "tvm_version": self.tvm_version,
            "template_hash": self.template_hash,
        }

    @property
    def key(self) -> str:
        blob = json.dumps(self.as_json(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value

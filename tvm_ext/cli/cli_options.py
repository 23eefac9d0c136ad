"""The options of ``python -m tvm_ext.tune``, each declared once, and the named groups its
subcommands add: ``TUNING_GROUPS`` on every tuning subcommand and ``model``, ``RUN_GROUP`` and
``mixed_precision_group`` on ``mixed-precision``'s, ``RECORDS_FILE`` and ``WORKLOAD`` on the
results' subcommands.  Where a subcommand gives an option another default or help, the
variant is spelled out here with ``Option.but``, beside the option it varies."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..core.session import DEFAULT_RECORDS, RUNNERS, STRATEGIES


@dataclass(frozen=True)
class Option:
    """One command-line option: its flags (or positional name) and ``add_argument``'s keywords."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any]

    def but(self, **changes: Any) -> "Option":
        """This option with other keywords (a subcommand's own default or help)."""
        return replace(self, settings={**self.settings, **changes})

    def add_to(self, container: Any) -> argparse.Action:
        """Add it to a parser or an argument group."""
        return container.add_argument(*self.flags, **self.settings)


def option(*flags: str, **settings: Any) -> Option:
    return Option(flags, settings)


@dataclass(frozen=True)
class OptionGroup:
    """Options listed under one title in a subcommand's ``--help``."""

    title: str
    options: tuple[Option, ...]

    def add_to(self, parser: argparse.ArgumentParser) -> Any:
        group = parser.add_argument_group(self.title)
        for opt in self.options:
            opt.add_to(group)
        return group


def add_groups(parser: argparse.ArgumentParser, *groups: OptionGroup) -> None:
    for group in groups:
        group.add_to(parser)


# ---- options several subcommands take --------------------------------------------------------------
TARGET = option("--target", default="opencl",
                help="opencl (default: any OpenCL device, PoCL on a CPU) or cuda")
DEVICE = option("--device", type=int, default=0, help="device index (default 0)")
SEED = option("--seed", type=int, default=0, help="random seed: same seed, same search (default 0)")
RECORDS = option("--records", default=DEFAULT_RECORDS,
                 help=f"JSON-lines records file, resumed if present (default {DEFAULT_RECORDS})")
WORKERS = option("--workers", type=int, default=None, help="parallel build processes (default: all cores)")
BUILD_TIMEOUT = option("--build-timeout", type=float, default=120.0, help="seconds per build (default 120)")
RUN_TIMEOUT = option("--run-timeout", type=float, default=60.0, help="seconds per measurement (default 60)")
NG = option("--ng", type=int, default=None, help="candidates bred per generation (default 16 x nm)")
NM = option("--nm", type=int, default=None, help="candidates measured per generation (default population/2)")
EXPLORE = option("--explore", type=float, default=0.2,
                 help="share of nm picked at random instead of by the model (default 0.2)")
JSON = option("--json", action="store_true",
              help="print the final result as JSON on stdout (progress and notes stay on stderr)")
RECORDS_FILE = option("records", metavar="RECORDS", help="JSON-lines records file")  # the results' input
WORKLOAD = option("--workload", default=None,
                  help="a workload key (or its first characters) or words of its description, e.g. "
                       "'gemm m=256' (default: every workload)")
OUT = option("--out", help="folder to write")

# ---- every tuning subcommand (one per operator, and ``model``) ------------------------------------
TUNING = OptionGroup("tuning", (
    TARGET,
    DEVICE.but(help="device index (default 0; OpenCL GPUs first)"),
    option("--strategy", default="ga", metavar="NAME",
           help=f"search strategy: {', '.join(STRATEGIES)} (default ga); analytic: the GEMM tile "
                "chosen from the hardware model (or the template's own pick), printed and measured once "
                "(--no-measure: not measured); ga+xgb is ga with --cost-model xgb"),
    option("--generations", type=int, default=6, help="GA generations (default 6)"),
    option("--population", type=int, default=12, help="GA population size (default 12)"),
    option("--tourn-size", type=int, default=None,
           help="tournament size, < population/2 (default 2, or 1 for a population of 4)"),
    option("--mutation", type=float, default=0.1, help="per-gene mutation probability (default 0.1)"),
    option("--trials", type=int, default=None, help="max kernels measured in this run (default: no cap)"),
    WORKERS,
    option("--no-overlap", action="store_true",
           help="build each generation whole, then measure it (default: a generation is built in chunks of "
                "--workers, the next chunk while the devices measure the ones before it)"),
    SEED,
    RECORDS,
    BUILD_TIMEOUT,
    RUN_TIMEOUT,
    option("--runner", default=None, metavar="NAME",
           help=f"where candidates are measured: {', '.join(RUNNERS)} (default local: this machine, "
                "an isolated process per device; rpc with --tracker or --devices)"),
    option("--runner-option", action="append", default=[], metavar="KEY=VALUE",
           help="an option of the runner, repeatable (local: devices=0,1 measures on both devices "
                "at once)"),
    option("--no-progress", action="store_true", help="no progress bar"),
    option("--no-cuda-graph", action="store_true",
           help="CUDA: time each candidate by launching it back to back (TVM's evaluator) instead of "
                "replaying it from a CUDA graph (the default: a kernel of a few microseconds is otherwise "
                "timed at the host's launch rate); the timer used is in each record's metrics"),
))
REMOTE = OptionGroup("measuring on many GPUs or hosts (--runner rpc, TVM's RPC tracker)", (
    option("--tracker", default=None, metavar="HOST:PORT",
           help="the TVM RPC tracker whose servers measure (python -m tvm_ext.worker, or stock TVM servers)"),
    option("--key", default=None, help="the servers' key at the tracker (one key per kind of device)"),
    option("--parallel", type=int, default=None,
           help="jobs in flight (default: one per server registered under the key)"),
    option("--secret-file", default=None, metavar="PATH",
           help="the shared secret that signs every message to and from the workers (default: "
                "$TVM_EXT_SECRET, else unsigned); the workers need the same one"),
    option("--devices", default=None, metavar="0,1,...",
           help="this host's devices: start a local tracker and a worker per device, measure on all of "
                "them, stop them at the end"),
))
COST_MODEL = OptionGroup("cost model (predictor stage of the GA)", (
    option("--cost-model", default="none", choices=("none", "xgb"),
           help="xgb: each generation breeds --ng candidates, an XGBoost model trained on the records "
                "ranks them and only --nm are measured; saved as RECORDS.xgb.json (default none)"),
    NG,
    NM,
    EXPLORE,
    option("--ptxas", action="store_true",
           help="CUDA: add registers/spills from nvcc's ptxas -v to the model's features "
                "(compiles each ranked candidate; cached in RECORDS.ptxas.json)"),
    option("--no-measure", action="store_true",
           help="with --strategy analytic: print the pick without measuring it (no device needed "
                "for --target cuda: H100 limits are assumed when no GPU is found)"),
))
TUNING_GROUPS = (TUNING, REMOTE, COST_MODEL)

# ---- ``mixed-precision OPERATOR``: the search's settings and where it runs -------------------------------------
DEFAULT_PROGRAM_OUT = "tvm_ext_program"
RUN_GROUP = OptionGroup("run", (
    TARGET.but(help="opencl (default) or cuda"),
    DEVICE,
    RECORDS.but(help="records file, resumed if present"),
    OUT.but(default=DEFAULT_PROGRAM_OUT, help=f"folder for the generated program (default {DEFAULT_PROGRAM_OUT})"),
    WORKERS,
    BUILD_TIMEOUT.but(default=300.0, help="seconds per build (default 300)"),
    RUN_TIMEOUT.but(default=120.0, help="seconds per measurement (default 120)"),
))


def mixed_precision_group() -> OptionGroup:
    """The mixed-precision search's settings (the "method 003" group), their defaults
    ``MixedPrecisionSettings``' (imported when a parser is built)."""
    from ..precision.mixed_precision import MixedPrecisionSettings

    d = MixedPrecisionSettings()
    return OptionGroup("method 003", (
        option("--error-bound", "--eb", type=float, default=d.error_bound,
               help=f"largest relative error accepted (eb, default {d.error_bound:g})"),
        option("--m", type=int, default=d.max_measurements, help=f"max measurements (default {d.max_measurements})"),
        option("--nf", type=int, default=d.max_stages, help=f"max stages kept by S3 (default {d.max_stages})"),
        option("--n0", type=int, default=d.population, help=f"population size (default {d.population})"),
        NG.but(default=d.generated, help=f"configs generated per round (default {d.generated})"),
        NM.but(default=d.measured, help=f"configs measured per round (default {d.measured})"),
        option("--u0", type=float, default=d.mutation, help=f"mutation probability (default {d.mutation:g})"),
        EXPLORE.but(default=d.explore,
                    help=f"share of nm drawn at random instead of by the predictor (default {d.explore:g})"),
        option("--predictor", default="xgb", choices=("xgb", "none"),
               help="S6 predictor: xgb (speed and error models) or none (random nm of ng)"),
        option("--dtypes", default="",
               help="the low precision types to try besides float32, comma-separated from float16, "
                    "bfloat16, float64 and, for a GEMM's A and B on Hopper, float8_e4m3fn and float8_e5m2 "
                    "(default: the target's 16-bit types and, where the 8-bit GEMM runs, the 8-bit ones)"),
        SEED.but(help="random seed (default 0)"),
    ))

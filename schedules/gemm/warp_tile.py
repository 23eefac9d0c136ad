"""The sizes both tensor-core tiles (mma.sync and WMMA) derive the same way: a block of
warps_m x warps_n warps, each holding frags_m x frags_n accumulator fragments of 16 x 16,
stepping k_frags fragments of 16 along K."""
from __future__ import annotations

FRAG = 16  # fragment edge (m = n = k) for 16-bit operands
WARP = 32


class WarpGridSizes:
    """Derived sizes for a frozen dataclass with the five fields below (elements)."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int

    @property
    def block_m(self) -> int:
        return self.warps_m * self.frags_m * FRAG

    @property
    def block_n(self) -> int:
        return self.warps_n * self.frags_n * FRAG

    @property
    def block_k(self) -> int:
        return self.k_frags * FRAG

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return self.warps * WARP

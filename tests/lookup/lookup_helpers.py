"""Shared helpers of the tests of :mod:`kernels.lookup` (imported by its test modules)."""

from __future__ import annotations

import torch

from kernels.lookup import lookup_gather_naive


F64 = torch.float64


HALF = (torch.float16, torch.bfloat16)


def _draw(n: int, h: int, tau: int, d_out: int, seed: int = 0, dtype=F64, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, h * tau, generator=gen, dtype=dtype)
    tables = torch.randn(h, 2**tau, d_out, generator=gen, dtype=dtype)
    return z, tables


# Half-width tables (float16 / bfloat16, float32 accumulation). Two independent checks:
# (1) against the literal formula (lookup_gather_naive in float64) on the *rounded* tables:
#     only float32 arithmetic differs, so the float32 tolerance of the kernel tests applies;
# (2) against the float32 tables, with the closed-form bound of rounding each entry once:
#     |T - round(T)| <= u |T| + a, u = 2**-11 (float16; a = 2**-25 for entries below its
#     normal range 2**-14, where the spacing is 2**-24) or 2**-8 (bfloat16, a = 0 at these
#     magnitudes), so |y - y32| <= sum_k w_k (u |[T_k]_g| + a), plus float32 accumulation.
_UNIT = {torch.float16: (2.0**-11, 2.0**-25), torch.bfloat16: (2.0**-8, 0.0)}


def _rounding_bound(z: torch.Tensor, tables: torch.Tensor, dtype, scaled: bool) -> torch.Tensor:
    """Entrywise bound on |y(rounded tables) - y(tables)|, computed in float64 from the
    literal gather of |T| (lookup_gather_naive with |T| and unit weights' absolute values)."""
    u, a = _UNIT[dtype]
    z64, t64 = z.double(), tables.double()
    w_abs_rows = lookup_gather_naive(z64, t64.abs(), scaled).abs()  # sum_k w_k |[T_k]_g| (w_k >= 0)
    w_sum = lookup_gather_naive(z64, torch.ones_like(t64), scaled).abs()  # sum_k w_k
    return u * w_abs_rows + a * w_sum


# ------------------------------------------------------------ crashes of the compiled path
# Each case runs in a child process: before the checks in front of the C++ kernels, the
# first killed the interpreter with SIGFPE (a division by the number of tables) and the
# second read out of bounds (blocks no longer matching in_features).
def _isolated_errors(code: str) -> list[str]:
    from isolated import describe, run_isolated

    proc = run_isolated(code)
    assert proc.returncode == 0, describe(proc)
    return [line for line in proc.stdout.splitlines() if line]

"""Property-based checks of the compiled C++ paths, run in a child process by
``tests/test_properties.py::test_compiled_paths_in_a_subprocess`` (a crash in the
kernels then fails that test instead of killing pytest). Not collected by pytest itself.

Every case either agrees with the package's pure-torch path or raises a
``ValueError``/``TypeError`` naming the argument (``RuntimeError`` from the compiled
module's own argument checks when it is called directly); NaN/Inf inputs are documented
to give unspecified values, so for them only the shape is checked.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import configuration as _hypothesis_configuration
from hypothesis import strategies as st

from strategies import check_clear, near, size  # tests/ is on the child's PYTHONPATH

from kernels import _ext
from kernels.hadamard import BHProjection, bh_project_fused, fwht, fwht_torch
from kernels.lookup import (
    LookupFFN,
    gather_fused,
    lookup_bh_forward_fused,
    lookup_forward_fused,
    lookup_gather,
    quantize_tables,
)

# Hypothesis keeps small caches (no example database here): outside the repository.
_hypothesis_configuration.set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "nnk-hypothesis")
SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
DTYPES = (torch.float32, torch.float64, torch.float64, torch.float16, torch.int64)
#: The dtype most tensors of one example share (a mixed pair now and then).
BASE = st.sampled_from((torch.float32, torch.float64, torch.float64, torch.float16))


@st.composite
def tensors(draw, shape, dtypes=DTYPES, special=True, dtype=None):
    if dtype is None or draw(st.integers(0, 5)) == 5:
        dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    else:
        x = torch.randint(-3, 4, shape, generator=gen, dtype=dtype)
    if len(shape) >= 2 and draw(st.integers(0, 3)) == 3:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if special and x.is_floating_point() and x.numel() and draw(st.integers(0, 7)) == 7:
        x = x.clone()
        x[tuple(int(i) for i in torch.unravel_index(torch.tensor(draw(st.integers(0, x.numel() - 1))), x.shape))] = draw(st.sampled_from([math.nan, math.inf]))
    return x


def finite(*ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


def close(a: torch.Tensor, b: torch.Tensor, *inputs: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if finite(*inputs):
        tol = 1e-3 if a.dtype == torch.float32 else 1e-8
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@SETTINGS
@given(data=st.data(), n=st.integers(0, 20), h=size(3), tau=size(4),
       d_out=size(4), scaled=st.booleans())
def prop_lookup_forward_fused(data, n, h, tau, d_out, scaled) -> None:
    dt = data.draw(BASE)
    z = data.draw(tensors(dtype=dt, shape=(n, h * data.draw(near(tau)))))
    tables = data.draw(tensors(dtype=dt, shape=(data.draw(near(h)), 2**tau if data.draw(st.integers(0, 5)) else 3, d_out),
                               special=False))
    try:
        y = lookup_forward_fused(z, tables, scaled)
    except Exception as exc:  # noqa: BLE001
        check_clear(exc, "z", "tables")
        return
    # float16/bfloat16 tables are widened exactly to z's float32 by the kernel
    close(y, lookup_gather(z, tables.to(z.dtype), scaled), z)


@SETTINGS
@given(data=st.data(), n=st.integers(0, 20), h=size(3), tau=size(4), d_out=size(4),
       scales_case=st.sampled_from(["ok", "ok", "ok", "none", "shape", "dtype", "strided", "list"]))
def prop_int8_tables(data, n, h, tau, d_out, scales_case) -> None:
    """Int8 tables with their scales through the fused forward and gather: the result of
    the literal formula on q * scale, or a clear error naming the argument."""
    dt = data.draw(st.sampled_from((torch.float32, torch.float32, torch.float64)))
    z = data.draw(tensors(dtype=dt, shape=(n, h * data.draw(near(tau)))))
    master = torch.randn(data.draw(near(h)), 2**tau, d_out, generator=torch.Generator().manual_seed(n + d_out))
    try:
        q, scales = quantize_tables(master)
    except Exception as exc:  # noqa: BLE001  (tau = 0 or d_out = 0: not a table)
        check_clear(exc, "tables")
        return
    if scales_case == "none":
        scales = None
    elif scales_case == "shape":
        scales = scales[:, :-1] if scales.shape[1] > 1 else scales.repeat(1, 2)
    elif scales_case == "dtype":
        scales = scales.double()
    elif scales_case == "strided" and scales.numel() > 1:
        scales = torch.cat([scales, scales], 1)[:, ::2]
    elif scales_case == "list":
        scales = scales.tolist()
    calls = [lambda: lookup_forward_fused(z, q, True, scales=scales)]
    if z.dtype == torch.float32 and z.shape[-1] == q.shape[0] * tau and q.shape[0] == h:
        codes = torch.randint(0, 2**tau, (n, h), generator=torch.Generator().manual_seed(n))
        weights = torch.rand(n, h, generator=torch.Generator().manual_seed(n + 1))
        calls.append(lambda: gather_fused(codes, weights, q, scales=scales))
    for i, call in enumerate(calls):
        try:
            y = call()
        except Exception as exc:  # noqa: BLE001
            check_clear(exc, "z", "tables", "scales", "codes", "weights")
            continue
        wide = q.to(torch.float64) * torch.as_tensor(scales, dtype=torch.float64)[..., None]
        if i == 0:
            close(y, lookup_gather(z, wide.to(z.dtype)), z)
        else:
            close(y, (weights.unsqueeze(-1) * wide.float()[torch.arange(h), codes]).sum(1), weights)


@SETTINGS
@given(data=st.data(), d_in=st.sampled_from([16, 20, 32, 48]), h=st.integers(1, 3),
       tau=st.integers(1, 4), n=st.integers(0, 20), cut=st.sampled_from([None, 0, 2, 3, 4]))
def prop_bh_kernels(data, d_in, h, tau, n, cut) -> None:
    dt = data.draw(BASE)
    layer = LookupFFN(d_in, h, tau, block=16, generator=torch.Generator().manual_seed(n),
                      dtype=data.draw(st.sampled_from([torch.float32, torch.float64])))
    proj = layer.projection
    if cut is not None:  # a user edits the blocks out of shape
        proj.blocks = torch.nn.Parameter(proj.blocks.detach().narrow(cut, 0, 1).clone())
    x = data.draw(tensors(dtype=dt, shape=(n, data.draw(near(d_in)))))
    tables = layer.tables.detach()
    cases = (
        (lambda: lookup_bh_forward_fused(x, proj, tables, layer.scaled),
         lambda: lookup_gather(proj(x), tables, layer.scaled), ("x", "blocks", "projection")),
        (lambda: bh_project_fused(x, proj), lambda: proj(x), ("x", "blocks")),
        (lambda: layer(x, backend="fused"), lambda: layer(x, backend="torch"), ("x", "blocks")),
    )
    for fused, reference, names in cases:
        try:
            with torch.no_grad():
                y = fused()
        except Exception as exc:  # noqa: BLE001
            check_clear(exc, *names)
            continue
        with torch.no_grad():
            close(y, reference(), x)


@SETTINGS
@given(data=st.data(), n=st.integers(0, 10), h=st.integers(1, 3), tau=st.integers(1, 3),
       d_out=st.integers(1, 4), high=st.integers(1, 10))
def prop_gather_fused(data, n, h, tau, d_out, high) -> None:
    dt = data.draw(BASE)
    codes = torch.randint(0, high, (n, data.draw(near(h))), generator=torch.Generator().manual_seed(n))
    weights = data.draw(tensors(dtype=dt, shape=(n, h)))
    tables = data.draw(tensors(dtype=dt, shape=(h, 2**tau, d_out), special=False))
    try:
        y = gather_fused(codes, weights, tables)
    except Exception as exc:  # noqa: BLE001
        check_clear(exc, "codes", "weights", "tables", "out")
        return
    ref = (weights.unsqueeze(-1) * tables[torch.arange(h), codes]).sum(1)
    close(y, ref, weights)


@SETTINGS
@given(data=st.data(), lead=st.lists(st.integers(0, 3), max_size=2),
       d=st.sampled_from([0, 1, 2, 3, 4, 8, 12, 16, 64, 2048]), normalized=st.booleans())
def prop_fwht_compiled(data, lead, d, normalized) -> None:
    dt = data.draw(BASE)
    x = data.draw(tensors(dtype=dt, shape=(*lead, d)))
    try:
        y = fwht(x, normalized, backend="compiled")
    except Exception as exc:  # noqa: BLE001
        check_clear(exc, "x")
        return
    close(y, fwht_torch(x, normalized), x)


@SETTINGS
@given(data=st.data())
def prop_direct_calls_never_crash(data) -> None:
    """The compiled module itself, called with arbitrary shapes: a result or a RuntimeError."""
    dt = data.draw(BASE)
    module = _ext.build()
    dims = st.lists(st.integers(0, 5), min_size=0, max_size=5)
    def arg():
        return data.draw(tensors(dtype=dt, shape=tuple(data.draw(dims)), special=False))
    name = data.draw(st.sampled_from(["fwht", "lookup_forward", "lookup_bh_forward", "bh_project", "gather",
                                      "int8"]))
    def int8_tables():
        shape = tuple(data.draw(dims))
        return torch.randint(-127, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(len(shape)))
    try:
        if name == "fwht":
            module.fwht(arg(), True)
        elif name == "lookup_forward":
            module.lookup_forward(arg(), arg(), True)
        elif name == "lookup_bh_forward":
            module.lookup_bh_forward(arg(), arg(), arg(), data.draw(st.integers(-1, 5)), True)
        elif name == "bh_project":
            module.bh_project(arg(), arg(), data.draw(st.integers(-1, 40)))
        elif name == "int8":  # int8 tables with scales of any shape (or none) on each entry point
            entry = data.draw(st.sampled_from(["lookup_forward", "lookup_bh_forward", "gather"]))
            scales = arg() if data.draw(st.integers(0, 3)) else None
            if entry == "lookup_forward":
                module.lookup_forward(arg(), int8_tables(), True, scales)
            elif entry == "lookup_bh_forward":
                module.lookup_bh_forward(arg(), arg(), int8_tables(), data.draw(st.integers(-1, 5)), True, scales)
            else:
                codes = torch.randint(0, 2, tuple(data.draw(dims)))
                module.gather(codes, arg(), int8_tables(), arg(), scales)
        else:
            codes = torch.randint(-2, 6, tuple(data.draw(dims)))
            module.gather(codes if data.draw(st.booleans()) else codes.clamp(0, 1), arg(), arg(), arg())
    except RuntimeError as exc:
        assert "nnk_lookup_cpu" in str(exc) or "codes" in str(exc), exc


def main() -> int:
    props = [prop_lookup_forward_fused, prop_bh_kernels, prop_gather_fused, prop_fwht_compiled, prop_int8_tables]
    assert _ext.extension_available(), "the extension must build on this platform"
    if _ext.cpp_errors_propagate():
        props.append(prop_direct_calls_never_crash)
    else:  # a toolchain mismatch: any C++ error crashes (see kernels._ext.cpp_errors_propagate)
        print("skipping prop_direct_calls_never_crash: C++ errors do not propagate here", flush=True)
    for prop in props:
        print(f"checking {prop.__name__}", flush=True)
        prop()
    print("all compiled properties hold", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

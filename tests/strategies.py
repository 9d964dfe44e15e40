"""Hypothesis strategies and checks shared by the property suites (``test_properties.py``
and its child-process half ``properties_compiled.py``)."""

from __future__ import annotations

from hypothesis import strategies as st


def size(high: int):
    """A size in 1..high, now and then 0."""
    return st.integers(0, 9).flatmap(lambda i: st.just(0) if i == 9 else st.integers(1, high))


def near(side: int):
    """A size near ``side``: mostly equal (valid calls), sometimes 0 or one more."""
    return st.integers(0, 7).flatmap(lambda i: st.just(side) if i < 6 else st.sampled_from([0, side + 1]))


def check_clear_word(exc: BaseException, *names: str) -> None:
    """:func:`check_clear` with ``names`` matched as whole words ("x" is not found in
    "instances"; "x" in "x's" and "x=" is)."""
    import re

    assert isinstance(exc, (ValueError, TypeError)), f"unclear error {type(exc).__name__}: {exc}"
    assert any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", str(exc)) for n in names), (
        f"the message names none of {names}: {exc}")


def check_clear(exc: BaseException, *names: str) -> None:
    """The error is a ValueError/TypeError whose message names one of ``names``."""
    assert isinstance(exc, (ValueError, TypeError)), f"unclear error {type(exc).__name__}: {exc}"
    assert any(name in str(exc) for name in names), f"the message names none of {names}: {exc}"


# ------------------------------------------------------------------------------- the API sweep
import inspect  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402

#: dtypes a drawn tensor may have: every kind, the meaningful ones most often.
SWEEP_DTYPES = (torch.float64, torch.float64, torch.float32, torch.float32, torch.float16,
                torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool,
                torch.complex64, torch.complex128)


def sweep_devices() -> tuple[str, ...]:
    """cpu and meta, and cuda where a GPU is present."""
    return ("cpu", "cpu", "cpu", "meta") + (("cuda",) if torch.cuda.is_available() else ())


@st.composite
def any_tensor(draw, ndim=None):
    """A tensor of any dtype kind, device (cpu, meta, cuda), rank 0-3 (sizes 0-5) and
    value class (normal, NaN, Inf, huge)."""
    if ndim is None:
        ndim = draw(st.sampled_from([1, 2, 2, 2, 3, 0]))
    shape = tuple(draw(st.sampled_from([2, 3, 4, 4, 5, 1, 0])) for _ in range(ndim))
    dtype = draw(st.sampled_from(SWEEP_DTYPES))
    device = draw(st.sampled_from(sweep_devices()))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        special = draw(st.sampled_from(["normal", "normal", "normal", "nan", "inf", "huge"]))
        if special != "normal" and x.numel():
            x.view(-1)[0] = {"nan": math.nan, "inf": math.inf, "huge": 1e30}[special]
        x = x.to(dtype)
    elif dtype == torch.bool:
        x = torch.rand(shape, generator=gen) > 0.5
    else:
        x = torch.randint(0, 4, shape, generator=gen).to(dtype)
    return x.to(device)


#: Value pools for scalar arguments, by annotation: valid values first, then junk.
INTS = (1, 2, 3, 4, 8, 0, -1, True, 2.5, "3", None)
FLOATS_ = (0.5, 1.0, 0.1, 0.0, -1.0, math.nan, math.inf, True, 1j, "1")
BOOLS = (True, False, 1, "yes")
STRS = ("relu", "erf", "gelu", "tno", "ski", "fd", "bh4", "dense", "fusion", "sparse", "linear",
        "auto", "torch", "cos", "omega", "bogus", 3, None)
DTYPES_ = (torch.float32, torch.float64, torch.int64, torch.complex64, torch.bool, "float32", None)


def modules():
    from torch import nn

    from kernels.ntk import fc_network

    return (fc_network(3, 4, 1, generator=torch.Generator().manual_seed(0)), nn.Linear(3, 4),
            nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 3)), "not a module", None)


def _pool(annotation: str, default, name: str):
    a = annotation.replace("typing.", "")
    if "Tensor" in a or a == "object" and name.startswith("x"):
        return None  # a tensor: drawn with any_tensor
    if "Generator" in a:
        return (None, torch.Generator().manual_seed(1), "seed")
    if "dtype" in a:
        return DTYPES_
    if "Module" in a or "FFN" in a or "BHProjection" in a or "Linear" in a:
        return modules()
    if "Callable" in a:
        return (lambda x: x, None, 3)
    if "bool" in a and "int" not in a:
        return BOOLS
    if "int" in a and "float" not in a:
        return INTS
    if "float" in a:
        return FLOATS_
    if "str" in a:
        return STRS
    return (None, 3, "x", [1, 2])


@st.composite
def sweep_arguments(draw, fn):
    """Keyword arguments for ``fn`` drawn by annotation: tensors of any kind for tensor
    arguments, valid and junk values for the others; defaults kept now and then."""
    kwargs = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
        has_default = p.default is not p.empty
        if has_default and draw(st.integers(0, 2)) == 0:
            continue
        pool = _pool(ann, p.default, p.name)
        if pool is None:
            if has_default and p.default is None and draw(st.integers(0, 3)) == 0:
                kwargs[p.name] = None
            else:
                kwargs[p.name] = draw(any_tensor())
        else:
            kwargs[p.name] = draw(st.sampled_from(pool))
    return kwargs

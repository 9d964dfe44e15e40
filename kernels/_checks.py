"""Argument validation at the package's public boundary.

Every public function checks its inputs with these helpers so that bad input fails
with a ``ValueError``/``TypeError`` naming the argument and what was expected,
instead of a shape error deep inside torch. Internal helpers trust their callers.

The rules (every public function of ``kernels`` follows them, and
``tests/test_properties.py`` draws dtypes, devices, shapes and values for each):

* **Tensors** must be ``torch.Tensor`` (``TypeError`` otherwise, lists and NumPy arrays
  included) on a device kernels computes on: CPU or CUDA (:mod:`kernels.device`); a
  ``meta``, ``mps`` or other tensor is refused with a ``ValueError`` naming it.
* **Data tensors** (inputs, weights, kernels, targets) must have a real floating dtype
  (float32 or float64; float16/bfloat16 where the function says so). ``bool``,
  integer and complex tensors are refused with a ``TypeError`` naming the argument.
  The one exception is ``x`` of :func:`kernels.features.softmax_features`, which may
  be complex (the random features of complex arguments that URFs are built from,
  chapter 2). Entries must be finite unless the function documents what happens to
  NaN or Inf.
* **Index tensors** (cluster labels, hash codes, token ids) must have an integer dtype;
  ``bool``, floating and complex tensors are refused (:func:`check_index_tensor`), and
  the values must lie in the documented range (``ValueError``).
* **Masks** may be bool, integer or real floating (0/1 values); complex is refused.
* **Scalars**: counts and sizes are Python/NumPy integers > 0 (``bool`` refused,
  :func:`check_positive_int`); real parameters are finite Python/NumPy reals (``bool``
  and complex refused, NaN and Inf refused, :func:`check_positive_float`,
  :func:`check_nonnegative_float`, :func:`check_real`); a 0-d real tensor on a
  supported device counts as a real. Times of gradient flow
  (:func:`kernels.ntk.mse_loss_curve`) are the exception that allows ``+inf``
  (the limit of training), see :func:`check_times`.
* **Modules and dtypes**: model arguments must be ``nn.Module`` instances
  (:func:`check_module`); ``dtype`` arguments real floating ``torch.dtype`` objects
  (:func:`check_float_dtype`), not strings. ``generator`` arguments are ``None`` or a
  ``torch.Generator`` (:func:`check_generator`), a CPU one where the draws happen on
  the CPU.
* **Inputs of a module's forward** are checked in O(1), because a forward runs in
  training loops (:func:`check_input`): a tensor with the dtype and on the device of
  the module's parameters, of shape ``(..., features)``. NaN and Inf are not scanned
  for there; they propagate as through the layer's own operations. The feature maps
  ``URFMap`` and ``ReLUMap`` have two towers and no forward: calling one is a
  ``TypeError`` that says to call ``.phi(x)`` or ``.psi(weight, bias)``.
* **Code passed in** (a model, an ``output_fn``, an FFN given as a function) must be
  callable (:func:`check_callable`); when it fails on the inputs it was given, the
  error names the argument it came from and chains the original
  (:func:`call_user_code`).
* **Choices** are exact strings from a documented set (:func:`check_choice`).
"""
from __future__ import annotations

from typing import Any, Collection, Optional, Sequence

import torch

from kernels.device import check_tensor_device

__all__ = [
    "check_tensor",
    "check_same_dtype",
    "check_nonempty",
    "check_positive_int",
    "check_nonnegative_float",
    "check_positive_float",
    "check_choice",
    "check_same_feature_dim",
    "check_index_tensor",
    "check_real",
    "check_times",
    "check_dtype_kind",
    "check_module",
    "check_float_dtype",
    "check_generator",
    "check_callable",
    "check_input",
    "call_user_code",
]


def check_dtype_kind(name: str, value: torch.Tensor, *, floating: bool = True,
                     index: bool = False, complex_ok: bool = False) -> None:
    """The dtype rules above: ``index`` -> an integer dtype; ``floating`` -> a real
    floating dtype (``complex_ok``: or complex); otherwise real floating or integer.
    ``bool`` is refused in every case, with its own message."""
    dtype = value.dtype
    if dtype == torch.bool:
        want = "an integer" if index else "a floating-point" if floating else "a numeric"
        raise TypeError(f"{name} must have {want} dtype, got a bool tensor (convert it with .long() or .double())")
    if dtype.is_complex and not complex_ok:
        want = ("a real floating-point" if floating else "a real") + " dtype (float32 or float64)"
        raise TypeError(f"{name} must have {want}, got the complex dtype {dtype}")
    if index:
        if dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"{name} must have an integer dtype (it holds indices), got {dtype}")
        return
    if floating and not (dtype.is_floating_point or (complex_ok and dtype.is_complex)):
        raise TypeError(
            f"{name} must have a floating-point dtype (float32 or float64), got {dtype}"
        )


def check_tensor(
    name: str,
    value: Any,
    *,
    ndim: Optional[int | Sequence[int]] = None,
    floating: bool = True,
    finite: bool = True,
    index: bool = False,
    complex_ok: bool = False,
) -> torch.Tensor:
    """Check that ``value`` is a tensor on a supported device (CPU or CUDA, see
    :mod:`kernels.device`) of the expected rank, dtype kind (:func:`check_dtype_kind`)
    and finiteness."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    check_tensor_device(name, value)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(
                f"{name} must have {want} dimension(s), got shape {tuple(value.shape)}"
            )
    check_dtype_kind(name, value, floating=floating, index=index, complex_ok=complex_ok)
    if finite and (value.is_floating_point() or value.is_complex()) and not all_finite(value):
        raise ValueError(f"{name} contains NaN or infinite values")
    return value


def all_finite(value: torch.Tensor) -> bool:
    """Whether every entry of a floating-point or complex tensor is finite.

    The sum is finite when every entry is, and never finite when one is NaN or infinite
    (``inf + x = inf``, ``inf - inf = nan``), so a finite sum settles it in one pass with
    no boolean copy (about 25 times faster than ``isfinite(value).all()`` on a 16 x 1.2M
    float64 gradient matrix, measured on one core); only a non-finite sum, which finite
    entries can also give by overflowing, is settled by the exact entry-wise test."""
    if value.numel() == 0:
        return True
    if bool(torch.isfinite(value.sum())):
        return True
    return bool(torch.isfinite(value).all())


def check_module(name: str, value: Any) -> Any:
    """An ``nn.Module`` (``TypeError`` naming the argument otherwise)."""
    from torch import nn

    if not isinstance(value, nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module, got {type(value).__name__}")
    return value


def check_float_dtype(name: str, value: Any, *, allow_none: bool = False,
                      none_is_default: bool = False) -> Optional[torch.dtype]:
    """A real floating ``torch.dtype`` (``None`` too where ``allow_none``, returned as it
    is, or where ``none_is_default``, returned as ``torch.get_default_dtype()``); strings
    such as ``"float32"``, integer, bool and complex dtypes are refused."""
    if value is None and none_is_default:
        return torch.get_default_dtype()
    if value is None and allow_none:
        return None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype (torch.float32 or torch.float64), got {value!r}")
    return value


def check_generator(name: str, value: Any) -> Optional[torch.Generator]:
    """``None`` or a ``torch.Generator`` (``TypeError`` naming the argument otherwise); see
    :func:`cpu_generator` for the functions whose draws must come from a CPU generator."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(value).__name__}")
    return value


def check_callable(name: str, value: Any) -> Any:
    """A callable (a module or a function), ``TypeError`` naming the argument otherwise."""
    if not callable(value):
        raise TypeError(f"{name} must be callable (an nn.Module or a function), got {type(value).__name__}")
    return value


def check_input(name: str, value: Any, features: int, like: Optional[torch.Tensor] = None, *,
                what: str = "in_features", min_ndim: int = 1, match_dtype: bool = True) -> torch.Tensor:
    """The check at a module's ``forward``: a ``(..., features)`` tensor (at least
    ``min_ndim`` dimensions) of a real floating dtype on a supported device and, where
    ``like`` (one of the module's parameters or buffers) is given, on its device and
    (``match_dtype``) with its dtype. ``what`` names ``features`` in the message
    (``"d_model"``, ``"in_features"``).

    Cheap by design -- a forward runs in training loops: type, dtype, device and shape
    only, O(1), no pass over the entries (NaN and Inf propagate as through the layer's
    own operations) and no host-device synchronisation."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if like is not None and value.dtype is like.dtype and value.is_cpu and like.is_cpu:
        pass  # the common case: the parameters' dtype (real floating), both on the CPU
    else:
        check_tensor_device(name, value)
        check_dtype_kind(name, value)
        if like is not None and match_dtype and value.dtype is not like.dtype:
            raise TypeError(
                f"{name} has dtype {value.dtype} but the module's parameters are {like.dtype}; "
                f"convert one of them ({name}.to({like.dtype}) or module.to({value.dtype}))"
            )
        if like is not None and value.device != like.device:
            raise ValueError(
                f"{name} is on {value.device} but the module's parameters are on {like.device}; "
                "move one of them with .to()"
            )
    shape = value.shape
    if len(shape) < min_ndim or shape[-1] != features:
        rank = f", at least {min_ndim} dimensions" if min_ndim > 1 else ""
        raise ValueError(
            f"{name} must have shape (..., {features}) ({what}={features}{rank}), got shape "
            f"{tuple(shape)}"
        )
    return value


def call_user_code(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for code the caller passed in (a model's forward, an
    ``output_fn``), whose failure inside torch would name nothing the user wrote: a
    ``TypeError`` is raised again as a ``TypeError``, a ``ValueError``, ``RuntimeError``
    or ``IndexError`` as a ``ValueError``, the message starting with ``what`` (which
    names the arguments, e.g. ``"output_fn(model, x1)"``); the original is chained.
    Out-of-memory errors pass through."""
    try:
        return fn(*args, **kwargs)
    except torch.OutOfMemoryError:
        raise
    except TypeError as exc:
        raise TypeError(f"{what} failed: {exc}") from exc
    except (ValueError, RuntimeError, IndexError) as exc:
        raise ValueError(f"{what} failed ({type(exc).__name__}: {exc})") from exc


def check_index_tensor(name: str, value: Any, *, ndim: Optional[int | Sequence[int]] = None,
                       low: Optional[int] = None, high: Optional[int] = None) -> torch.Tensor:
    """An integer tensor of indices, with values in ``[low, high)`` where given."""
    value = check_tensor(name, value, ndim=ndim, index=True, finite=False)
    if value.numel() and low is not None and int(value.min()) < low:
        raise ValueError(f"{name} must hold indices >= {low}, got {int(value.min())}")
    if value.numel() and high is not None and int(value.max()) >= high:
        raise ValueError(f"{name} must hold indices < {high}, got {int(value.max())}")
    return value


def check_real(name: str, value: Any) -> float:
    """A finite real number: a Python/NumPy real or a 0-d real tensor (``bool``, complex
    and strings refused)."""
    return _check_real(name, value)


def check_times(name: str, value: Any) -> tuple[torch.Tensor, bool]:
    """Times of gradient flow: a real number or a 0-d/1-d real tensor (float or integer,
    not bool or complex) of values in ``[0, +inf]`` (``+inf``: the limit of training);
    NaN and negative times refused. Returns float64 CPU times and whether ``value`` was
    a scalar."""
    if isinstance(value, torch.Tensor):
        check_tensor_device(name, value)
        if value.ndim > 1:
            raise ValueError(
                f"{name} must be a scalar or a 1-D tensor of times, got shape {tuple(value.shape)}"
            )
        check_dtype_kind(name, value, floating=False)
        scalar = value.ndim == 0
        times = value.detach().to("cpu", torch.float64).reshape(-1)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) or (
        hasattr(value, "__float__") and not isinstance(value, (bool, complex, str))
        and hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iuf"
    ):
        scalar = True
        times = torch.tensor([float(value)], dtype=torch.float64)
    else:
        raise TypeError(f"{name} must be a real number or a tensor of times, got {value!r}")
    if bool(torch.isnan(times).any()) or bool((times < 0).any()):
        raise ValueError(
            f"{name} must hold non-negative times (inf allowed), got NaN or a negative value"
        )
    return times, scalar


def check_positive_int(name: str, value: Any) -> int:
    """Check that ``value`` is a Python/NumPy integer > 0 (booleans rejected)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):  # a 0-d real tensor on a supported device
        check_tensor_device(name, value)
        if value.ndim != 0 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number, got a {value.dtype} tensor of shape {tuple(value.shape)}")
        value = value.item()
    if (
        isinstance(value, (bool, complex, str))
        or getattr(getattr(value, "dtype", None), "kind", "") in ("b", "c")
        or not isinstance(value, (int, float)) and not hasattr(value, "__float__")
    ):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def check_nonnegative_float(name: str, value: Any) -> float:
    """Check that ``value`` is a finite real number >= 0."""
    out = _check_real(name, value)
    if out < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return out


def check_positive_float(name: str, value: Any) -> float:
    """Check that ``value`` is a finite real number > 0."""
    out = _check_real(name, value)
    if out <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return out


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """Check that ``value`` is one of the allowed strings."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_same_feature_dim(name1: str, x1: torch.Tensor, name2: str, x2: torch.Tensor) -> None:
    """Check that two (n, d) inputs share their trailing feature dimension."""
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"{name1} and {name2} must have the same feature dimension, got "
            f"{x1.shape[-1]} ({name1}) and {x2.shape[-1]} ({name2})"
        )


def check_same_dtype(*named: tuple[str, torch.Tensor]) -> None:
    """Check that ``(name, tensor)`` pairs share one dtype (a mixed float32/float64 or
    float16/float32 pair otherwise fails inside a matmul with a message naming neither)."""
    (first, x), *rest = named
    for name, y in rest:
        if y.dtype != x.dtype:
            raise TypeError(
                f"{first} and {name} must have the same dtype, got {x.dtype} ({first}) and "
                f"{y.dtype} ({name}); convert one of them with .to()"
            )


def check_nonempty(name: str, value: torch.Tensor, dim: int, what: str) -> None:
    """Check that ``value.shape[dim] >= 1`` (``what`` names that dimension: "row", "column")."""
    if value.shape[dim] < 1:
        raise ValueError(f"{name} must have at least one {what}, got shape {tuple(value.shape)}")


def cpu_generator(generator: object) -> "torch.Generator":
    """The package convention for random draws: an explicit CPU ``torch.Generator``; ``None``
    gives a fresh one seeded with 0, so results never depend on torch's global generator."""
    if generator is None:
        return torch.Generator().manual_seed(0)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (draws happen on the CPU), got {generator.device}")
    return generator

"""Argument checks shared by the dataset generators (ValueError/TypeError naming the argument)."""

from __future__ import annotations


def check_int(name: str, value: object, *, low: int) -> int:
    """Return ``value`` as an int, rejecting booleans, non-integers and values below ``low``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)  # type: ignore[call-overload]
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value

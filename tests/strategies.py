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


def check_clear(exc: BaseException, *names: str) -> None:
    """The error is a ValueError/TypeError whose message names one of ``names``."""
    assert isinstance(exc, (ValueError, TypeError)), f"unclear error {type(exc).__name__}: {exc}"
    assert any(name in str(exc) for name in names), f"the message names none of {names}: {exc}"

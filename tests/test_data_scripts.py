"""Tests for the dataset helpers in ``data_scripts`` (used by the chapters)."""

from __future__ import annotations

import math

import pytest
import torch

from data_scripts.digits import N_CLASSES, N_DIGITS, N_PIXELS, centered_one_hot, load_digits_split


def test_shapes_dtypes_and_disjoint_split():
    x_tr, y_tr, x_te, y_te, l_tr, l_te = load_digits_split(50, 30, seed=0)
    assert x_tr.shape == (50, N_PIXELS) and x_te.shape == (30, N_PIXELS)
    assert y_tr.shape == (50, N_CLASSES) and y_te.shape == (30, N_CLASSES)
    assert l_tr.shape == (50,) and l_te.shape == (30,)
    assert x_tr.dtype == torch.float64 and y_tr.dtype == torch.float64
    assert l_tr.dtype == torch.int64
    # No image appears in both splits.
    d = (x_tr[:, None, :] - x_te[None, :, :]).norm(dim=-1)
    assert float(d.min()) > 1e-6


def test_inputs_lie_on_sphere_of_given_radius():
    for radius in (1.0, math.sqrt(N_PIXELS)):
        x_tr, _, x_te, _, _, _ = load_digits_split(40, 20, seed=1, radius=radius)
        torch.testing.assert_close(x_tr.norm(dim=1), torch.full((40,), radius, dtype=torch.float64))
        torch.testing.assert_close(x_te.norm(dim=1), torch.full((20,), radius, dtype=torch.float64))


def test_targets_are_zero_centred_one_hot():
    _, y_tr, _, _, l_tr, _ = load_digits_split(100, 0, seed=2)
    torch.testing.assert_close(y_tr.sum(dim=1), torch.zeros(100, dtype=torch.float64))
    assert torch.equal(y_tr.argmax(dim=1), l_tr)
    expected = torch.full((100, N_CLASSES), -1.0 / N_CLASSES, dtype=torch.float64)
    expected[torch.arange(100), l_tr] = (N_CLASSES - 1) / N_CLASSES
    torch.testing.assert_close(y_tr, expected)
    torch.testing.assert_close(
        centered_one_hot(torch.tensor([2]), 4, dtype=torch.float64),
        torch.tensor([[-0.25, -0.25, 0.75, -0.25]], dtype=torch.float64),
    )


def test_centering_uses_training_mean():
    raw = load_digits_split(200, 10, seed=3, center=False, radius=1.0)[0]
    cen = load_digits_split(200, 10, seed=3, center=True, radius=1.0)[0]
    # Raw digit images are non-negative; centred ones are not.
    assert float(raw.min()) >= 0.0
    assert float(cen.min()) < 0.0
    # Per-image scaling keeps the centred training images spread around the origin.
    assert float(cen.mean(dim=0).abs().max()) < 0.1


def test_same_seed_same_split_other_seed_other_split():
    a = load_digits_split(30, 10, seed=7)
    b = load_digits_split(30, 10, seed=7)
    c = load_digits_split(30, 10, seed=8)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert not torch.equal(a[4], c[4])


def test_float32_and_full_dataset():
    x_tr, y_tr, x_te, _, _, _ = load_digits_split(N_DIGITS - 1, 1, seed=0, dtype=torch.float32)
    assert x_tr.dtype == torch.float32 and y_tr.dtype == torch.float32
    assert x_te.shape == (1, N_PIXELS)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(n_train=0, n_test=5), ValueError, "n_train"),
        (dict(n_train=-3, n_test=5), ValueError, "n_train"),
        (dict(n_train=2.5, n_test=5), TypeError, "n_train"),
        (dict(n_train=True, n_test=5), TypeError, "n_train"),
        (dict(n_train=5, n_test=-1), ValueError, "n_test"),
        (dict(n_train=1000, n_test=1000), ValueError, "n_train + n_test"),
        (dict(n_train=5, n_test=5, seed=-1), ValueError, "seed"),
        (dict(n_train=5, n_test=5, seed="0"), TypeError, "seed"),
        (dict(n_train=5, n_test=5, radius=0.0), ValueError, "radius"),
        (dict(n_train=5, n_test=5, radius=float("nan")), ValueError, "radius"),
        (dict(n_train=5, n_test=5, radius="1"), TypeError, "radius"),
        (dict(n_train=5, n_test=5, center=1), TypeError, "center"),
        (dict(n_train=5, n_test=5, dtype=torch.int64), ValueError, "dtype"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, exc, name):
    kwargs.setdefault("seed", 0)
    with pytest.raises(exc, match=name.replace("+", r"\+")):
        load_digits_split(**kwargs)


def test_dataset_size_constant_matches_sklearn():
    from sklearn.datasets import load_digits

    assert load_digits().data.shape == (N_DIGITS, N_PIXELS)

"""data_scripts.diabetes: the offline regression task of chapter 3."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_scripts.diabetes import N_PATIENTS, N_VARIABLES, load_diabetes_split


def test_shapes_and_disjoint_rows() -> None:
    split = load_diabetes_split(100, seed=0)
    assert split.x_train.shape == (N_PATIENTS - 100, N_VARIABLES)
    assert split.x_test.shape == (100, N_VARIABLES)
    assert split.y_train.shape == (N_PATIENTS - 100,) and split.y_test.shape == (100,)
    assert split.x_train.dtype == torch.float64
    # every patient appears exactly once: compare against the raw rows (de-standardised targets)
    from sklearn.datasets import load_diabetes

    _, y = load_diabetes(return_X_y=True)
    back = torch.cat([split.y_train, split.y_test]).numpy() * split.y_std + split.y_mean
    np.testing.assert_allclose(np.sort(back), np.sort(y), rtol=1e-12)


def test_standardised_with_training_statistics() -> None:
    split = load_diabetes_split(seed=3)
    torch.testing.assert_close(split.x_train.mean(0), torch.zeros(N_VARIABLES, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(split.x_train.std(0, unbiased=False), torch.ones(N_VARIABLES, dtype=torch.float64))
    assert abs(float(split.y_train.mean())) < 1e-12
    assert abs(float(split.y_train.std(unbiased=False)) - 1.0) < 1e-12
    # the test rows are not standardised with their own statistics
    assert abs(float(split.y_test.mean())) > 1e-6


def test_seed_controls_the_split() -> None:
    a, b, c = (load_diabetes_split(50, seed=s) for s in (7, 7, 8))
    assert torch.equal(a.x_test, b.x_test)
    assert not torch.equal(a.x_test, c.x_test)


def test_dtype() -> None:
    assert load_diabetes_split(seed=0, dtype=torch.float32).x_train.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs,error,word",
    [
        ({"n_test": 0, "seed": 0}, ValueError, "n_test"),
        ({"n_test": 433, "seed": 0}, ValueError, "n_test"),
        ({"n_test": 2.5, "seed": 0}, TypeError, "n_test"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": True}, TypeError, "seed"),
        ({"seed": 0, "dtype": torch.int64}, ValueError, "dtype"),
    ],
)
def test_bad_arguments(kwargs, error, word) -> None:
    with pytest.raises(error, match=word):
        load_diabetes_split(**kwargs)

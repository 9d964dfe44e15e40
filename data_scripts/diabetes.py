"""The diabetes regression task that ships with scikit-learn, split and standardised.

Chapter 3 (``chapters/03_bundling.ipynb``) fits a fully bundled network to it in closed
form and compares with gradient training. The data: 442 patients, ten baseline
variables (age, sex, body-mass index, mean blood pressure and six blood serum
measurements) and a quantitative measure of disease progression one year later (Efron,
Hastie, Johnstone & Tibshirani, 2004, *Least angle regression*). No download is
involved: ``sklearn.datasets.load_diabetes`` reads a file inside the scikit-learn wheel.

Standardisation uses the statistics of the *training* rows only (inputs per column,
target as a whole), so that nothing about the test rows leaks into the fit. With the
target standardised, a test mean squared error of 1 is what predicting the training mean
gives, and :math:`R^2 = 1 - \\mathrm{MSE}/\\mathrm{Var}(y_{test})`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from data_scripts._checks import check_int

__all__ = ["N_PATIENTS", "N_VARIABLES", "DiabetesSplit", "load_diabetes_split"]

#: Number of patients (rows) in scikit-learn's diabetes data.
N_PATIENTS = 442
#: Number of input variables per patient.
N_VARIABLES = 10


class DiabetesSplit(NamedTuple):
    """Standardised train/test tensors and the target's scale.

    ``x_train`` (n_train, 10), ``y_train`` (n_train,), ``x_test`` (n_test, 10),
    ``y_test`` (n_test,); ``y_mean``/``y_std`` map a standardised prediction ``p`` back
    to the original units as ``p * y_std + y_mean``.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    y_mean: float
    y_std: float


def load_diabetes_split(
    n_test: int = 88, *, seed: int, dtype: torch.dtype = torch.float64
) -> DiabetesSplit:
    """Shuffle the 442 patients with ``numpy.random.default_rng(seed)``, hold out the first
    ``n_test`` for testing and standardise with the training rows' statistics.

    Args:
        n_test: number of test rows, 1 <= n_test <= 432 (at least ten rows stay for training).
        seed: seed of the shuffle, an integer >= 0; the same seed gives the same split.
        dtype: floating torch dtype of the returned tensors.

    Returns:
        a :class:`DiabetesSplit`.

    Raises:
        TypeError / ValueError naming the argument when it is out of range.
    """
    n_test = check_int("n_test", n_test, low=1)
    if n_test > N_PATIENTS - 10:
        raise ValueError(f"n_test must be <= {N_PATIENTS - 10} so that ten rows stay for training, got {n_test}")
    seed = check_int("seed", seed, low=0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (e.g. torch.float64), got {dtype!r}")

    from sklearn.datasets import load_diabetes  # local import: only this loader needs sklearn

    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(seed).permutation(N_PATIENTS)
    test, train = order[:n_test], order[n_test:]
    x_mean, x_std = x[train].mean(axis=0), x[train].std(axis=0)
    y_mean, y_std = float(y[train].mean()), float(y[train].std())

    def as_tensor(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype)

    return DiabetesSplit(
        x_train=as_tensor((x[train] - x_mean) / x_std),
        y_train=as_tensor((y[train] - y_mean) / y_std),
        x_test=as_tensor((x[test] - x_mean) / x_std),
        y_test=as_tensor((y[test] - y_mean) / y_std),
        y_mean=y_mean,
        y_std=y_std,
    )

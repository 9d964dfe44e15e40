"""The 8x8 handwritten digits that ship with scikit-learn, split and scaled for NTK work.

Chapter 1 (``chapters/01_ntk.ipynb``) trains wide networks and kernel machines on these
images with the squared loss. Two choices follow the lecture slides it is built from:

* inputs lie on a sphere (each image is scaled to Euclidean norm ``radius``), because the
  NTK bounds are stated for inputs of bounded norm and the kernel of a ReLU network is
  homogeneous in the input norm;
* targets are zero-centred one-hot vectors, ``y = (-1/C, ..., (C-1)/C, ..., -1/C)``, so
  that each row sums to zero like the outputs of a network at initialisation.

No download is involved: ``sklearn.datasets.load_digits`` reads a file inside the
scikit-learn wheel.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from data_scripts._checks import check_int as _check_int

__all__ = ["N_DIGITS", "N_PIXELS", "N_CLASSES", "load_digits_split", "centered_one_hot"]

#: Number of images in scikit-learn's digits dataset.
N_DIGITS = 1797
#: Pixels per image (8 x 8).
N_PIXELS = 64
#: Number of classes (the digits 0-9).
N_CLASSES = 10


def centered_one_hot(labels: torch.Tensor, n_classes: int, *, dtype: torch.dtype) -> torch.Tensor:
    """Zero-centred one-hot targets: ``(C-1)/C`` at the label, ``-1/C`` elsewhere.

    Shapes: ``labels`` (n,) integer -> (n, n_classes). Each row sums to zero.
    """
    eye = torch.eye(n_classes, dtype=dtype)
    return eye[labels] - 1.0 / n_classes


def load_digits_split(
    n_train: int,
    n_test: int,
    *,
    seed: int,
    radius: float = 1.0,
    center: bool = True,
    dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw disjoint train and test sets from scikit-learn's 8x8 digits.

    Steps: shuffle the 1797 images with ``numpy.random.default_rng(seed)``, take the first
    ``n_train`` for training and the next ``n_test`` for testing; optionally subtract the
    mean training image (``center``); scale every image to Euclidean norm ``radius``.

    Args:
        n_train: number of training images, >= 1.
        n_test: number of test images, >= 0; ``n_train + n_test <= 1797``.
        seed: seed of the shuffle; the same seed gives the same split.
        radius: norm of every returned image, > 0. With a first layer that divides by
            ``sqrt(64)`` (NTK parametrization), ``radius=8`` gives pre-activations of
            unit variance.
        center: subtract the mean *training* image before scaling, so that the images
            are spread around the origin rather than packed in the positive orthant.
        dtype: floating dtype of the returned inputs and targets.

    Returns:
        ``(x_train, y_train, x_test, y_test, labels_train, labels_test)`` with shapes
        (n_train, 64), (n_train, 10), (n_test, 64), (n_test, 10), (n_train,), (n_test,).
        Targets are zero-centred one-hot (see :func:`centered_one_hot`); labels are int64.

    Raises:
        ValueError / TypeError naming the argument when an argument is out of range.
    """
    n_train = _check_int("n_train", n_train, low=1)
    n_test = _check_int("n_test", n_test, low=0)
    if n_train + n_test > N_DIGITS:
        raise ValueError(
            f"n_train + n_test must be <= {N_DIGITS} (the size of the digits dataset), "
            f"got n_train={n_train}, n_test={n_test}"
        )
    seed = _check_int("seed", seed, low=0)
    if isinstance(radius, bool) or not isinstance(radius, (int, float)):
        raise TypeError(f"radius must be a real number, got {radius!r}")
    if not np.isfinite(radius) or radius <= 0:
        raise ValueError(f"radius must be a finite number > 0, got {radius!r}")
    if not isinstance(center, bool):
        raise TypeError(f"center must be True or False, got {center!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (e.g. torch.float64), got {dtype!r}")

    from sklearn.datasets import load_digits  # local import: only this loader needs sklearn

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(N_DIGITS)
    train_idx, test_idx = order[:n_train], order[n_train : n_train + n_test]

    x = images.astype(np.float64)
    if center:
        x = x - x[train_idx].mean(axis=0, keepdims=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    # A centred image can only be zero if it equals the mean image exactly; guard anyway.
    x = radius * x / np.maximum(norms, np.finfo(np.float64).tiny)

    x_t = torch.as_tensor(x, dtype=dtype)
    labels_t = torch.as_tensor(labels, dtype=torch.int64)
    y_t = centered_one_hot(labels_t, N_CLASSES, dtype=dtype)
    tr = torch.as_tensor(train_idx)
    te = torch.as_tensor(test_idx, dtype=torch.int64)
    return x_t[tr], y_t[tr], x_t[te], y_t[te], labels_t[tr], labels_t[te]

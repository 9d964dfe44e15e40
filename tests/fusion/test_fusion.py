"""Tests of :mod:`kernels.fusion.fusion` (the package's public face: bad input across its modules and devices).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.fusion import (
    METHODS,
    clustering_matrix,
    compress_mlp,
    compress_model,
    compress_sequential,
    find_ffn_blocks,
    fuse_mlp,
    kernel_error,
    kmeans,
    mlp_gradients,
    sgd_kernel,
    sign_kernel,
)

from fusion_helpers import F64, inputs, make_mlp, tiny_bert


@pytest.mark.parametrize("k, exc", [(0, ValueError), (-3, ValueError), (25, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_k(k, exc):
    mlp = make_mlp()
    with pytest.raises(exc, match="k"):
        fuse_mlp(mlp[0], mlp[2], k)


def test_mismatched_linears():
    a, b = nn.Linear(6, 24), nn.Linear(20, 6)
    with pytest.raises(ValueError, match="mismatched linear layers"):
        fuse_mlp(a, b, 4)
    with pytest.raises(ValueError, match="p -> p_I -> p"):
        fuse_mlp(nn.Linear(6, 24), nn.Linear(24, 5), 4)
    with pytest.raises(TypeError, match="linear1"):
        fuse_mlp(nn.Conv1d(6, 24, 1), nn.Linear(24, 6), 4)


def test_bad_method_and_generator():
    mlp = make_mlp()
    with pytest.raises(ValueError, match="method"):
        compress_mlp(mlp[0], mlp[2], 4, method="quantize")
    with pytest.raises(TypeError, match="generator"):
        compress_mlp(mlp[0], mlp[2], 4, generator=3)
    with pytest.raises(TypeError, match="generator"):
        kmeans(torch.randn(10, 2, dtype=F64), 3, generator=0)
    with pytest.raises(ValueError, match="init"):
        kmeans(torch.randn(10, 2, dtype=F64), 3, init="forgy")
    # the default generator is a fresh one seeded with 0, never torch's global one
    a = compress_sequential(mlp, 4, method="sketch")
    torch.manual_seed(123)
    b = compress_sequential(mlp, 4, method="sketch")
    torch.testing.assert_close(a[0].weight, b[0].weight)


def test_model_without_ffn_structure():
    with pytest.raises(ValueError, match="expected structure"):
        find_ffn_blocks(nn.Module())
    with pytest.raises(ValueError, match="Sequential"):
        find_ffn_blocks(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    with pytest.raises(TypeError, match="model"):
        find_ffn_blocks("bert")
    with pytest.raises(ValueError, match="layers"):
        compress_model(tiny_bert(), 4, layers=[2])
    with pytest.raises(ValueError, match="repeat"):
        compress_model(tiny_bert(), 4, layers=[0, -2])


def test_bad_kmeans_and_kernel_input():
    with pytest.raises(ValueError, match="k must be at most"):
        kmeans(torch.randn(5, 2), 6)
    with pytest.raises(ValueError, match="points"):
        kmeans(torch.randn(5), 2)
    with pytest.raises(ValueError, match="same shape"):
        kernel_error(torch.zeros(2, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="same number of parameters"):
        sgd_kernel(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="1-D"):
        mlp_gradients(make_mlp(), lambda m: m(inputs()))
    with pytest.raises(ValueError, match="labels must lie"):
        clustering_matrix(torch.tensor([0, 3]), 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_compression_and_gradients_on_cuda():
    mlp = make_mlp().cuda()
    x = inputs().cuda()
    for method in METHODS:
        out = compress_sequential(mlp, 24, method=method, mmd_steps=3)
        tensors = list(out.parameters()) + list(out.buffers())
        assert tensors and all(t.device.type == "cuda" for t in tensors), method
        assert out(x).device.type == "cuda"
    fused = compress_sequential(mlp, 24, method="fusion")
    torch.testing.assert_close(fused(x), mlp(x))
    u = torch.ones(6, dtype=F64, device="cuda")
    g_ref = mlp_gradients(mlp, lambda m: m(x) @ u)
    g_new = mlp_gradients(fused, lambda m: m(x) @ u)
    assert kernel_error(sign_kernel(g_ref), sign_kernel(g_new)) < 1e-8 * float(sign_kernel(g_ref).norm())

"""CUDA paths of every public module, checked against the CPU in float64.

The package promises that "CUDA paths engage only when a GPU is present and are tested
when one is"; this file is that test. Each case builds its module or inputs on the CPU
in float64 from a fixed ``torch.Generator``, copies them to the GPU, and compares the
outputs (and, where the path is differentiable, the gradients of a fixed random
cotangent with respect to inputs and parameters) with :func:`torch.testing.assert_close`
at float64 tolerances; every result must live on the GPU. Only public, stable names of
``kernels`` are used. The whole module is skipped on a machine without a CUDA GPU.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

from kernels import device as kdevice  # noqa: E402
from kernels.features import (  # noqa: E402
    ReLUMap,
    URFMap,
    arccos_features,
    arccos_kernel,
    gaussian_projections,
    softmax_features,
    softmax_kernel,
)
from kernels.fusion import (  # noqa: E402
    METHODS,
    compress_mlp,
    ffn_output_error,
    kernel_cosine,
    kernel_error,
    kmeans,
    mlp_gradients,
    mmd2,
    mmd_support,
    sgd_kernel,
    sign_kernel,
    sub_mlp_embeddings,
)
from kernels.hadamard import (  # noqa: E402
    BH4,
    ACDCProjection,
    BHProjection,
    DenseProjection,
    bh_project_fused,
    fwht,
    fwht_backend,
    fwht_torch,
)
from kernels.lookup import (  # noqa: E402
    BlockDiagonalFFN,
    LookupFFN,
    LSHSparseFFN,
    Top1MoEFFN,
    VanillaFFN,
    gather_fused,
    hash_codes,
    lookup_forward_fused,
    lookup_gather,
    lookup_gather_naive,
    lookup_softmax,
    lookup_weights,
)
from kernels.ntk import (  # noqa: E402
    empirical_ntk,
    fc_kernel,
    fc_network,
    gd_mse_ensemble,
    gd_mse_predictor,
    linearize,
    mse_loss_curve,
)
from kernels.snnk import (  # noqa: E402
    BottleneckAdapter,
    BundledNetwork,
    FeedForward,
    SNNKAdapter,
    SNNKLinear,
    balanced_input_scale,
    bundle,
    least_squares,
    ridge_cv,
)
from kernels.toeplitz import (  # noqa: E402
    FDTNO,
    SKITNO,
    TNO,
    TNNEncoder,
    causal_kernel_from_real_response,
    discrete_hilbert,
    frequency_response_decay,
    inverse_time_warp,
    rpe_mlp,
    ski_matvec,
    toeplitz_dense,
    toeplitz_matvec,
)

F64 = torch.float64
CUDA = torch.device("cuda")
RTOL, ATOL = 1e-10, 1e-12


# ----------------------------------------------------------------------------- helpers
def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(tuple(shape), generator=gen(seed), dtype=F64)


def on_cuda(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.device.type == "cuda", f"expected a CUDA tensor, got one on {t.device}"


def close(got: torch.Tensor, ref: torch.Tensor, *, rtol: float = RTOL, atol: float = ATOL, msg=None) -> None:
    """``got`` (on the GPU) equals the CPU reference ``ref`` to float64 precision."""
    on_cuda(got)
    assert ref.device.type == "cpu"
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), rtol=rtol, atol=atol, msg=msg)


def module_on_cuda(module: nn.Module) -> None:
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        assert t.device.type == "cuda", f"{name} stayed on {t.device}"


def compare_modules(cpu: nn.Module, gpu: nn.Module, *inputs: torch.Tensor, grad_inputs: bool = True,
                    rtol: float = RTOL, atol: float = ATOL, seed: int = 99) -> None:
    """Forward and backward of ``cpu`` and ``gpu`` (the same module on two devices) agree.

    ``inputs`` are CPU tensors; floating ones get gradients when ``grad_inputs``. The
    backward pass contracts the output with a fixed random cotangent.
    """
    module_on_cuda(gpu)
    for p in list(cpu.parameters()) + list(gpu.parameters()):
        p.grad = None
    xs_cpu, xs_gpu = [], []
    for x in inputs:
        need = grad_inputs and x.is_floating_point()
        xs_cpu.append(x.detach().clone().requires_grad_(need))
        xs_gpu.append(x.detach().clone().to(CUDA).requires_grad_(need))
    y_cpu, y_gpu = cpu(*xs_cpu), gpu(*xs_gpu)
    close(y_gpu, y_cpu.detach(), rtol=rtol, atol=atol, msg="forward")
    cot = randn(*y_cpu.shape, seed=seed)
    (y_cpu * cot).sum().backward()
    (y_gpu * cot.to(CUDA)).sum().backward()
    for i, (a, b) in enumerate(zip(xs_cpu, xs_gpu)):
        if a.requires_grad:
            close(b.grad, a.grad, rtol=rtol, atol=atol, msg=f"grad of input {i}")
    params_gpu = dict(gpu.named_parameters())
    checked = 0
    for name, p in cpu.named_parameters():
        q = params_gpu[name]
        if p.grad is None:
            assert q.grad is None, name
            continue
        close(q.grad, p.grad, rtol=rtol, atol=atol, msg=f"grad of {name}")
        checked += 1
    assert checked or not list(cpu.parameters()), "no parameter received a gradient"


def check_module(module: nn.Module, *inputs: torch.Tensor, **kwargs) -> None:
    """``module`` (built on the CPU) and its copy on the GPU agree, forward and backward."""
    compare_modules(module, copy.deepcopy(module).to(CUDA), *inputs, **kwargs)


# ----------------------------------------------------------------------------- device
def test_device_selection_and_checks() -> None:
    assert kdevice.default_device().type == "cuda"
    assert kdevice.resolve_device(None).type == "cuda"
    assert kdevice.resolve_device("cuda") == torch.device("cuda")
    assert kdevice.resolve_device("cuda:0") == torch.device("cuda:0")
    assert kdevice.resolve_device(torch.device("cuda", 0)) == torch.device("cuda:0")
    assert kdevice.resolve_device("cpu") == torch.device("cpu")
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match="torch sees"):
        kdevice.resolve_device(f"cuda:{count}")
    with pytest.raises(ValueError, match="not supported"):
        kdevice.resolve_device("meta")
    kdevice.check_tensor_device("x", torch.zeros(2, device=CUDA))  # accepted
    with pytest.raises(ValueError, match="'meta' device"):
        kdevice.check_tensor_device("x", torch.zeros(2, device="meta"))
    assert "cuda" in kdevice.SUPPORTED_DEVICE_TYPES
    assert isinstance(kdevice.cupy_available(), bool)


# ----------------------------------------------------------------------------- ntk
@pytest.mark.parametrize("method", ["jacobian", "jvp", "gram"])
@pytest.mark.parametrize("out_dim", [1, 2])
def test_empirical_ntk_cuda(method: str, out_dim: int) -> None:
    net = fc_network(4, 16, 2, out_dim, b_std=0.3, generator=gen(0))
    x1, x2 = randn(5, 4, seed=1), randn(3, 4, seed=2)
    net_gpu = copy.deepcopy(net).to(CUDA)
    for args in ((x1,), (x1, x2)):
        ref = empirical_ntk(net, *args, method=method)
        got = empirical_ntk(net_gpu, *(a.to(CUDA) for a in args), method=method)
        close(got, ref)
        if out_dim > 1:
            ref_t = empirical_ntk(net, *args, method=method, trace_outputs=True)
            got_t = empirical_ntk(net_gpu, *(a.to(CUDA) for a in args), method=method, trace_outputs=True)
            close(got_t, ref_t)
    with pytest.raises(ValueError, match="model's parameters are on"):
        empirical_ntk(net_gpu, x1)


def test_fc_network_from_a_cuda_generator() -> None:
    net = fc_network(3, 8, 2, generator=torch.Generator(device=CUDA).manual_seed(0))
    module_on_cuda(net)
    x = randn(4, 3, seed=3)
    got = empirical_ntk(net, x.to(CUDA))
    ref = empirical_ntk(copy.deepcopy(net).cpu(), x)
    close(got, ref)
    check_module(copy.deepcopy(net).cpu(), x)


@pytest.mark.parametrize("activation", ["relu", "erf"])
def test_fc_kernel_cuda(activation: str) -> None:
    x1, x2 = randn(9, 5, seed=4), randn(4, 5, seed=5)
    for args in ((x1,), (x1, x2)):
        ref = fc_kernel(*args, depth=3, activation=activation, W_std=1.3, b_std=0.2)
        got = fc_kernel(*(a.to(CUDA) for a in args), depth=3, activation=activation, W_std=1.3, b_std=0.2)
        # On the diagonal (x2=None) the ReLU recursion takes arccos of a correlation that
        # rounds to 1, where arccos has condition sqrt(eps): 1e-8 there, not 1e-16.
        tol = dict(rtol=1e-7, atol=1e-9) if len(args) == 1 and activation == "relu" else {}
        close(got.nngp, ref.nngp, **tol)
        close(got.ntk, ref.ntk, **tol)
        if len(args) == 1:
            off = ~torch.eye(9, dtype=torch.bool)
            close(got.ntk[off.to(CUDA)], ref.ntk[off])
    got32 = fc_kernel(x1.float().to(CUDA), depth=2, activation=activation)
    assert got32.ntk.dtype == torch.float32
    close(got32.ntk, fc_kernel(x1.float(), depth=2, activation=activation).ntk, rtol=1e-5, atol=1e-6)


def _train_test_kernels():
    x_train, x_test = randn(6, 3, seed=6), randn(4, 3, seed=7)
    train = fc_kernel(x_train, depth=2, b_std=0.5)
    cross = fc_kernel(x_test, x_train, depth=2, b_std=0.5)
    test = fc_kernel(x_test, depth=2, b_std=0.5)
    return train, cross, test


@pytest.mark.parametrize("discrete", [False, True])
def test_gd_mse_dynamics_cuda(discrete: bool) -> None:
    train, cross, test = _train_test_kernels()
    y, f0, f0_test = randn(6, 2, seed=8), randn(6, 2, seed=9, scale=0.1), randn(4, 2, seed=10, scale=0.1)
    times = torch.tensor([0.0, 1.0, 3.0, math.inf], dtype=F64)
    tol = dict(rtol=1e-8, atol=1e-10)
    g = lambda t: t.to(CUDA)  # noqa: E731
    ref = gd_mse_predictor(train.ntk, y, learning_rate=0.5, ntk_test_train=cross.ntk, f0_train=f0,
                           f0_test=f0_test, discrete=discrete)
    got = gd_mse_predictor(g(train.ntk), g(y), learning_rate=0.5, ntk_test_train=g(cross.ntk), f0_train=g(f0),
                           f0_test=g(f0_test), discrete=discrete)
    for t in (2.0, times, times.to(CUDA)):
        (a_train, a_test), (b_train, b_test) = ref(t.cpu() if isinstance(t, torch.Tensor) else t), got(t)
        close(b_train, a_train, **tol)
        close(b_test, a_test, **tol)
    close(mse_loss_curve(g(train.ntk), g(y), g(f0), times, learning_rate=0.5, discrete=discrete),
          mse_loss_curve(train.ntk, y, f0, times, learning_rate=0.5, discrete=discrete), **tol)
    kw = dict(learning_rate=0.5, discrete=discrete)
    ref_e = gd_mse_ensemble(train.nngp, train.ntk, y, nngp_test_train=cross.nngp, ntk_test_train=cross.ntk,
                            nngp_test_test=test.nngp, **kw)(times)
    got_e = gd_mse_ensemble(g(train.nngp), g(train.ntk), g(y), nngp_test_train=g(cross.nngp),
                            ntk_test_train=g(cross.ntk), nngp_test_test=g(test.nngp), **kw)(times)
    close(got_e.mean, ref_e.mean, **tol)
    close(got_e.covariance, ref_e.covariance, **tol)


def test_linearize_cuda() -> None:
    net = fc_network(3, 8, 2, 2, b_std=0.1, generator=gen(11))
    lin = linearize(net)
    with torch.no_grad():
        for i, p in enumerate(lin.params):
            p.add_(randn(*p.shape, seed=100 + i, scale=0.1))
    check_module(lin, randn(5, 3, seed=12))


# ----------------------------------------------------------------------------- features
def test_softmax_and_arccos_features_cuda() -> None:
    x, y = randn(5, 4, seed=13, scale=0.5), randn(3, 4, seed=14, scale=0.5)
    for orthogonal in (False, True):
        proj = gaussian_projections(16, 4, orthogonal=orthogonal, generator=gen(15))
        pg = proj.to(CUDA)
        for a in (0.0, -0.2):
            close(softmax_features(x.to(CUDA), pg, A=a), softmax_features(x, proj, A=a))
        xc = torch.complex(x, y[:1].expand_as(x).contiguous())
        close(softmax_features(xc.to(CUDA), pg), softmax_features(xc, proj))
        for order in (0, 1, 2):
            close(arccos_features(x.to(CUDA), pg, order), arccos_features(x, proj, order))
    close(softmax_kernel(x.to(CUDA), y.to(CUDA)), softmax_kernel(x, y))
    for order in (0, 1, 2):
        close(arccos_kernel(x.to(CUDA), y.to(CUDA), order), arccos_kernel(x, y, order))


@pytest.mark.parametrize("activation", ["sin", "cos", "gelu"])
def test_urf_map_cuda(activation: str) -> None:
    fmap = URFMap(4, activation, 8, A=-0.1, generator=gen(16), dtype=F64)
    gpu = copy.deepcopy(fmap).to(CUDA)
    module_on_cuda(gpu)
    x, w, b = randn(5, 4, seed=17, scale=0.5), randn(3, 4, seed=18, scale=0.5), randn(3, seed=19)
    xg = x.clone().to(CUDA).requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    phi_g, phi_c = gpu.phi(xg), fmap.phi(xc)
    close(phi_g, phi_c.detach())
    cot = randn(*phi_c.shape, seed=20)
    (phi_c * cot).sum().backward()
    (phi_g * cot.to(CUDA)).sum().backward()
    close(xg.grad, xc.grad)
    close(gpu.psi(w.to(CUDA), b.to(CUDA)), fmap.psi(w, b))
    close(gpu.psi(w.to(CUDA)), fmap.psi(w))
    # the URF estimate Phi(x)^T Psi(w, b) of f(w^T x + b)
    close(gpu.phi(x.to(CUDA)) @ gpu.psi(w.to(CUDA), b.to(CUDA)).T, fmap.phi(x) @ fmap.psi(w, b).T)




@pytest.mark.parametrize("activation", ["sin", "gelu"])
def test_urf_expected_cuda(activation: str) -> None:
    fmap = URFMap(4, activation, 8, generator=gen(21), dtype=F64)
    gpu = copy.deepcopy(fmap).to(CUDA)
    x, w, b = randn(5, 4, seed=22), randn(3, 4, seed=23), randn(3, seed=24)
    close(gpu.expected(x.to(CUDA), w.to(CUDA), b.to(CUDA)), fmap.expected(x, w, b))


@pytest.mark.parametrize("bias", [True, False])
def test_relu_map_cuda(bias: bool) -> None:
    fmap = ReLUMap(4, 12, bias=bias, generator=gen(25), dtype=F64)
    gpu = copy.deepcopy(fmap).to(CUDA)
    module_on_cuda(gpu)
    x, w, b = randn(5, 4, seed=26), randn(3, 4, seed=27), randn(3, seed=28)
    close(gpu.phi(x.to(CUDA)), fmap.phi(x))
    close(gpu.psi(w.to(CUDA), b.to(CUDA)), fmap.psi(w, b))
    close(gpu.psi(w.to(CUDA)), fmap.psi(w))
    close(gpu.expected(x.to(CUDA), w.to(CUDA), b.to(CUDA)), fmap.expected(x, w, b))


def test_relu_map_expected_without_bias_cuda() -> None:
    fmap = ReLUMap(4, 12, bias=True, generator=gen(29), dtype=F64)
    gpu = copy.deepcopy(fmap).to(CUDA)
    x, w = randn(5, 4, seed=30), randn(3, 4, seed=31)
    close(gpu.expected(x.to(CUDA), w.to(CUDA)), fmap.expected(x, w))


# ----------------------------------------------------------------------------- snnk
@pytest.mark.parametrize("activation", ["relu", "sin", "gelu"])
def test_snnk_linear_cuda(activation: str) -> None:
    layer = SNNKLinear(6, 3, 8, activation, generator=gen(32), dtype=F64)
    check_module(layer, randn(5, 6, seed=33, scale=0.5))
    check_module(layer, randn(2, 4, 6, seed=34, scale=0.5))


def test_snnk_linear_input_scale_and_adapters_cuda() -> None:
    lin = nn.Linear(6, 3, dtype=F64)
    with torch.no_grad():
        lin.weight.copy_(randn(3, 6, seed=35, scale=0.3))
        lin.bias.copy_(randn(3, seed=36, scale=0.1))
    x = randn(7, 6, seed=37, scale=2.0)
    s_cpu = balanced_input_scale(x, lin.weight.detach(), "sin")
    s_gpu = balanced_input_scale(x.to(CUDA), lin.weight.detach().to(CUDA), "sin")
    assert s_gpu == pytest.approx(s_cpu, rel=1e-12)
    check_module(SNNKLinear.from_linear(lin, "sin", 8, input_scale=s_cpu, generator=gen(38)), x)
    check_module(SNNKAdapter(6, 8, "sin", generator=gen(39), dtype=F64), x)
    adapter = SNNKAdapter(6, 8, "relu", generator=gen(40), dtype=F64)
    with torch.no_grad():
        adapter.gate.copy_(randn(6, seed=41))
    check_module(adapter, x)
    check_module(BottleneckAdapter(6, 3, generator=gen(42), dtype=F64), x)
    for act in ("relu", "sin", "cos"):
        check_module(FeedForward(lin, act), x)


def test_snnk_from_a_cuda_linear() -> None:
    lin = nn.Linear(6, 3, dtype=F64)
    ref = SNNKLinear.from_linear(lin, "sin", 8, generator=gen(43))
    got = SNNKLinear.from_linear(copy.deepcopy(lin).to(CUDA), "sin", 8, generator=gen(43))
    compare_modules(ref, got, randn(5, 6, seed=44))


def test_feed_forward_spectrum_cuda() -> None:
    lin = nn.Linear(6, 3, dtype=F64)
    check_module(FeedForward(lin, "gelu"), randn(5, 6, seed=45))


def test_bundle_cuda() -> None:
    snnk = SNNKLinear(6, 4, 8, "sin", generator=gen(46), dtype=F64)
    torch.manual_seed(47)
    head = nn.Linear(4, 2, dtype=F64)
    x = randn(5, 6, seed=48)
    ref = bundle([snnk, head])
    got = bundle([copy.deepcopy(snnk).to(CUDA), copy.deepcopy(head).to(CUDA)])
    compare_modules(ref, got, x)
    close(got(x.to(CUDA)), head(snnk(x)).detach(), rtol=1e-9, atol=1e-11)
    tower, linear = got.as_modules()
    module_on_cuda(tower)
    module_on_cuda(linear)
    close(linear(tower(x.to(CUDA))), ref(x).detach())


def test_bundle_feed_forward_layers_cuda() -> None:
    torch.manual_seed(49)
    l1, l2, head = nn.Linear(6, 4, dtype=F64), nn.Linear(4, 4, dtype=F64), nn.Linear(4, 2, dtype=F64)
    layers = [FeedForward(l1, "sin"), FeedForward(l2, "cos"), head]
    ref = bundle(layers, num_features=8, generator=gen(50))
    got = bundle([copy.deepcopy(m).to(CUDA) for m in layers], num_features=8, generator=gen(50))
    compare_modules(ref, got, randn(5, 6, seed=51, scale=0.3))


@pytest.mark.parametrize("ridge", [0.0, 0.1])
@pytest.mark.parametrize("activations", [["sin"], ["relu"], ["sin", "cos"]])
def test_bundled_network_fit_cuda(activations, ridge: float) -> None:
    net = BundledNetwork.untrained(5, 2, activations, 6, generator=gen(52), dtype=F64)
    x, y = randn(60, 5, seed=53, scale=0.3), randn(60, 2, seed=54)
    ref = copy.deepcopy(net).fit(x, y, ridge=ridge)
    got = copy.deepcopy(net).to(CUDA).fit(x.to(CUDA), y.to(CUDA), ridge=ridge)
    compare_modules(ref, got, x, rtol=1e-8, atol=1e-10)


def _least_squares_case(n: int, m: int, ridge: float, fit_bias: bool) -> None:
    feats, y = randn(n, m, seed=55), randn(n, 3, seed=56)
    w_ref, b_ref = least_squares(feats, y, ridge=ridge, fit_bias=fit_bias)
    w_got, b_got = least_squares(feats.to(CUDA), y.to(CUDA), ridge=ridge, fit_bias=fit_bias)
    close(w_got, w_ref, rtol=1e-8, atol=1e-10)
    close(b_got, b_ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "n,m,ridge,fit_bias",
    [
        (40, 12, 0.0, True), (40, 12, 0.0, False), (40, 12, 0.1, True), (40, 12, 0.1, False),
        # wide: the dual normal equations with a ridge, the minimum-norm solution without
        (10, 30, 0.1, True), (10, 30, 0.1, False), (10, 30, 0.0, False),
    ],
)
def test_least_squares_cuda(n: int, m: int, ridge: float, fit_bias: bool) -> None:
    _least_squares_case(n, m, ridge, fit_bias)


def test_least_squares_min_norm_rank_deficient_cuda() -> None:
    _least_squares_case(10, 30, 0.0, True)


def test_ridge_cv_cuda() -> None:
    feats, y = randn(30, 8, seed=57), randn(30, seed=58)
    ridges = [0.0, 1e-2, 1.0, 100.0]
    ref = ridge_cv(feats, y, ridges, folds=3, generator=gen(59))
    assert ridge_cv(feats.to(CUDA), y.to(CUDA), ridges, folds=3, generator=gen(59)) == ref


# ----------------------------------------------------------------------------- toeplitz
@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_matvec_cuda(causal: bool) -> None:
    n, c = 11, 3
    coeffs = randn(c, n if causal else 2 * n - 1, seed=60)
    x = randn(2, n, c, seed=61)
    fn = lambda k, v: toeplitz_matvec(k, v, causal=causal)  # noqa: E731
    check_module(_Fn(fn), coeffs, x)
    close(toeplitz_dense(coeffs.to(CUDA), n, causal=causal), toeplitz_dense(coeffs, n, causal=causal))


class _Fn(nn.Module):
    """A parameter-free function as a module, for :func:`check_module`."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _tno_modules():
    kw = dict(dtype=F64)
    rpe = dict(rpe_width=8, rpe_depth=2)
    out = {}
    for causal in (False, True):
        out[f"tno-causal={causal}"] = lambda causal=causal: TNO(
            3, causal=causal, decay=0.9, generator=gen(62), **rpe, **kw)
        for feature in ("omega", "cos"):
            out[f"fd-causal={causal}-{feature}"] = lambda causal=causal, feature=feature: FDTNO(
                3, causal=causal, feature=feature, generator=gen(62), **rpe, **kw)
    for low_rank in ("sparse", "dense"):
        for interpolation in ("linear", "cubic"):
            out[f"ski-{low_rank}-{interpolation}"] = lambda lr=low_rank, it=interpolation: SKITNO(
                3, rank=6, filter_size=4, decay=0.9, low_rank=lr, interpolation=it, generator=gen(62), **kw)
    return out


TNO_MODULES = _tno_modules()


@pytest.mark.parametrize("name", list(TNO_MODULES))
def test_tno_modules_cuda(name: str) -> None:
    module = TNO_MODULES[name]()
    if isinstance(module, SKITNO):  # give the piecewise-linear RPE some weight
        with torch.no_grad():
            module.rpe.values.mul_(10.0)
    check_module(module, randn(2, 16, 3, seed=63))
    check_module(module, randn(16, 3, seed=64))
    gpu = copy.deepcopy(module).to(CUDA)
    close(gpu.dense_matrix(16), module.dense_matrix(16).detach())
    empty = gpu(torch.zeros(0, 16, 3, dtype=F64, device=CUDA))
    assert empty.shape == (0, 16, 3)
    on_cuda(empty)
    if getattr(module, "causal", False):  # a change at the last token leaves the others unchanged
        x = randn(1, 16, 3, seed=65)
        x2 = x.clone()
        x2[:, -1] += 1.0
        close(gpu(x2.to(CUDA))[:, :-1], gpu(x.to(CUDA))[:, :-1].cpu())


@pytest.mark.parametrize("method", ["sparse", "dense"])
@pytest.mark.parametrize("interpolation", ["linear", "cubic"])
def test_ski_matvec_cuda(method: str, interpolation: str) -> None:
    a = randn(3, 2 * 5 - 1, seed=66)
    x = randn(2, 13, 3, seed=67)
    check_module(_Fn(lambda k, v: ski_matvec(k, v, method=method, interpolation=interpolation)), a, x)


def test_hilbert_and_causal_response_cuda() -> None:
    for size in (7, 8):
        x = randn(3, size, seed=68)
        check_module(_Fn(discrete_hilbert), x)
    real = randn(2, 9, seed=69)
    ref = causal_kernel_from_real_response(real)
    got = causal_kernel_from_real_response(real.to(CUDA))
    close(got, ref)
    check_module(_Fn(lambda r: torch.view_as_real(causal_kernel_from_real_response(r))), real)
    t = torch.arange(-5.0, 6.0, dtype=F64)
    close(inverse_time_warp(t.to(CUDA), 0.9), inverse_time_warp(t, 0.9))


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_rpe_mlp_and_decay_cuda(activation: str) -> None:
    mlp = rpe_mlp(activation, 8, 2, out_features=2, generator=gen(70), dtype=F64)
    check_module(mlp, randn(9, 1, seed=71))
    for feature in ("cos", "omega"):
        ref = frequency_response_decay(mlp, 16, feature=feature)
        got = frequency_response_decay(copy.deepcopy(mlp).to(CUDA), 16, feature=feature)
        for field in ("omega", "response", "kernel_abs"):
            close(getattr(got, field), getattr(ref, field), msg=field)
        assert torch.equal(got.lags.cpu(), ref.lags)


@pytest.mark.parametrize("tno,causal", [("tno", True), ("ski", False), ("fd", False)])
def test_tnn_encoder_cuda(tno: str, causal: bool) -> None:
    options = {"rank": 4, "filter_size": 4} if tno == "ski" else {"rpe_width": 8, "rpe_depth": 2}
    enc = TNNEncoder(11, 6, 2, tno=tno, causal=causal, tno_options=options, n_out=5, generator=gen(72), dtype=F64)
    tokens = torch.randint(11, (2, 12), generator=gen(73))
    check_module(enc, tokens, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------------------- hadamard
@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_cuda(normalized: bool) -> None:
    x = randn(3, 5, 64, seed=74)
    assert fwht_backend(x.to(CUDA)) == "torch"
    assert fwht_backend(x.to(CUDA), "torch") == "torch"
    for backend in ("auto", "torch"):
        check_module(_Fn(lambda v: fwht(v, normalized, backend=backend)), x)
        close(fwht(x.to(CUDA), normalized, backend=backend), fwht_torch(x, normalized))
    close(fwht_torch(x.to(CUDA), normalized), fwht_torch(x, normalized))
    close(fwht(fwht(x.to(CUDA))), x)  # the normalised transform is its own inverse
    x32 = x.float().to(CUDA)
    assert fwht(x32).dtype == torch.float32
    with pytest.raises(ValueError, match="CPU tensor"):
        fwht(x.to(CUDA), backend="compiled")
    with pytest.raises(ValueError, match="CPU tensor"):
        fwht_backend(x.to(CUDA), "compiled")


@pytest.mark.parametrize("transform", ["hadamard", "dct"])
def test_acdc_projection_cuda(transform: str) -> None:
    proj = ACDCProjection(20, 48, layers=2, transform=transform, init_noise=0.3, generator=gen(75), dtype=F64)
    check_module(proj, randn(7, 20, seed=76))
    check_module(proj, randn(2, 3, 20, seed=77))


def test_bh_and_dense_projection_cuda() -> None:
    for proj in (
        BHProjection(20, 40, block=4, m=3, generator=gen(78), dtype=F64),
        BHProjection(32, 16, block=16, m=2, generator=gen(79), dtype=F64),
        BH4(24, 64, block=8, generator=gen(80), dtype=F64),
        DenseProjection(20, 12, generator=gen(81), dtype=F64),
    ):
        d = proj.in_features
        check_module(proj, randn(6, d, seed=82))
        check_module(proj, randn(2, 3, d, seed=83))
    proj = BHProjection(32, 16, block=16, m=2, generator=gen(84), dtype=F64).to(CUDA)
    with pytest.raises(ValueError, match="runs on the CPU"):
        bh_project_fused(randn(4, 32, seed=85).to(CUDA), proj)


# ----------------------------------------------------------------------------- lookup
@pytest.mark.parametrize("scaled", [True, False])
def test_lookup_functions_cuda(scaled: bool) -> None:
    h, tau, d_out = 3, 4, 5
    z = randn(2, 7, h * tau, seed=86)
    tables = randn(h, 2**tau, d_out, seed=87)
    assert torch.equal(hash_codes(z.to(CUDA), tau).cpu(), hash_codes(z, tau))
    on_cuda(hash_codes(z.to(CUDA), tau))
    close(lookup_weights(z.to(CUDA), tau, scaled), lookup_weights(z, tau, scaled))
    check_module(_Fn(lambda a, t: lookup_gather(a, t, scaled)), z, tables)
    check_module(_Fn(lambda a, t: lookup_gather_naive(a, t, scaled)), z, tables)
    check_module(_Fn(lambda a, t: lookup_softmax(a, t, scaled)), z, tables)
    # the fast path and the literal formula agree on the GPU too
    close(lookup_gather(z.to(CUDA), tables.to(CUDA), scaled), lookup_gather_naive(z, tables, scaled))


@pytest.mark.parametrize("projection", ["bh4", "dense"])
def test_lookup_ffn_cuda(projection: str) -> None:
    layer = LookupFFN(32, 4, 4, d_out=24, projection=projection, block=16, generator=gen(88), dtype=F64)
    gpu = copy.deepcopy(layer).to(CUDA)
    x = randn(2, 5, 32, seed=89)
    for backend in ("torch", "naive"):
        cpu_fn, gpu_fn = _Fn(lambda v: layer(v, backend=backend)), _Fn(lambda v: gpu(v, backend=backend))
        for p in layer.parameters():
            p.grad = None
        for p in gpu.parameters():
            p.grad = None
        compare_modules(cpu_fn, gpu_fn, x)
        for (name, p), q in zip(layer.named_parameters(), gpu.parameters()):
            close(q.grad, p.grad, msg=f"{backend}: grad of {name}")
    ref = layer(x, backend="torch").detach()
    with torch.no_grad():  # "auto" without gradients: the fused kernel is CPU only, torch on CUDA
        close(gpu(x.to(CUDA)), ref)
        close(gpu(x.to(CUDA), backend="auto"), ref)
    with pytest.raises(ValueError, match="runs on the CPU"):
        with torch.no_grad():
            gpu(x.to(CUDA), backend="fused")
    z = layer.codes(x).detach().reshape(-1, 16)
    with pytest.raises(ValueError, match="runs on the CPU"):
        lookup_forward_fused(z.to(CUDA), layer.tables.detach().to(CUDA))
    codes = hash_codes(z, 4)
    weights = lookup_weights(z, 4)
    with pytest.raises(ValueError, match="runs on the CPU"):
        gather_fused(codes.to(CUDA), weights.to(CUDA), layer.tables.detach().to(CUDA))


def test_ffn_baselines_cuda() -> None:
    x = randn(3, 4, 16, seed=90)
    for module in (
        VanillaFFN(16, 32, generator=gen(91), dtype=F64),
        BlockDiagonalFFN(16, 32, 4, generator=gen(92), dtype=F64),
        Top1MoEFFN(16, 8, 4, generator=gen(93), dtype=F64),
        LSHSparseFFN(16, 32, 2, 3, generator=gen(94), dtype=F64),
    ):
        if isinstance(module, LSHSparseFFN):
            gpu = copy.deepcopy(module).to(CUDA)
            mask = gpu.active_mask(x.to(CUDA))
            on_cuda(mask)
            assert torch.equal(mask.cpu(), module.active_mask(x))
        check_module(module, x)


# ----------------------------------------------------------------------------- fusion
def _mlp(p: int = 6, p_inner: int = 20, seed: int = 95) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(p, p_inner), nn.GELU(), nn.Linear(p_inner, p)).to(F64)


def test_kmeans_cuda() -> None:
    points = randn(40, 5, seed=96)
    points[20:] += 4.0
    for init in ("k-means++", "random"):
        ref = kmeans(points, 4, init=init, generator=gen(97))
        got = kmeans(points.to(CUDA), 4, init=init, generator=gen(97))
        assert torch.equal(got.labels.cpu(), ref.labels)
        torch.testing.assert_close(got.centroids.cpu(), ref.centroids, rtol=RTOL, atol=ATOL)
        assert got.inertia == pytest.approx(ref.inertia, rel=1e-12)
        assert got.n_iter == ref.n_iter


@pytest.mark.parametrize("method", METHODS)
def test_compress_mlp_cuda(method: str) -> None:
    mlp = _mlp()
    gpu_mlp = copy.deepcopy(mlp).to(CUDA)
    kw = dict(method=method, mmd_steps=5)
    l1, l2 = compress_mlp(mlp[0], mlp[2], 8, generator=gen(98), **kw)
    g1, g2 = compress_mlp(gpu_mlp[0], gpu_mlp[2], 8, generator=gen(98), **kw)
    compare_modules(nn.Sequential(l1, nn.GELU(), l2), nn.Sequential(g1, nn.GELU(), g2), randn(7, 6, seed=99))
    # with k = p_I the exact methods reproduce the MLP on the GPU
    if method in ("fusion", "random", "pruning", "mmd"):
        e1, e2 = compress_mlp(gpu_mlp[0], gpu_mlp[2], 20, generator=gen(98), **kw)
        x = randn(7, 6, seed=100)
        close(nn.Sequential(e1, nn.GELU(), e2)(x.to(CUDA)), mlp(x).detach(), rtol=1e-9, atol=1e-11)


def test_fusion_kernels_and_gradients_cuda() -> None:
    mlp = _mlp()
    gpu_mlp = copy.deepcopy(mlp).to(CUDA)
    x, u = randn(7, 6, seed=101), randn(6, seed=102)
    close(sub_mlp_embeddings(gpu_mlp[0], gpu_mlp[2]), sub_mlp_embeddings(mlp[0], mlp[2]).detach())
    g_ref = mlp_gradients(mlp, lambda m: m(x) @ u)
    g_got = mlp_gradients(gpu_mlp, lambda m: m(x.to(CUDA)) @ u.to(CUDA))
    close(g_got, g_ref)
    g2_ref = mlp_gradients(mlp, lambda m: m(x[:3]) @ u)
    g2_got = mlp_gradients(gpu_mlp, lambda m: m(x[:3].to(CUDA)) @ u.to(CUDA))
    close(sgd_kernel(g_got), sgd_kernel(g_ref))
    close(sgd_kernel(g_got, g2_got), sgd_kernel(g_ref, g2_ref))
    close(sign_kernel(g_got, g2_got), sign_kernel(g_ref, g2_ref))
    k_ref, k_new = sgd_kernel(g_ref), sign_kernel(g_ref)
    k_ref_g, k_new_g = sgd_kernel(g_got), sign_kernel(g_got)
    assert kernel_error(k_ref_g, k_new_g) == pytest.approx(kernel_error(k_ref, k_new), rel=1e-10)
    assert kernel_cosine(k_ref_g, k_new_g) == pytest.approx(kernel_cosine(k_ref, k_new), rel=1e-10)
    a, b = randn(9, 4, seed=103), randn(5, 4, seed=104)
    check_module(_Fn(lambda p, q: mmd2(p, q, 1.5)), a, b)
    s_ref = mmd_support(a, 3, steps=5, generator=gen(105))
    s_got = mmd_support(a.to(CUDA), 3, steps=5, generator=gen(105))
    torch.testing.assert_close(s_got.points.cpu(), s_ref.points, rtol=RTOL, atol=ATOL)
    assert s_got.history == pytest.approx(s_ref.history, rel=1e-10)


def test_ffn_output_error_with_mask_cuda() -> None:
    mlp = _mlp()
    l1, l2 = compress_mlp(mlp[0], mlp[2], 8, generator=gen(106))
    small = nn.Sequential(l1, nn.GELU(), l2)
    x = randn(3, 4, 6, seed=107)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=F64)
    ref = ffn_output_error(mlp, small, x, mask)
    got = ffn_output_error(copy.deepcopy(mlp).to(CUDA), copy.deepcopy(small).to(CUDA), x.to(CUDA), mask.to(CUDA))
    assert got == pytest.approx(ref, rel=1e-10)


def test_ffn_output_error_without_mask_cuda() -> None:
    mlp = _mlp()
    l1, l2 = compress_mlp(mlp[0], mlp[2], 8, generator=gen(108))
    small = nn.Sequential(l1, nn.GELU(), l2)
    x = randn(3, 4, 6, seed=109)
    ref = ffn_output_error(mlp, small, x)
    got = ffn_output_error(copy.deepcopy(mlp).to(CUDA), copy.deepcopy(small).to(CUDA), x.to(CUDA))
    assert got == pytest.approx(ref, rel=1e-10)

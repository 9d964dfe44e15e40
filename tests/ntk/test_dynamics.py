"""Tests of :mod:`kernels.ntk.dynamics` (closed-form MSE dynamics, the linearized network, the ensemble).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from kernels.ntk import (
    LinearizedModel,
    empirical_ntk,
    fc_kernel,
    GaussianPrediction,
    fc_network,
    gd_mse_ensemble,
    gd_mse_predictor,
    linearize,
    mse_loss_curve,
)

from ntk_helpers import F64, gen, nt_mlp, randn, torch_params_to_nt


def _regression_problem(n_train=12, n_test=5, k=None, seed=0):
    x = randn(n_train + n_test, 4, seed=seed)
    res = fc_kernel(x, depth=2, b_std=0.1)
    theta = res.ntk
    shape = (n_train,) if k is None else (n_train, k)
    y = randn(*shape, seed=seed + 1)
    f0 = 0.3 * randn(*shape, seed=seed + 2)
    f0_test = 0.3 * randn(*((n_test,) + shape[1:]), seed=seed + 3)
    return theta[:n_train, :n_train], theta[n_train:, :n_train], y, f0, f0_test


@pytest.mark.parametrize("k", [None, 3])
def test_gd_mse_predictor_matches_neural_tangents(nt_ref, k):
    nt, jnp = nt_ref["nt"], nt_ref["jnp"]
    k_tt, k_st, y, f0, f0_test = _regression_problem(k=k)
    n_outputs = 1 if k is None else k
    eta = 0.7
    # float64 times: with float32 ones neural-tangents would form t * lr in float32.
    times = torch.tensor([0.0, 0.5, 3.0, 40.0], dtype=F64)
    # neural-tangents normalises the loss by y_train.size = N k, we by N.
    y_nt = y.numpy() if k is not None else y.numpy()[:, None]
    predict_nt = nt.predict.gradient_descent_mse(
        jnp.asarray(k_tt.numpy()), jnp.asarray(y_nt), learning_rate=eta * n_outputs
    )
    f0_nt = f0.numpy() if k is not None else f0.numpy()[:, None]
    f0t_nt = f0_test.numpy() if k is not None else f0_test.numpy()[:, None]
    ref_train, ref_test = predict_nt(times.numpy(), f0_nt, f0t_nt, jnp.asarray(k_st.numpy()))
    predict = gd_mse_predictor(
        k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test
    )
    f_train, f_test = predict(times)
    assert f_train.shape == (4,) + tuple(y.shape) and f_test.shape == (4,) + tuple(f0_test.shape)
    np.testing.assert_allclose(f_train.reshape(ref_train.shape), ref_train, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(f_test.reshape(ref_test.shape), ref_test, rtol=1e-7, atol=1e-9)
    inf_train, inf_test = predict(float("inf"))
    ref_inf_train, ref_inf_test = predict_nt(None, f0_nt, f0t_nt, jnp.asarray(k_st.numpy()))
    tol = dict(rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(inf_test.reshape(ref_inf_test.shape), ref_inf_test, **tol)
    np.testing.assert_allclose(inf_train.reshape(ref_inf_train.shape), ref_inf_train, **tol)
    one_train, one_test = predict(3.0)
    torch.testing.assert_close(one_train, f_train[2])
    torch.testing.assert_close(one_test, f_test[2])


def test_gd_mse_predictor_kernel_regression_and_initial_condition():
    k_tt, k_st, y, f0, f0_test = _regression_problem()
    predict = gd_mse_predictor(k_tt, y, ntk_test_train=k_st)
    f_train, f_test = predict(float("inf"))
    torch.testing.assert_close(f_train, y)
    torch.testing.assert_close(f_test, k_st @ torch.linalg.solve(k_tt, y))
    predict0 = gd_mse_predictor(k_tt, y, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test)
    f_train0, f_test0 = predict0(0.0)
    torch.testing.assert_close(f_train0, f0)
    torch.testing.assert_close(f_test0, f0_test)
    only_train, none = gd_mse_predictor(k_tt, y)(2.0)
    assert none is None and only_train.shape == y.shape


def test_gd_mse_predictor_matches_discrete_gradient_descent_of_linear_model():
    # Linear model f(x) = phi(x) . w: its NTK is exactly Phi Phi^T, and GD with step eta on
    # L = ||f - y||^2 / (2N) for s steps approximates the flow at time t = s.
    n, p = 10, 30
    phi = randn(n, p, seed=20) / math.sqrt(p)
    phi_test = randn(4, p, seed=21) / math.sqrt(p)
    y = randn(n, seed=22)
    w = 0.1 * randn(p, seed=23)
    eta, steps = 0.05, 600
    predict = gd_mse_predictor(
        phi @ phi.T, y, learning_rate=eta, ntk_test_train=phi_test @ phi.T,
        f0_train=phi @ w, f0_test=phi_test @ w,
    )
    times = torch.tensor([0.0, float(steps)], dtype=F64)
    curve = mse_loss_curve(phi @ phi.T, y, phi @ w, times, learning_rate=eta)
    w_t = w.clone()
    for _ in range(steps):
        w_t = w_t - eta * phi.T @ (phi @ w_t - y) / n
    f_train, f_test = predict(float(steps))
    torch.testing.assert_close(f_train, phi @ w_t, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(f_test, phi_test @ w_t, rtol=2e-3, atol=2e-3)
    loss_gd = float(((phi @ w_t - y) ** 2).sum() / (2 * n))
    assert abs(float(curve[1]) - loss_gd) < 2e-3 * max(loss_gd, 1e-3) + 1e-6
    assert abs(float(curve[0]) - float(((phi @ w - y) ** 2).sum() / (2 * n))) < 1e-12


def test_linearized_network_trained_with_sgd_follows_the_predictor():
    # The linearized network under full-batch SGD is discrete GD on a linear model whose
    # kernel is the empirical NTK at initialization (Lee et al. 2019, section 2.2).
    net = fc_network(3, 32, 2, b_std=0.2, generator=gen(30))
    x, x_test = randn(8, 3, seed=31), randn(3, 3, seed=32)
    y = randn(8, seed=33)
    lin = linearize(net)
    theta = empirical_ntk(net, x)
    theta_test = empirical_ntk(net, x_test, x)
    with torch.no_grad():
        f0, f0_test = net(x)[:, 0], net(x_test)[:, 0]
    eta, steps = 0.08, 30
    predict = gd_mse_predictor(
        theta, y, learning_rate=eta, ntk_test_train=theta_test, f0_train=f0, f0_test=f0_test
    )
    opt = torch.optim.SGD(lin.parameters(), lr=eta)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((lin(x)[:, 0] - y) ** 2).sum() / (2 * len(y))
        loss.backward()
        opt.step()
    with torch.no_grad():
        trained, trained_test = lin(x)[:, 0], lin(x_test)[:, 0]
    # Exact discrete-time solution: f_s = y + (I - eta Theta / N)^s (f0 - y).
    step_matrix = torch.linalg.matrix_power(torch.eye(8, dtype=F64) - eta * theta / 8, steps)
    torch.testing.assert_close(trained, y + step_matrix @ (f0 - y), rtol=1e-8, atol=1e-8)
    f_train, f_test = predict(float(steps))
    assert float((trained - f0).abs().max()) > 0.1  # training did move the outputs
    torch.testing.assert_close(trained, f_train, rtol=0.02, atol=0.02)
    torch.testing.assert_close(trained_test, f_test, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("k", [None, 2])
def test_mse_loss_curve_matches_predictor(k):
    k_tt, _, y, f0, _ = _regression_problem(k=k, seed=5)
    times = torch.tensor([0.0, 0.3, 2.0, 25.0, float("inf")])
    curve = mse_loss_curve(k_tt, y, f0, times, learning_rate=1.5)
    f_train, _ = gd_mse_predictor(k_tt, y, learning_rate=1.5, f0_train=f0)(times)
    n = y.shape[0]
    direct = ((f_train - y) ** 2).reshape(len(times), -1).sum(1) / (2 * n)
    torch.testing.assert_close(curve, direct, rtol=1e-9, atol=1e-12)
    assert torch.all(curve[1:] <= curve[:-1])
    assert float(curve[-1]) < 1e-10
    scalar = mse_loss_curve(k_tt, y, f0, 2.0, learning_rate=1.5)
    assert scalar.ndim == 0 and abs(float(scalar) - float(curve[2])) < 1e-12
    zero_f0 = mse_loss_curve(k_tt, y, None, 0.0)
    assert abs(float(zero_f0) - float((y**2).sum() / (2 * n))) < 1e-12


def test_predictor_on_singular_kernel_is_finite():
    # A rank-deficient kernel: the null-space part of the residual must stay put.
    phi = randn(6, 2, seed=40)
    theta = phi @ phi.T
    y = randn(6, seed=41)
    predict = gd_mse_predictor(theta, y, ntk_test_train=randn(2, 2, seed=42) @ phi.T)
    for t in (0.0, 1.0, float("inf")):
        f_train, f_test = predict(t)
        assert torch.isfinite(f_train).all() and torch.isfinite(f_test).all()
    f_inf, _ = predict(float("inf"))
    proj = phi @ torch.linalg.pinv(phi)
    torch.testing.assert_close(f_inf, proj @ y)


def test_predictor_bad_arguments():
    k_tt, k_st, y, f0, f0_test = _regression_problem()
    with pytest.raises(ValueError, match="square"):
        gd_mse_predictor(k_tt[:, :5], y)
    with pytest.raises(ValueError, match="y_train"):
        gd_mse_predictor(k_tt, y[:5])
    with pytest.raises(TypeError, match="y_train"):
        gd_mse_predictor(k_tt, torch.ones(12, dtype=torch.int64))
    with pytest.raises(ValueError, match="learning_rate"):
        gd_mse_predictor(k_tt, y, learning_rate=0.0)
    with pytest.raises(ValueError, match="ntk_test_train"):
        gd_mse_predictor(k_tt, y, ntk_test_train=k_st[:, :3])
    with pytest.raises(ValueError, match="f0_test"):
        gd_mse_predictor(k_tt, y, f0_test=f0_test)
    with pytest.raises(ValueError, match="f0_train"):
        gd_mse_predictor(k_tt, y, f0_train=f0[:3])
    with pytest.raises(ValueError, match="NaN"):
        gd_mse_predictor(k_tt.clone().fill_(float("nan")), y)
    predict = gd_mse_predictor(k_tt, y)
    with pytest.raises(ValueError, match="t must"):
        predict(-1.0)
    with pytest.raises(ValueError, match="t must"):
        predict(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="t must"):
        predict(torch.ones(2, 2))
    with pytest.raises(TypeError, match="t must"):
        predict("1")
    with pytest.raises(ValueError, match="times|t must"):
        mse_loss_curve(k_tt, y, f0, -2.0)


def _perturb(lin: LinearizedModel, scale: float, seed: int) -> list[torch.Tensor]:
    directions = []
    with torch.no_grad():
        for i, p in enumerate(lin.params):
            v = randn(*p.shape, seed=seed + i)
            p.add_(scale * v)
            directions.append(v)
    return directions


def test_linearize_is_the_first_order_taylor_expansion():
    net = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    x = randn(5, 3, seed=51)
    lin = linearize(net)
    assert isinstance(lin, nn.Module)
    assert len(list(p for p in lin.parameters() if p.requires_grad)) == len(list(net.parameters()))
    torch.testing.assert_close(lin(x), net(x))
    # Affine in theta: f_lin(theta0 + 2 eps v) - f0 = 2 (f_lin(theta0 + eps v) - f0).
    eps = 1e-4
    v = _perturb(lin, eps, seed=60)
    step1 = lin(x) - net(x)
    _perturb(lin, eps, seed=60)
    step2 = lin(x) - net(x)
    torch.testing.assert_close(step2, 2 * step1, rtol=1e-10, atol=1e-14)
    # Finite difference of the original network in the same direction.
    moved = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    with torch.no_grad():
        for p, d in zip(moved.parameters(), v):
            p.add_(eps * d)
    fd = moved(x) - net(x)
    torch.testing.assert_close(step1, fd, rtol=1e-3, atol=1e-9)
    # The original model is untouched and its NTK is the linearized model's NTK.
    fresh = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    torch.testing.assert_close(net(x), fresh(x))
    torch.testing.assert_close(empirical_ntk(lin, x, method="jacobian"), empirical_ntk(net, x))


def test_linearize_matches_neural_tangents(nt_ref):
    nt, stax, jnp, jax = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"], nt_ref["jax"]
    net = fc_network(4, 20, 2, 2, W_std=1.3, b_std=0.2, generator=gen(70))
    _, apply_fn, _ = nt_mlp(stax, 20, 2, 2, "relu", 1.3, 0.2, "ntk")
    params0 = torch_params_to_nt(net, jnp)
    lin = linearize(net)
    _perturb(lin, 0.3, seed=80)
    moved = fc_network(4, 20, 2, 2, W_std=1.3, b_std=0.2, generator=gen(70))
    with torch.no_grad():
        for dst, src in zip(moved.parameters(), lin.params):
            dst.copy_(src)
    params = torch_params_to_nt(moved, jnp)
    f_lin_nt = nt.linearize(apply_fn, params0)
    x = randn(6, 4, seed=81)
    ref = np.asarray(f_lin_nt(params, x.numpy()))
    np.testing.assert_allclose(lin(x).detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    # ... and it differs from the moved nonlinear network (the check is not vacuous).
    assert not np.allclose(moved(x).detach().numpy(), ref, rtol=1e-3)


def test_linearize_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        linearize(lambda z: z)
    frozen = nn.Linear(2, 2)
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="trainable"):
        linearize(frozen)


@pytest.mark.parametrize("eta", [0.05, 0.9, 2.5])
@pytest.mark.parametrize("k", [None, 3])
def test_discrete_predictor_matches_explicit_gradient_descent(eta, k):
    # A linear model's GD is exactly f_{s+1} = f_s - eta/N Theta (f_s - Y): iterate it.
    k_tt, k_st, y, f0, f0_test = _regression_problem(k=k, seed=11)
    n = y.shape[0]
    predict = gd_mse_predictor(
        k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test,
        discrete=True,
    )
    steps = [0, 1, 2, 7, 30]
    f_train, f_test = predict(torch.tensor(steps, dtype=F64))
    curve = mse_loss_curve(k_tt, y, f0, torch.tensor(steps, dtype=F64), learning_rate=eta,
                           discrete=True)
    ft, fs = f0.clone(), f0_test.clone()
    for s in range(steps[-1] + 1):
        if s in steps:
            i = steps.index(s)
            scale = 1 + float(ft.abs().max())
            torch.testing.assert_close(f_train[i], ft, rtol=1e-9, atol=1e-9 * scale)
            torch.testing.assert_close(f_test[i], fs, rtol=1e-9, atol=1e-9 * scale)
            loss = float(((ft - y) ** 2).sum() / (2 * n))
            assert abs(float(curve[i]) - loss) <= 1e-9 * (1 + loss)
        residual = ft - y
        ft = ft - eta / n * k_tt @ residual
        fs = fs - eta / n * k_st @ residual


def test_discrete_predictor_approaches_flow_and_diverges_past_two():
    k_tt, k_st, y, f0, f0_test = _regression_problem(seed=12)
    n = y.shape[0]
    lam_max = float(torch.linalg.eigvalsh(k_tt)[-1])
    # Small steps: s steps of size eta/r approximate the flow at time s/r.
    eta = 0.5 * n / lam_max
    flow = gd_mse_predictor(k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0,
                            f0_test=f0_test)
    fine = gd_mse_predictor(k_tt, y, learning_rate=eta / 200, ntk_test_train=k_st,
                            f0_train=f0, f0_test=f0_test, discrete=True)
    for a, b in zip(flow(4.0), fine(800.0)):
        torch.testing.assert_close(a, b, rtol=5e-3, atol=5e-3)
    # t = inf: kernel regression below eta lambda_max / N = 2, NaN (divergence) above it.
    stable = gd_mse_predictor(k_tt, y, learning_rate=1.9 * n / lam_max, ntk_test_train=k_st,
                              discrete=True)(float("inf"))
    torch.testing.assert_close(stable[1], k_st @ torch.linalg.solve(k_tt, y))
    unstable = gd_mse_predictor(k_tt, y, learning_rate=2.1 * n / lam_max, ntk_test_train=k_st,
                                discrete=True)
    assert torch.isnan(unstable(float("inf"))[1]).all()
    grown = mse_loss_curve(k_tt, y, None, torch.tensor([0.0, 50.0]), learning_rate=2.1 * n / lam_max,
                           discrete=True)
    assert float(grown[1]) > 10 * float(grown[0])


def test_discrete_predictor_bad_arguments():
    k_tt, k_st, y, _, _ = _regression_problem()
    with pytest.raises(ValueError, match="whole numbers"):
        gd_mse_predictor(k_tt, y, discrete=True)(0.5)
    with pytest.raises(ValueError, match="whole numbers"):
        mse_loss_curve(k_tt, y, None, torch.tensor([1.0, 2.5]), discrete=True)
    with pytest.raises(TypeError, match="discrete"):
        gd_mse_predictor(k_tt, y, discrete=1)
    with pytest.raises(TypeError, match="discrete"):
        mse_loss_curve(k_tt, y, None, 1.0, discrete="yes")


def _ensemble_problem(activation="relu", depth=2, n_train=10, n_test=6, seed=0):
    x = randn(n_train + n_test, 3, seed=seed)
    res = fc_kernel(x, depth=depth, activation=activation, W_std=1.2, b_std=0.1)
    tr, te = slice(0, n_train), slice(n_train, None)
    return x, res, tr, te


@pytest.mark.parametrize("activation,depth", [("relu", 1), ("relu", 3), ("erf", 2)])
@pytest.mark.parametrize("k", [None, 2])
def test_gd_mse_ensemble_matches_neural_tangents(nt_ref, activation, depth, k):
    nt, stax, jnp = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"]
    x, res, tr, te = _ensemble_problem(activation, depth)
    n_outputs = 1 if k is None else k
    y = randn(*((10,) if k is None else (10, k)), seed=3)
    eta = 0.8
    predict = gd_mse_ensemble(
        res.nngp[tr, tr], res.ntk[tr, tr], y, nngp_test_train=res.nngp[te, tr],
        ntk_test_train=res.ntk[te, tr], nngp_test_test=res.nngp[te, te], learning_rate=eta,
    )
    _, _, kernel_fn = nt_mlp(stax, 64, depth, 1, activation, 1.2, 0.1, "ntk")
    y_nt = y.numpy()[:, None] if k is None else y.numpy()
    predict_nt = nt.predict.gradient_descent_mse_ensemble(
        kernel_fn, jnp.asarray(x[tr].numpy()), jnp.asarray(y_nt), learning_rate=eta * n_outputs,
        diag_reg=0.0,
    )
    for t in (0.0, 0.7, 5.0, 60.0, None):
        ours = predict(float("inf") if t is None else t)
        assert isinstance(ours, GaussianPrediction)
        ref = predict_nt(t=t, x_test=jnp.asarray(x[te].numpy()), get="ntk", compute_cov=True)
        np.testing.assert_allclose(ours.mean.reshape(ref.mean.shape), ref.mean, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(ours.covariance, ref.covariance, rtol=1e-6, atol=1e-8)


def test_gd_mse_ensemble_closed_form_limits_and_time_axis():
    x, res, tr, te = _ensemble_problem(seed=4)
    y = randn(10, 3, seed=5)
    args = dict(nngp_test_train=res.nngp[te, tr], ntk_test_train=res.ntk[te, tr],
                nngp_test_test=res.nngp[te, te], learning_rate=1.3)
    predict = gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **args)
    # t = 0: the NNGP prior, mean zero.
    start = predict(0.0)
    torch.testing.assert_close(start.mean, torch.zeros(6, 3, dtype=F64))
    torch.testing.assert_close(start.covariance, res.nngp[te, te])
    # t = inf: Lee et al. eq. 16 with A = Theta* Theta^-1, written with explicit inverses.
    a = res.ntk[te, tr] @ torch.linalg.inv(res.ntk[tr, tr])
    k_xx, k_sx = res.nngp[tr, tr], res.nngp[te, tr]
    cov_inf = res.nngp[te, te] + a @ k_xx @ a.T - a @ k_sx.T - k_sx @ a.T
    end = predict(float("inf"))
    torch.testing.assert_close(end.mean, a @ y, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(end.covariance, cov_inf, rtol=1e-7, atol=1e-9)
    # Time axis, and the mean equals gd_mse_predictor with f0 = 0 (flow and discrete).
    for discrete, times in ((False, [0.0, 2.5, 40.0]), (True, [0.0, 3.0, 40.0])):
        many = gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, discrete=discrete, **args)(
            torch.tensor(times, dtype=F64))
        assert many.mean.shape == (3, 6, 3) and many.covariance.shape == (3, 6, 6)
        _, f_test = gd_mse_predictor(res.ntk[tr, tr], y, learning_rate=1.3, discrete=discrete,
                                     ntk_test_train=res.ntk[te, tr])(torch.tensor(times, dtype=F64))
        torch.testing.assert_close(many.mean, f_test)
        torch.testing.assert_close(many.covariance, many.covariance.transpose(1, 2))
        assert float(torch.linalg.eigvalsh(many.covariance).min()) > -1e-9


def test_gd_mse_ensemble_matches_monte_carlo_of_linear_model():
    # Independent check of the covariance: a linear model with Gaussian initial outputs
    # f0 ~ N(0, K) trained by discrete GD, sampled many times.
    x, res, tr, te = _ensemble_problem(seed=6, n_train=5, n_test=3)
    k_full, theta = res.nngp, res.ntk
    y = randn(5, seed=7)
    eta, steps, samples = 1.0, 6, 200000
    chol = torch.linalg.cholesky(k_full + 1e-12 * torch.eye(8, dtype=F64))
    f0 = randn(samples, 8, seed=8) @ chol.T  # (S, N + M)
    ft, fs = f0[:, :5].clone(), f0[:, 5:].clone()
    for _ in range(steps):
        residual = ft - y
        ft = ft - eta / 5 * residual @ theta[tr, tr].T
        fs = fs - eta / 5 * residual @ theta[te, tr].T
    pred = gd_mse_ensemble(k_full[tr, tr], theta[tr, tr], y, nngp_test_train=k_full[te, tr],
                           ntk_test_train=theta[te, tr], nngp_test_test=k_full[te, te],
                           learning_rate=eta, discrete=True)(float(steps))
    emp_cov = torch.cov(fs.T)
    scale = float(pred.covariance.diagonal().max())
    torch.testing.assert_close(fs.mean(0), pred.mean, rtol=0, atol=0.02 * math.sqrt(scale))
    torch.testing.assert_close(emp_cov, pred.covariance, rtol=0, atol=0.02 * scale)


def test_gd_mse_ensemble_bad_arguments():
    x, res, tr, te = _ensemble_problem()
    y = randn(10, seed=9)
    good = dict(nngp_test_train=res.nngp[te, tr], ntk_test_train=res.ntk[te, tr],
                nngp_test_test=res.nngp[te, te])
    with pytest.raises(ValueError, match="nngp_train_train"):
        gd_mse_ensemble(res.nngp[:3, :3], res.ntk[tr, tr], y, **good)
    with pytest.raises(ValueError, match="nngp_test_test"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **{**good, "nngp_test_test": res.nngp[:2, :2]})
    with pytest.raises(ValueError, match="ntk_test_train"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **{**good, "ntk_test_train": res.ntk[te, :3]})
    with pytest.raises(ValueError, match="learning_rate"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, learning_rate=-1.0, **good)
    with pytest.raises(ValueError, match="whole numbers"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, discrete=True, **good)(1.5)

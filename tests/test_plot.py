"""benchmark/plot.py on event files the test writes: two variants, two seeds, three points each."""
import os
import sys

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
    #   a_c1: seed 1 mean(20, 30) = 25, seed 2 mean(40, 50) = 45 -> 35.0 +- std(25, 45) = 10.0
    #   a_c4: seed 1 mean(10, 20) = 15, seed 2 mean(10, 10) = 10 -> 12.5 +- 2.5
    # Fig. 3 measure of family "a": return at c = 1 minus return at c = 4 = 35.0 - 12.5 = 22.5, with standard error
    #   sqrt(s1^2/2 + s4^2/2), sample variances s1^2 = ((25-35)^2 + (45-35)^2)/1 = 200, s4^2 = (2.5^2 * 2)/1 = 12.5:
    #   sqrt(100 + 6.25) = 10.31
    out_png = runs / "docs" / "curves.png"
    plot.main([str(runs), "--window", "0.5", "--divisor-regex", r"_c(\d+)$", "--out", str(out_png), "--title", "t"])
    printed = capsys.readouterr().out
    assert "| a_c1 | 2 | 35.0 +- 10.0 |" in printed
    assert "| a_c4 | 2 | 12.5 +- 2.5 |" in printed
    assert "| a | 1-4 | 35.0 | 12.5 | 22.5 +- 10.3 |" in printed
    assert out_png.stat().st_size > 1000  # a PNG was drawn


def test_binned_curve_means_per_bin():
    # bins [0, 50), [50, 100]: values at 0 and 49 -> mean(1, 3) = 2; at 50 and 100 -> mean(5, 7) = 6
    import numpy as np

    edges = np.array([0.0, 50.0, 100.0 + 1e-9])
    curve = plot.binned_curve(np.array([0.0, 49.0, 50.0, 100.0]), np.array([1.0, 3.0, 5.0, 7.0]), edges)
    assert curve.tolist() == [2.0, 6.0]


def test_no_matching_run_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no run directory"):
        plot.main([str(tmp_path)])


def test_pivot_grid_in_natural_order(runs, capsys):
    # rows "a", columns "c1", "c4" from the variant names a_c1, a_c4; same numbers as above (window 0.5)
    plot.main([str(runs), "--window", "0.5", "--pivot", r"^(\w)_(c\d+)$"])
    assert "| | c1 | c4 |\n|---|---:|---:|\n| a | 35.0 +- 10.0 | 12.5 +- 2.5 |" in capsys.readouterr().out
    assert plot.natural_key("k16") > plot.natural_key("k2")


def test_first_step_reaching_a_threshold():
    # means of the last 2 values: (10+20)/2 = 15 at step 50, (20+30)/2 = 25 at step 100 -> 25 >= 20 first at 100
    import numpy as np

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
    assert "±1 std over seeds" in text
    assert "where each seed's 100-episode running mean first reaches 450 (not the binned curve" in text


def test_the_default_grouping_keeps_envs_apart_and_a_pattern_that_mixes_them_is_refused(tmp_path, capsys):
    write_run(tmp_path, "CartPole-v1__speed__1__100", [(0, 10), (100, 500)])
    write_run(tmp_path, "starpilot__speed__1__101", [(0, 2), (100, 3)])
    plot.main([str(tmp_path)])  # two envs: a variant per env id and exp_name
    assert "| CartPole-v1__speed | 1 | 500.0 |\n| starpilot__speed | 1 | 3 |" in capsys.readouterr().out
    # grouped by exp_name alone, "speed" would average CartPole with starpilot; the message's patterns paste back
    with pytest.raises(SystemExit, match=r"^--group '__\(\.\+\)__\\d\+__\\d\+\$' puts runs of different envs "
                                         r"\(CartPole-v1, starpilot\) into the variant 'speed'; anchor the pattern on "
                                         r"one env id, e\.g\. '\^CartPole-v1__\(\.\.\.\)'\.$"):
        plot.main([str(tmp_path), "--group", plot.EXP_NAME])
    assert capsys.readouterr().out == ""  # refused before any table is printed
    # one env per variant is fine, even when the variants are different envs (vmpo.sh groups by env)
    plot.main([str(tmp_path), "--group", r"^([A-Za-z]+)(?:-v\d+)?__speed__\d+__\d+$"])
    assert "| CartPole | 1 | 500.0 |" in capsys.readouterr().out


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

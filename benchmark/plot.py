"""Learning curves and tables from TensorBoard event files, or from the run data committed in benchmark/results/.

Runs are grouped into variants by a regular expression over their directory names
(`{env_id}__{exp_name}__{seed}__{time}`); its first group names the variant (default: the exp_name, and the
env id too when the runs hold several envs). For every variant it draws the mean over seeds of the episodic
return against environment steps, over a thin line per seed, and prints a Markdown table of the final return:
each seed's mean over the last `--window` fraction of its steps, then over seeds the mean with its 95% t
interval, `mean [low, high]`, and the sample std (ddof 1). `--label REGEX=TEXT` names a variant in the legend;
a caption under the plot says what a curve is. A variant holds one run per seed and one env id: a pattern that
would average CartPole with starpilot, or count a seed twice, is refused; runs of different lengths in one
variant are drawn with a warning.

The seeds of a variant are its sample; the statistics are scipy.stats's. `--compare A=B`, or `--baseline B`
(every variant of B's env against B), prints mean(A) - mean(B) with its 95% Welch interval and P(A > B), the
chance that a seed of A beats a seed of B (ties count half). `--margin 0.15` adds a verdict: A is non-inferior
to B when the lower end of the difference's two-sided 90% Welch interval lies above -0.15 |mean(B)|.
`--normalize ENV=RANDOM,REFERENCE` scores x on ENV as (x - RANDOM) / (REFERENCE - RANDOM) and prints, per name
(a variant less its `ENV__` prefix), the interquartile mean (IQM) of its seeds' normalized scores over those
envs, with a 95% stratified bootstrap interval.

`--divisor-regex` turns on the Fig. 3 measure of the paper: variants whose names differ only in the
batch divisor c form a family, and the table gives each family's final return at the largest batch
(smallest c) minus the one at the smallest batch (largest c): the loss from shrinking the batch.

    python benchmark/plot.py benchmark/runs/invariance/runs --out docs/img/invariance_all.png \\
        --group '__(all_c\\d+)__\\d+__\\d+$' --divisor-regex '_c(\\d+)$' --title 'PPG-EWMA, Acrobot-v1' \\
        --label '_c1$=c = 1 (64 envs)' --label '_c4$=c = 4 (16 envs)'

Committed run data, `benchmark/results/<experiment>.csv.xz`: one row per curve, columns env, variant, seed, tag,
steps, values, the last two its points in step order, separated by spaces (values float32, as in the event file),
rows sorted (a row per curve, and xz, each take about two thirds of the bytes of a row per point, and gzip).
`--export FILE.csv.xz` writes the `--tags` curves of the runs in the folder into FILE instead of printing tables,
the variant being `--group`'s group 1 (default: the exp_name). It replaces the curves of the same (env, variant,
seed) and keeps the others; run twice, it writes the same bytes. Export finished runs only (the scripts link them
into a folder of their own). A run with more than 5,000 episodes keeps the mean of each k consecutive episodes
instead (the smallest k that leaves at most 5,000), at the step of the block's last episode (a --threshold then
counts 100 blocks, not episodes); per-iteration tags (charts/SPS, whose last step gives the run's length; kl/mean)
are kept whole. A point costs about 5 bytes compressed: a 1M-step MuJoCo run (1,000 episodes of HalfCheetah to
about 3,000 of Hopper, and 489 iterations of 2,048 steps) takes 7 to 19 kB, so 8 MB holds some 600 of them. Given
FILE.csv.xz in place of the folder, each (env, variant, seed) of it acts as a run directory named
`{env}__{variant}__{seed}__0`, so the same flags give the same tables and plots:

    python benchmark/plot.py benchmark/runs/mujoco_ewma/finished --export benchmark/results/mujoco_ewma.csv.xz
    python benchmark/plot.py benchmark/results/mujoco_ewma.csv.xz --group '^(.+__(?:ppo|com960))__\\d+__\\d+$' \\
        --baseline ppo --margin 0.15
"""
import argparse
import csv
import functools
import glob
import lzma
import os
import re
import shlex
import sys
import textwrap
import warnings
from collections import defaultdict

import numpy as np
from scipy import stats
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir, tag):
    """(steps, values) of one scalar tag in a run directory, every event kept; or of one run of a committed table,
    named FILE.csv.xz/{env}__{variant}__{seed}__0."""
    table, name = os.path.split(os.path.normpath(run_dir))
    if table.endswith(".csv.xz"):
        return read_committed(table)[name].get(tag, (np.zeros(0), np.zeros(0)))
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return np.zeros(0), np.zeros(0)
    scalars = events.Scalars(tag)
    return np.array([s.step for s in scalars], float), np.array([s.value for s in scalars], float)


def natural_key(name):
    """Sort "k2" before "k16": digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


EXP_NAME = r"__(.+)__\d+__\d+$"  # the default --group: a variant per exp_name
ENV_AND_EXP_NAME = r"^(.+__.+)__\d+__\d+$"  # ... or per env id and exp_name, when the runs hold several envs


def name_parts(run_dir):
    """(env id, seed) from a run directory's name {env_id}__{exp_name}__{seed}__{time}."""
    parts = os.path.basename(os.path.normpath(run_dir)).split("__")
    return parts[0], int(parts[-2])


def default_group(run_dirs):
    """The default --group: EXP_NAME, or ENV_AND_EXP_NAME when the run directories hold several env ids."""
    runs = [d for d in run_dirs if re.search(EXP_NAME, os.path.basename(os.path.normpath(d)))]
    return EXP_NAME if len({name_parts(d)[0] for d in runs}) <= 1 else ENV_AND_EXP_NAME


def group_runs(run_dirs, pattern):
    """{variant: [run_dir, ...]} in natural order of the variants; a run whose name does not match is skipped."""
    groups = defaultdict(list)
    for run_dir in sorted(run_dirs):
        match = re.search(pattern, os.path.basename(os.path.normpath(run_dir)))
        if match:
            groups[match.group(1)].append(run_dir)
    return {name: groups[name] for name in sorted(groups, key=natural_key)}


def check_variants(groups, pattern):
    """Stop when a variant holds runs of different env ids (their mean would mix unrelated returns) or two runs of
    one seed (a curve of "3 seeds" may be one seed three times)."""
    for name, dirs in groups.items():
        env_ids = sorted({name_parts(d)[0] for d in dirs})
        if len(env_ids) > 1:
            raise SystemExit(f"--group {shlex.quote(pattern)} puts runs of different envs ({', '.join(env_ids)}) into "
                             f"the variant {name!r}; anchor the pattern on one env id, e.g. "
                             f"{shlex.quote('^' + env_ids[0] + '__(...)')}.")
        seeds = [name_parts(d)[1] for d in dirs]
        twice = sorted({seed for seed in seeds if seeds.count(seed) > 1})
        if twice:
            same = [os.path.basename(os.path.normpath(d)) for d in dirs if name_parts(d)[1] == twice[0]]
            raise SystemExit(f"--group {shlex.quote(pattern)} puts {len(same)} runs of seed {twice[0]} into the variant "
                             f"{name!r} ({', '.join(same)}); keep one run per seed, or tell the runs apart with --group.")


def warn_of_unequal_lengths(groups, tag):
    """A variant whose runs end at different env steps (charts/SPS's last step, else the tag's): its mean drops or
    jumps where the shorter runs end, and its final returns average different windows."""
    for name, dirs in groups.items():
        lengths = []
        for d in dirs:
            steps = read_scalars(d, "charts/SPS")[0]
            lengths.append(int((steps if len(steps) else read_scalars(d, tag)[0]).max(initial=0)))
        if len(set(lengths)) > 1:
            print(f"warning: the runs of the variant {name!r} end at {min(lengths):,} to {max(lengths):,} steps: its "
                  f"curve averages fewer seeds after the shortest run ends.", file=sys.stderr)


def parse_labels(rules):
    """["REGEX=TEXT", ...] -> [(compiled REGEX, TEXT)]; TEXT may use the match's groups (\\1)."""
    parsed = []
    for rule in rules:
        regex, sep, text = rule.partition("=")
        if not sep or not regex:
            raise SystemExit(f"--label {rule!r} is not REGEX=TEXT.")
        parsed.append((re.compile(regex), text))
    return parsed


def legend_label(name, labels):
    """TEXT of the first rule whose REGEX matches the variant's name (re.search), else the name itself."""
    for regex, text in labels:
        match = regex.search(name)
        if match:
            return match.expand(text)
    return name


def bin_width(max_step, num_bins):
    """A round width (1, 2 or 5 x 10^k steps) near max_step / num_bins, so the caption can name it."""
    raw = max(max_step / num_bins, 1.0)
    candidates = [m * 10.0 ** e for e in range(int(np.log10(raw)) - 1, int(np.log10(raw)) + 2) for m in (1, 2, 5)]
    return min(candidates, key=lambda w: abs(np.log(w / raw)))


def binned_curve(steps, values, edges):
    """Mean of the values whose step falls in each bin [edges[i], edges[i+1]); nan for an empty bin."""
    which = np.digitize(steps, edges) - 1
    return np.array([values[which == i].mean() if np.any(which == i) else np.nan for i in range(len(edges) - 1)])


def final_return(steps, values, window, at=None):
    """Mean of the values logged in the last `window` fraction of the run's steps, or with `at` of its first `at`
    steps (the run as it stood at step `at`: steps (1 - window) at to at); nan where none was logged there."""
    end = steps.max() if at is None and len(steps) else at
    inside = (steps >= (1 - window) * end) & (steps <= end) if len(steps) else steps > 0
    return values[inside].mean() if inside.any() else np.nan


def summarize(groups, tag, window, per=None, at=None):
    """{variant: per-seed final returns, as an array}; with `per`, each divided by that tag's final value."""
    def final(run_dir):
        value = final_return(*read_scalars(run_dir, tag), window, at)
        return value / final_return(*read_scalars(run_dir, per), window, at) if per else value
    return {name: np.array([final(d) for d in dirs]) for name, dirs in groups.items()}


def number(x, size=None):
    """One decimal for returns, three significant digits for small quantities such as KLs; `size`, where given,
    decides instead of abs(x), so that numbers printed together get the same format."""
    return f"{x:.1f}" if abs(x if size is None else size) >= 10 else f"{x:.3g}"


def with_interval(estimate, low, high):
    """`estimate [low, high]`; the estimate alone where there is no interval (one seed)."""
    if np.isnan(low):
        return number(estimate)
    size = max(abs(estimate), abs(low), abs(high))
    return f"{number(estimate, size)} [{number(low, size)}, {number(high, size)}]"


def quiet(function):
    """scipy's result without its warnings for seeds that are all equal (exact) or a single seed (nan)."""
    def wrapped(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return function(*args, **kwargs)
    return wrapped


@quiet
def t_interval(x, confidence=0.95):
    """Student's t interval for the mean of the seeds' scores x: [n]; (nan, nan) for one seed.
    Not a bootstrap: at n = 3 a 95% percentile bootstrap over seeds is a third as wide and, on normal scores, holds
    the true mean 2 times in 3; t's quantile (4.30 for n = 3, 2.26 for n = 10) pays for estimating the std from n."""
    return tuple(stats.ttest_1samp(x, 0.0).confidence_interval(confidence))


@quiet
def welch(x, y, confidence=0.95):
    """mean(x) - mean(y), its Welch t interval (no equal-variance assumption) and Welch's degrees of freedom."""
    result = stats.ttest_ind(x, y, equal_var=False)
    low, high = result.confidence_interval(confidence)
    return np.mean(x) - np.mean(y), low, high, result.df if min(len(x), len(y)) > 1 else np.nan


def improvement_probability(x, y):
    """P(X > Y) of a random seed of x against one of y, ties counting half: the Mann-Whitney U of x over n m."""
    return stats.mannwhitneyu(x, y).statistic / (len(x) * len(y))


def non_inferiority(x, baseline, margin):
    """(low, high, bound, passed): x is no worse than baseline by more than margin x |mean(baseline)| when the lower
    end of the difference's two-sided 90% Welch interval (a one-sided test at 5%) lies above bound = -that."""
    _, low, high, _ = welch(x, baseline, confidence=0.90)
    bound = -margin * abs(np.mean(baseline))
    return low, high, bound, bool(low > bound)


def iqm(*scores, axis=-1):
    """Interquartile mean of the scores of all the arrays together: int(n / 4) cut from each end, the rest averaged."""
    return stats.trim_mean(np.concatenate(scores, axis=axis), 0.25, axis=axis)


def stratified_bootstrap(scores, statistic, confidence=0.95, resamples=20000, seed=0):
    """Percentile interval of statistic(*scores) where each array (an env's seeds) is resampled on its own, so that
    every resample keeps each env's seed count (Agarwal et al. 2021's stratified bootstrap); fixed seed."""
    result = stats.bootstrap(tuple(scores), statistic, n_resamples=resamples, method="percentile",
                             confidence_level=confidence, rng=seed)
    return tuple(result.confidence_interval)


def mean_interval(x):
    return with_interval(np.mean(x), *t_interval(x))


def final_table(finals, window, tag="charts/episodic_return", at=None):
    quantity = "return" if tag == "charts/episodic_return" else tag
    steps = f"last {window:.0%} of steps" if at is None else f"steps {(1 - window) * at:,.0f}-{at:,.0f}"
    lines = [f"| variant | seeds | {quantity}, {steps}: mean [95% t interval] over seeds | "
             "sample std (ddof 1) |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {len(x)} | {mean_interval(x)} | {number(np.std(x, ddof=1)) if len(x) > 1 else ''} |"
              for name, x in finals.items()]
    return "\n".join(lines)


def first_step_reaching(steps, values, threshold, episodes=100):
    """First step at which the mean of the last `episodes` values reaches threshold (None if never)."""
    for i in range(episodes - 1, len(values)):
        if values[i - episodes + 1:i + 1].mean() >= threshold:
            return int(steps[i])
    return None


def threshold_table(groups, tag, threshold):
    """Per variant, each seed's first step where the 100-episode mean reaches the threshold."""
    lines = [f"| variant | first step where the 100-episode mean >= {threshold:g}, per seed |", "|---|---|"]
    for name, dirs in groups.items():
        firsts = [first_step_reaching(*read_scalars(d, tag), threshold) for d in dirs]
        lines.append(f"| {name} | " + ", ".join("never" if f is None else f"{f:,}" for f in firsts) + " |")
    return "\n".join(lines)


def pivot_table(finals, pivot_regex):
    """Final returns as a grid: rows and columns are the two groups of pivot_regex in each variant's name."""
    cells, rows, cols = {}, [], []
    for name, x in finals.items():
        match = re.search(pivot_regex, name)
        if match:
            row, col = match.group(1), match.group(2)
            cells[row, col] = x
            rows += [row] if row not in rows else []
            cols += [col] if col not in cols else []
    cols.sort(key=natural_key)
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in rows:
        row_cells = [mean_interval(cells[row, col]) if (row, col) in cells else "" for col in cols]
        lines.append(f"| {row} | " + " | ".join(row_cells) + " |")
    return "\n".join(lines)


def invariance_table(finals, divisor_regex):
    """Fig. 3: per family, final return at the smallest c (largest batch) minus the one at the largest c,
    with the 95% Welch interval of that difference of two means over seeds."""
    families = defaultdict(dict)
    for name, x in finals.items():
        match = re.search(divisor_regex, name)
        if match:
            families[name[:match.start()] + name[match.end():]][int(match.group(1))] = x
    lines = ["| family | c range | return at largest batch | at smallest batch | difference [95% Welch interval] |",
             "|---|---|---:|---:|---:|"]
    for family, by_c in families.items():
        large, small = by_c[min(by_c)], by_c[max(by_c)]
        lines.append(f"| {family} | {min(by_c)}-{max(by_c)} | {np.mean(large):.1f} | {np.mean(small):.1f} | "
                     f"{with_interval(*welch(large, small)[:3])} |")
    return "\n".join(lines)


def comparison_pairs(envs, compare, baseline):
    """[(A, B)] from --compare A=B rules and --baseline B: every other variant of an env against B's variant of that
    env, where B names it either alone or as ENV__B (the default --group over several envs); envs: {variant: env}."""
    pairs = [tuple(rule.split("=", 1)) for rule in compare]
    base = {env: name for name, env in envs.items() if name in (baseline, f"{env}__{baseline}")} if baseline else {}
    pairs += [(name, base[env]) for name, env in envs.items() if env in base and name != base[env]]
    unknown = sorted({name for pair in pairs for name in pair} - set(envs))
    unknown += [baseline] if baseline and not base else []
    if unknown or any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--compare A=B and --baseline take variant names: {', '.join(unknown) or 'A=B'} is none of "
                         f"{', '.join(envs)}.")
    return pairs


def comparison_table(finals, pairs, margin=None, ratio=False):
    """Per pair (A, B): mean(A) - mean(B) with its 95% Welch interval, Welch's degrees of freedom and P(A > B); with a
    margin, A's non-inferiority to B; with ratio, mean(A) / mean(B)."""
    head, rule = "| A - B | difference of means [95% Welch interval] | Welch df | P(A > B) |", "|---|---:|---:|---:|"
    if ratio:
        head, rule = head + " mean(A) / mean(B) |", rule + "---:|"
    if margin is not None:
        head += f" difference [90% interval] | margin: -{margin:.0%} of B's mean | A non-inferior to B |"
        rule += "---:|---:|---|"
    lines = [head, rule]
    for a, b in pairs:
        difference, low, high, df = welch(finals[a], finals[b])
        line = (f"| {a} - {b} | {with_interval(difference, low, high)} | {df:.1f} | "
                f"{improvement_probability(finals[a], finals[b]):.2f} |")
        line += f" {np.mean(finals[a]) / np.mean(finals[b]):.2f} |" if ratio else ""
        if margin is not None:
            low, high, bound, passed = non_inferiority(finals[a], finals[b], margin)
            line += f" {with_interval(difference, low, high)} | {number(bound)} | {'yes' if passed else 'not shown'} |"
        lines.append(line)
    return "\n".join(lines)


def parse_normalize(rules):
    """["ENV=RANDOM,REFERENCE", ...] -> {env: (random, reference)}."""
    scores = {}
    for rule in rules:
        env, _, pair = rule.partition("=")
        try:
            random, reference = map(float, pair.split(","))
        except ValueError:
            raise SystemExit(f"--normalize {rule!r} is not ENV=RANDOM,REFERENCE.") from None
        scores[env] = random, reference
    return scores


def normalize(x, random, reference):
    """0 at random play, 1 at the reference score."""
    return (np.asarray(x) - random) / (reference - random)


def aggregate_table(finals, envs, normalizers):
    """Per name (a variant less its ENV__ prefix), over the envs that --normalize gives: the IQM of all the seeds'
    normalized final scores, with its 95% stratified bootstrap interval (it needs 2 seeds in every env; with 3, read it
    as too narrow, as t_interval says of a bootstrap over 3 seeds)."""
    pooled = defaultdict(dict)
    for name, x in finals.items():
        if envs[name] in normalizers:
            pooled[name.removeprefix(envs[name] + "__")][envs[name]] = normalize(x, *normalizers[envs[name]])
    lines = ["| name | envs | seeds | IQM of normalized final scores [95% stratified bootstrap interval] |",
             "|---|---|---:|---:|"]
    for name, by_env in pooled.items():
        scores = list(by_env.values())
        low, high = stratified_bootstrap(scores, iqm) if min(map(len, scores)) > 1 else (np.nan, np.nan)
        lines.append(f"| {name} | {', '.join(by_env)} | {sum(map(len, scores))} | "
                     f"{with_interval(iqm(*scores), low, high)} |")
    return "\n".join(lines)


LINE_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "x", "P", "*"]


def caption(tag, width, seeds, threshold):
    """What a curve is, in words, under the plot."""
    what = {"charts/episodic_return": "per-episode returns",
            "eval/mean_return": "evaluation returns (each the mean of --eval-episodes episodes at a mark)"}.get(
        tag, f"values of {tag}")
    if set(seeds) == {1}:
        seeds_text = "one seed"
    else:
        seeds_text = f"{seeds[0]} seeds" if len(set(seeds)) == 1 else "seeds (count in the legend)"
        seeds_text += "; thin lines: each seed"
    lines = [f"Curve: {what} binned by {width:,.0f} env steps, mean over {seeds_text}."]
    if threshold is not None:
        lines.append(f"Dotted line: {threshold:g}. Ticks: where each seed's 100-episode running mean first reaches "
                     f"{threshold:g} (not the binned curve: the two can cross the line at different steps).")
    return "\n".join(textwrap.fill(line, 125) for line in lines)


def plot(groups, tag, out, title, labels=(), threshold=None, num_bins=40):
    """Write the PNG; return its legend entries and caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    curves = {name: [read_scalars(d, tag) for d in dirs] for name, dirs in groups.items()}
    max_step = max(steps.max() for runs in curves.values() for steps, _ in runs if len(steps))
    width = bin_width(max_step, num_bins)
    edges = np.arange(int(max_step // width) + 2) * width
    centres = (edges[:-1] + edges[1:]) / 2
    seeds = [len(runs) for runs in curves.values()]
    text = caption(tag, width, seeds, threshold)
    fig, ax = plt.subplots(figsize=(6.4, 4.0 + 0.14 * text.count("\n")), dpi=100)
    for i, (name, runs) in enumerate(curves.items()):
        per_seed = np.array([binned_curve(steps, values, edges) for steps, values in runs])
        with warnings.catch_warnings():  # a bin with no episode in any seed stays nan: a gap in the line
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(per_seed, axis=0)
        count = f" ({len(runs)} seed{'s' if len(runs) > 1 else ''})" if len(set(seeds)) > 1 else ""
        label = legend_label(name, labels) + count
        # curves that end at the same value (500 on CartPole) stay apart: own dash pattern, markers on other bins
        line, = ax.plot(centres, mean, label=label, linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                        marker=MARKERS[i % len(MARKERS)], markersize=4, markevery=(i % 4, 4), zorder=3)
        if len(runs) > 1:
            ax.plot(centres, per_seed.T, color=line.get_color(), linewidth=0.6, alpha=0.4, zorder=2)
        if threshold is not None:
            firsts = [first_step_reaching(steps, values, threshold) for steps, values in runs]
            firsts = [f for f in firsts if f is not None]
            ax.plot(firsts, [threshold] * len(firsts), linestyle="none", marker="|", markersize=12,
                    markeredgewidth=2, color=line.get_color())
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 50k, 1M
    ax.set_xlabel("environment steps")
    ax.set_ylabel(tag.split("/")[-1].replace("_", " "))
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, text, fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.045 * (text.count("\n") + 1), 1, 1))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out)
    legend = [entry.get_text() for entry in ax.get_legend().get_texts()]
    plt.close(fig)
    return legend, text


COLUMNS = ["env", "variant", "seed", "tag", "steps", "values"]
EPISODE_TAGS = ("charts/episodic_return", "charts/episodic_length")  # one value per episode: downsampled
MAX_EPISODES = 5000


def read_rows(path):
    """The rows of a committed table, one per curve, header left out, as strings."""
    csv.field_size_limit(2**31 - 1)  # a curve is a field: 25,000 iterations outgrow csv's default 128 kB
    with lzma.open(path, "rt", newline="") as text:
        return list(csv.reader(text))[1:]


@functools.lru_cache(maxsize=None)
def read_committed(path):
    """{"{env}__{variant}__{seed}__0": {tag: (steps, values)}} of a committed table; values as float32, like events."""
    runs = defaultdict(dict)
    for env, variant, seed, tag, steps, values in read_rows(path):
        runs[f"{env}__{variant}__{seed}__0"][tag] = (np.array(steps.split()).astype(float),
                                                    np.array(values.split()).astype(np.float32).astype(float))
    return dict(runs)


def write_rows(path, rows):
    """Write a committed table: the header, then the rows (xz's header holds no time: same rows, same bytes)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with lzma.open(path, "wt", newline="") as text:
        csv.writer(text, lineterminator="\n").writerows([COLUMNS] + rows)


def list_runs(source):
    """The run directories in a folder, or the runs of a committed table as FILE.csv.xz/{env}__{variant}__{seed}__0."""
    if source.endswith(".csv.xz"):
        return [os.path.join(source, name) for name in read_committed(source)]
    return glob.glob(os.path.join(source, "*", ""))


def downsample(steps, values, max_points=MAX_EPISODES):
    """Means of k consecutive values, k = ceil(n / max_points), each at its block's last step (as they are when
    n <= max_points)."""
    k = -(-len(values) // max_points)
    if k <= 1:
        return steps, values
    starts = np.arange(0, len(values), k)
    ends = np.minimum(starts + k, len(values))
    return steps[ends - 1], np.add.reduceat(values, starts) / (ends - starts)


def export(path, run_dirs, pattern, tags):
    """Write the `tags` curves of the runs into the committed table at `path`: curves of the same (env, variant, seed)
    replaced, the others kept, all sorted: exporting twice changes no byte."""
    runs = defaultdict(list)  # per env and variant: a variant may span envs here, env being a column of its own
    for variant, dirs in group_runs(run_dirs, pattern).items():
        for run_dir in dirs:
            runs[f"{name_parts(run_dir)[0]}__{variant}"].append(run_dir)
    if not runs:
        raise SystemExit(f"no run matches --group {shlex.quote(pattern)}: nothing to export")
    check_variants(runs, pattern)
    new = []
    for env_and_variant, dirs in runs.items():
        env, variant = env_and_variant.split("__", 1)
        for run_dir in dirs:
            seed = name_parts(run_dir)[1]
            for tag in tags:
                steps, values = read_scalars(run_dir, tag)
                steps, values = downsample(steps, values) if tag in EPISODE_TAGS else (steps, values)
                if len(steps):  # a tag the run never logged gets no row
                    order = np.argsort(steps, kind="stable")  # by step; the points of one step in logged order
                    new.append([env, variant, str(seed), tag, " ".join(str(int(s)) for s in steps[order]),
                                " ".join(str(np.float32(v)) for v in values[order])])
    replaced = {tuple(row[:3]) for row in new}
    old = [row for row in read_rows(path) if tuple(row[:3]) not in replaced] if os.path.exists(path) else []
    rows = sorted(old + new, key=lambda row: (*row[:2], int(row[2]), row[3]))
    write_rows(path, rows)
    read_committed.cache_clear()
    print(f"{path}: {len(new):,} curves from {len(replaced)} runs; in all {len(rows):,} curves, "
          f"{sum(len(row[4].split()) for row in rows):,} points, {os.path.getsize(path):,} bytes")


class ShowDefaults(argparse.HelpFormatter):
    """--help gives each flag's default, where it has one."""

    def _get_help_string(self, action):
        shown = action.default not in (None, "", [], argparse.SUPPRESS)
        return action.help + (" (default: %(default)s)" if shown else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=ShowDefaults)
    parser.add_argument("runs", help="folder whose subfolders are run directories, or a committed FILE.csv.xz")
    parser.add_argument("--group", help=f"regex; group 1 names a run's variant (default: {EXP_NAME}, or "
                        f"{ENV_AND_EXP_NAME} when the runs hold several env ids)")
    parser.add_argument("--tag", default="charts/episodic_return", help="the scalar to draw and tabulate")
    parser.add_argument("--window", type=float, default=0.1, help="final fraction of steps that the table averages")
    parser.add_argument("--at", type=float, metavar="STEP", help="tables: each run as it stood at this step, the last "
                        "--window fraction of its first STEP steps (e.g. 1e6 of a 5M-step run); the plot is whole")
    parser.add_argument("--divisor-regex", help="regex whose group 1 is the batch divisor c in a variant's name")
    parser.add_argument("--pivot", help="regex with two groups (row, column) of a variant's name: print a grid")
    parser.add_argument("--threshold", type=float, help="also print each seed's first step at which the mean of its "
                        "last 100 values reaches this")
    parser.add_argument("--out", help="PNG to write (no plot without it)")
    parser.add_argument("--title", default="", help="the plot's title")
    parser.add_argument("--per", metavar="TAG", help="table only: divide each seed's final --tag value by its final "
                        "value of TAG (e.g. charts/grad_noise_trace per charts/grad_sq_norm: B_simple over the window)")
    parser.add_argument("--bins", type=int, default=40, help="bins of env steps in the plot (about 10 for --eval-every "
                        "marks)")
    parser.add_argument("--label", action="append", default=[], metavar="REGEX=TEXT",
                        help="legend text of the variants whose name REGEX matches (repeatable; the first match wins; "
                        "TEXT may use REGEX's groups as \\1)")
    parser.add_argument("--compare", action="append", default=[], metavar="A=B", help="print mean(A) - mean(B) with "
                        "its 95%% Welch interval and P(A > B) (repeatable; A, B: variant names)")
    parser.add_argument("--baseline", metavar="B", help="compare every other variant of B's env against B (B: a "
                        "variant's name, or its name less the ENV__ prefix)")
    parser.add_argument("--ratio", action="store_true", help="with --compare or --baseline: also print mean(A) / "
                        "mean(B)")
    parser.add_argument("--margin", type=float, metavar="FRACTION", help="with --compare or --baseline: is A "
                        "non-inferior to B, the lower end of the 90%% interval above -FRACTION x |mean(B)|?")
    parser.add_argument("--normalize", action="append", default=[], metavar="ENV=RANDOM,REFERENCE",
                        help="score 0 at RANDOM, 1 at REFERENCE on ENV (repeatable); print the IQM over these envs "
                        "with its 95%% stratified bootstrap interval")
    parser.add_argument("--export", metavar="FILE.csv.xz", help="instead of tables, write the runs' --tags curves into "
                        "this committed table (replacing the curves of the same env, variant and seed)")
    parser.add_argument("--tags", nargs="+", metavar="TAG", default=["charts/episodic_return", "charts/SPS"],
                        help="with --export: the scalars to keep")
    args = parser.parse_args(argv)
    labels = parse_labels(args.label)
    run_dirs = list_runs(args.runs)
    if args.export:
        return export(args.export, run_dirs, args.group or EXP_NAME, args.tags)
    pattern = args.group or default_group(run_dirs)
    groups = group_runs(run_dirs, pattern)
    if not groups:
        raise SystemExit(f"no run directory under {args.runs} matches --group {shlex.quote(pattern)}")
    check_variants(groups, pattern)
    warn_of_unequal_lengths(groups, args.tag)
    finals = summarize(groups, args.tag, args.window, args.per, args.at)
    groups = {name: dirs for name, dirs in groups.items() if not np.all(np.isnan(finals[name]))}  # tag logged
    finals = {name: finals[name] for name in groups}
    if not groups:
        raise SystemExit(f"no run under {args.runs} logged {args.tag}")
    envs = {name: name_parts(dirs[0])[0] for name, dirs in groups.items()}
    pairs = comparison_pairs(envs, args.compare, args.baseline)
    if args.margin is not None and not pairs:
        raise SystemExit("--margin judges comparisons: give --compare A=B or --baseline B.")
    tables = [final_table(finals, args.window, f"{args.tag} / {args.per}" if args.per else args.tag, args.at)]
    tables += [pivot_table(finals, args.pivot)] if args.pivot else []
    tables += [threshold_table(groups, args.tag, args.threshold)] if args.threshold is not None else []
    tables += [invariance_table(finals, args.divisor_regex)] if args.divisor_regex else []
    tables += [comparison_table(finals, pairs, args.margin, args.ratio)] if pairs else []
    tables += [aggregate_table(finals, envs, parse_normalize(args.normalize))] if args.normalize else []
    print("\n\n".join(tables))
    if args.out:
        plot(groups, args.tag, args.out, args.title, labels, args.threshold, args.bins)


if __name__ == "__main__":
    main()

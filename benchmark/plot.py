"""Learning curves and tables from TensorBoard event files.

Runs are grouped into variants by a regular expression over their directory names
(`{env_id}__{exp_name}__{seed}__{time}`); its first group names the variant (default: the exp_name).
For every variant it draws the mean over seeds of the episodic return against environment steps, with a
band of +-1 std over seeds, and prints a Markdown table of the final return: each seed's mean over the
last `--window` fraction of its steps, then mean +- std over seeds.

`--divisor-regex` turns on the Fig. 3 measure of the paper: variants whose names differ only in the
batch divisor c form a family, and the table gives each family's final return at the largest batch
(smallest c) minus the one at the smallest batch (largest c): the loss from shrinking the batch.

    python benchmark/plot.py benchmark/runs/invariance --out docs/img/invariance.png \\
        --group '__(.+)__\\d+__\\d+$' --divisor-regex '_c(\\d+)$' --title 'PPG-EWMA, Acrobot-v1'
"""
import argparse
import glob
import os
import re
import warnings
from collections import defaultdict

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir, tag):
    """(steps, values) of one scalar tag in a run directory, every event kept."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return np.zeros(0), np.zeros(0)
    scalars = events.Scalars(tag)
    return np.array([s.step for s in scalars], float), np.array([s.value for s in scalars], float)


def natural_key(name):
    """Sort "k2" before "k16": digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def group_runs(run_dirs, pattern):
    """{variant: [run_dir, ...]} in natural order of the variants; a run whose name does not match is skipped."""
    groups = defaultdict(list)
    for run_dir in sorted(run_dirs):
        match = re.search(pattern, os.path.basename(os.path.normpath(run_dir)))
        if match:
            groups[match.group(1)].append(run_dir)
    return {name: groups[name] for name in sorted(groups, key=natural_key)}


def binned_curve(steps, values, edges):
    """Mean of the values whose step falls in each bin [edges[i], edges[i+1]); nan for an empty bin."""
    which = np.digitize(steps, edges) - 1
    return np.array([values[which == i].mean() if np.any(which == i) else np.nan for i in range(len(edges) - 1)])


def final_return(steps, values, window):
    """Mean of the values logged in the last `window` fraction of the run's steps."""
    if len(steps) == 0:
        return np.nan
    return values[steps >= (1 - window) * steps.max()].mean()


def summarize(groups, tag, window):
    """{variant: per-seed final returns, as an array}."""
    return {name: np.array([final_return(*read_scalars(d, tag), window) for d in dirs]) for name, dirs in groups.items()}


def number(x):
    """One decimal for returns, three significant digits for small quantities such as KLs."""
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def mean_std(x):
    return f"{number(np.mean(x))} +- {number(np.std(x))}" if len(x) > 1 else number(np.mean(x))


def final_table(finals, window, tag="charts/episodic_return"):
    quantity = "return" if tag == "charts/episodic_return" else tag
    lines = [f"| variant | seeds | {quantity}, last {window:.0%} of steps: mean +- std over seeds |", "|---|---:|---:|"]
    lines += [f"| {name} | {len(x)} | {mean_std(x)} |" for name, x in finals.items()]
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
        lines.append(f"| {row} | " + " | ".join(mean_std(cells[row, col]) if (row, col) in cells else "" for col in cols) + " |")
    return "\n".join(lines)


def invariance_table(finals, divisor_regex):
    """Fig. 3: per family, final return at the smallest c (largest batch) minus the one at the largest c,
    with the standard error of that difference of two means over seeds."""
    families = defaultdict(dict)
    for name, x in finals.items():
        match = re.search(divisor_regex, name)
        if match:
            families[name[:match.start()] + name[match.end():]][int(match.group(1))] = x
    lines = ["| family | c range | return at largest batch | at smallest batch | difference +- s.e. |",
             "|---|---|---:|---:|---:|"]
    for family, by_c in families.items():
        large, small = by_c[min(by_c)], by_c[max(by_c)]
        stderr = np.sqrt(sum(np.var(x, ddof=1) / len(x) for x in (large, small))) if min(len(large), len(small)) > 1 else np.nan
        lines.append(f"| {family} | {min(by_c)}-{max(by_c)} | {np.mean(large):.1f} | {np.mean(small):.1f} | "
                     f"{np.mean(large) - np.mean(small):.1f} +- {stderr:.1f} |")
    return "\n".join(lines)


def plot(groups, tag, out, title, num_bins=40):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: [read_scalars(d, tag) for d in dirs] for name, dirs in groups.items()}
    max_step = max(steps.max() for runs in curves.values() for steps, _ in runs if len(steps))
    edges = np.linspace(0, max_step, num_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for name, runs in curves.items():
        per_seed = np.array([binned_curve(steps, values, edges) for steps, values in runs])
        with warnings.catch_warnings():  # a bin with no episode in any seed stays nan: a gap in the line
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, std = np.nanmean(per_seed, axis=0), np.nanstd(per_seed, axis=0)
        ax.plot(centres, mean, label=f"{name} ({len(runs)})")
        ax.fill_between(centres, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"{tag.split('/')[-1].replace('_', ' ')} (mean, +-1 std over seeds)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="folder whose subfolders are run directories")
    parser.add_argument("--group", default=r"__(.+)__\d+__\d+$", help="regex; group 1 names a run's variant")
    parser.add_argument("--tag", default="charts/episodic_return")
    parser.add_argument("--window", type=float, default=0.1, help="final fraction of steps that the table averages")
    parser.add_argument("--divisor-regex", help="regex whose group 1 is the batch divisor c in a variant's name")
    parser.add_argument("--pivot", help="regex with two groups (row, column) of a variant's name: print a grid")
    parser.add_argument("--threshold", type=float, help="also print each seed's first step at which the mean of its "
                        "last 100 values reaches this")
    parser.add_argument("--out", help="PNG to write (no plot without it)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    groups = group_runs(glob.glob(os.path.join(args.runs, "*", "")), args.group)
    if not groups:
        raise SystemExit(f"no run directory under {args.runs} matches --group {args.group!r}")
    finals = summarize(groups, args.tag, args.window)
    groups = {name: dirs for name, dirs in groups.items() if not np.all(np.isnan(finals[name]))}  # tag logged
    finals = {name: finals[name] for name in groups}
    if not groups:
        raise SystemExit(f"no run under {args.runs} logged {args.tag}")
    print(final_table(finals, args.window, args.tag))
    if args.pivot:
        print()
        print(pivot_table(finals, args.pivot))
    if args.threshold is not None:
        print()
        print(threshold_table(groups, args.tag, args.threshold))
    if args.divisor_regex:
        print()
        print(invariance_table(finals, args.divisor_regex))
    if args.out:
        plot(groups, args.tag, args.out, args.title)


if __name__ == "__main__":
    main()

"""The README's table "Running one script elsewhere": for each feature, the files a copy of a script needs beside it
and their lines (`wc -l`), counted for SCRIPT. tests/test_docs.py checks that the README holds this table as printed.
Each feature's modules are those harness.py imports for its flag (tests/test_harness.py checks that a run asking for
one without its file is refused). Cost here: under a second.

    python benchmark/lines.py
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "ppo_ewma.py"
FEATURES = {  # feature -> the project's files it needs beside the script and harness.py
    "a plain run: trains, logs to TensorBoard, writes checkpoint and model": (),
    "`--resume`": ("checkpoints.py", "resume.py"),
    "`--eval-checkpoint`": ("checkpoints.py", "evaluation.py"),
    "`--eval-every`, `--capture-video`": ("evaluation.py",),
    "`torchrun`": ("workers.py",),
    "`--track` (W&B)": ("tracking.py",),
}


def lines(name: str) -> int:
    with open(os.path.join(ROOT, name), encoding="utf-8") as file:
        return sum(1 for _ in file)


def table() -> str:
    rows = ["| feature | files | lines |", "|---|---|---|"]
    for feature, modules in FEATURES.items():
        files = (SCRIPT, "harness.py", *modules)
        counts = " + ".join(f"{lines(name):,}" for name in files)
        rows.append(f"| {feature} | {', '.join(f'`{name}`' for name in files)} | {counts} = "
                    f"{sum(map(lines, files)):,} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())

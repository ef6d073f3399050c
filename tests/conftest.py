"""Put the repository root on sys.path so tests can `import ppo_ewma` and friends, and run torch on
one thread: the networks in the tests are tiny, and on a 2-core machine a second intra-op thread
only contends with the environments (a Procgen smoke run took 119 s instead of 19 s under load).

The suite runs on the CPU on purpose, also on a machine with a GPU: the recorded scalars and the exact-resume
checks are CPU numbers, and most training tests leave --cuda at its default. So the GPU is hidden before torch is
imported, unless TEST_CUDA=1 asks for it (CI has no GPU, so only a GPU machine can run that way). Hiding it also
keeps the pytest process free of a CUDA context, which forked workers could not inherit (test_torchrun.py forks
from a forkserver anyway)."""
import os
import sys

if os.environ.get("TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)

SCRIPTS = ("ppo_ewma", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er")


def pytest_addoption(parser):
    parser.addoption("--impl", action="append", default=[], metavar="FILE.py",
                     help="docs/exercises.md: run the tests against the functions and classes of your own FILE.py "
                          "instead of the scripts' ones of the same names (repeatable)")


def pytest_configure(config):
    """--impl: put each public function or class that the student's file defines in place of the scripts' own of
    that name, before any test module imports it, so that every test of that name checks the student's."""
    config.replaced, config.unused = [], []
    for path in config.getoption("impl"):
        import importlib.util
        import inspect

        if not os.path.isfile(path):
            raise pytest.UsageError(f"--impl {path}: no such file.")
        spec = importlib.util.spec_from_file_location(f"student_{len(config.replaced)}", path)
        student = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(student)
        except Exception as error:  # the student's own code failed as it ran: say where, as Python would
            raise pytest.UsageError(f"--impl {path} raised {type(error).__name__} when imported: {error}") from error
        own = {name: value for name, value in vars(student).items() if not name.startswith("_")
               and (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == student.__name__}
        scripts = {script: importlib.import_module(script) for script in SCRIPTS}
        found = False
        for name, value in own.items():
            replaces = [script for script, module in scripts.items() if hasattr(module, name)]
            for script in replaces:
                setattr(scripts[script], name, value)
                config.replaced.append(f"{script}.{name}")
            found = found or bool(replaces)
            if not replaces:  # a helper, or a misspelt name whose test then checks the script's own: said either way
                config.unused.append(f"{os.path.basename(path)}: {name}")
        if not found:
            raise pytest.UsageError(f"--impl {path} defines {', '.join(sorted(own)) or 'nothing public'}, none of which "
                                    f"a script has: name your function as the exercise asks (e.g. compute_gae).")


def pytest_sessionstart(session):
    """Names of a student's file that replace nothing, on a line of their own that -q does not hide."""
    unused = session.config.unused if hasattr(session.config, "unused") else []
    if unused:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"--impl: no script has {', '.join(unused)}, so no test checks it (a helper is fine; a misspelt name is "
            f"not: the script's own is tested instead)")


def pytest_report_header(config):
    if config.replaced:
        return f"--impl: yours in place of {', '.join(config.replaced)}"

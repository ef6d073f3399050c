"""Put the repository root on sys.path so tests can `import ppo_ewma` and friends, and run torch on
one thread: the networks in the tests are tiny, and on a 2-core machine a second intra-op thread
only contends with the environments (a Procgen smoke run took 119 s instead of 19 s under load).

The suite runs on the CPU on purpose, also on a machine with a GPU: the recorded scalars and the exact-resume
checks are CPU numbers, and most training tests leave --cuda at its default. So the GPU is hidden before torch is
imported, unless TEST_CUDA=1 asks for it (CI has no GPU, so only a GPU machine can run that way). Hiding it also
keeps the pytest process free of a CUDA context, which forked workers could not inherit (test_torchrun.py forks
from a forkserver anyway)."""
import importlib
import os
import sys

if os.environ.get("TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)

# every script whose pieces --impl replaces, in one place: tests/test_exercises.py and test_exercise_checks.py take it
SCRIPTS = ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er")


def pytest_addoption(parser):
    parser.addoption("--impl", action="append", default=[], metavar="FILE.py",
                     help="docs/exercises.md: run the tests against the functions and classes of your own FILE.py "
                          "instead of the scripts' ones of the same names (repeatable)")


def students_pieces(path, module_name):
    """{name: function or class} of what the student's file at `path` defines in public, run as the module
    `module_name`; a file that is missing or raises as it runs is a UsageError in one sentence."""
    import importlib.util
    import inspect

    if not os.path.isfile(path):
        raise pytest.UsageError(f"--impl {path}: no such file.")
    spec = importlib.util.spec_from_file_location(module_name, path)
    student = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(student)
    except Exception as error:  # the student's own code failed as it ran: say where, as Python would
        raise pytest.UsageError(f"--impl {path} raised {type(error).__name__} when imported: {error}") from error
    return {name: value for name, value in vars(student).items() if not name.startswith("_")
            and (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == student.__name__}


def pytest_configure(config):
    """--impl: put each public function or class that the student's file defines in place of the scripts' own of
    that name, before any test module imports it, so that every test of that name checks the student's."""
    config.replaced, config.unused = [], []
    for number, path in enumerate(config.getoption("impl")):
        own = students_pieces(path, f"student_{number}")
        scripts = {script: importlib.import_module(script) for script in SCRIPTS}
        found = False
        for name, value in own.items():
            replaces = [script for script, module in scripts.items() if hasattr(module, name)]
            for script in replaces:
                setattr(scripts[script], name, value)
                config.replaced.append(f"{script}.{name}")
            found = found or bool(replaces)
            if not replaces:  # a helper, or a misspelt name whose test then checks the script's own: fails the run
                config.unused.append((path, name))
        if not found:
            raise pytest.UsageError(f"--impl {path} defines {', '.join(sorted(own)) or 'nothing public'}, none of which "
                                    f"a script has: name your function as the exercise asks (e.g. compute_gae).")


def unused_sentence(config):
    """The names of a student's file that replace nothing, in one sentence; None where every name replaces one."""
    unused = [f"{os.path.basename(path)}: {name}" for path, name in getattr(config, "unused", [])]
    if unused:
        return (f"--impl: no script has {', '.join(unused)}, so no test checks it: a misspelt name leaves the script's "
                f"own tested in its place, so the check fails; name a helper with a leading underscore (_helper)")


def pytest_sessionstart(session):
    """The sentence on a line of its own that -q does not hide, before the tests run; a test that fails with it
    comes after them (below), so that the run does not end green on the script's own functions."""
    if unused_sentence(session.config):
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(unused_sentence(session.config))


class NamesThatReplaceNothing(pytest.Item):
    def runtest(self):
        pytest.fail(unused_sentence(self.config), pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(trylast=True)  # after -k and -m have chosen the tests, so that neither leaves it out
def pytest_collection_modifyitems(session, config, items):
    if unused_sentence(config):  # named by the student's file, as pytest names a test of a file
        path = os.path.abspath(config.unused[0][0])
        items.append(NamesThatReplaceNothing.from_parent(
            session, name="names that replace nothing", path=path,
            nodeid=f"{os.path.relpath(path, config.rootpath)}::names that replace nothing"))


def pytest_report_header(config):
    if config.replaced:
        return f"--impl: yours in place of {', '.join(config.replaced)}"

"""docs/exercises.md: each exercise's check runs the project's own tests against a file of the student's (--impl, in
conftest.py): the hand-worked tests of the piece and its comparison with the script's own on random inputs
(test_exercise_checks.py). Handed in that way, the scripts' own functions pass every exercise, and so do right answers
that order the operations otherwise; each wrong answer of exercise_answers.py fails; a misnamed function is refused
before any test runs, and a name that replaces nothing fails the run."""
import ast
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys

import test_exercise_checks as exercise_checks
from conftest import SCRIPTS, students_pieces
from exercise_answers import REORDERED, WRONG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "import math\nfrom collections import deque\n\nimport numpy as np\nimport torch\nimport torch.nn as nn\n\n\n"


def exercises():
    """[(title, names the student writes, the check's pytest arguments)] of docs/exercises.md. The names: each
    backticked `name(` or `class Name` of the Write line that is a module-level function or class of a script
    whose tests the check runs."""
    with open(os.path.join(ROOT, "docs", "exercises.md"), encoding="utf-8") as file:
        sections = file.read().split("\n## ")[1:]
    found = []
    for section in sections:
        write = re.search(r"^- Write: (.*?)^- Read first", section, re.S | re.M).group(1)
        check = shlex.split(re.search(r"^- Check: `(python -m pytest .*)`$", section, re.M).group(1))[3:]
        scripts = [importlib.import_module(script) for script in SCRIPTS if f"tests/test_{script}.py" in check]
        candidates = re.findall(r"`(?:class )?([A-Za-z]\w*)[(`]", write)
        names = [name for name in dict.fromkeys(candidates) if any(
            inspect.isfunction(getattr(script, name, None)) or inspect.isclass(getattr(script, name, None))
            for script in scripts)]
        found.append((section.splitlines()[0], names, check))
    return found


def own_file(names, path):
    """A student's file that holds the scripts' own code of `names`: what the checks must accept."""
    sources = []
    for name in names:
        script = next(module for module in map(importlib.import_module, SCRIPTS) if hasattr(module, name))
        sources.append(inspect.getsource(getattr(script, name)))
    with open(path, "w") as file:
        file.write(HEADER + "\n\n".join(sources))


def pytest_run(args, cwd):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_every_exercise_names_what_to_write_and_selects_tests_of_it():
    found = exercises()
    assert len(found) >= 8
    for title, names, check in found:
        assert names, f"exercise {title!r}: no function or class of the scripts to write"
        files, selection = [w for w in check if w.startswith("tests/")], check[check.index("-k") + 1]
        test_names = re.findall(r"^def (test_\w+)", "".join(open(os.path.join(ROOT, f)).read() for f in files), re.M)
        for word in re.split(r"\s+or\s+", selection.strip('"')):  # pytest -k: a substring of a test's name
            assert any(word in name for name in test_names), f"exercise {title!r}: -k {word} selects no test"


# Tests that call an exercise's piece only as an ingredient of something else, or that hold the script's own piece
# to its own float operations bit for bit (a right answer may order them otherwise): the check may leave them out
INGREDIENT = {"test_gae_and_reward_scaling_loops_on_numpy_give_the_tensor_loops_numbers": "the script's own float order",
              "test_bf16_runs_the_cnn_in_bfloat16_and_keeps_losses_gradients_and_weights_float32": "--bf16's dtypes",
              "test_checkpoint_round_trip_gives_the_same_networks_ewma_and_normalizers": "the checkpoint format",
              "test_checkpoint_round_trip_gives_the_same_network_and_reward_normalizer": "the checkpoint format"}
COMPARISONS = "tests/test_exercise_checks.py"  # each piece against the script's own on random inputs


PIECE_TAKERS = {"pieces", "compare"}  # tests/test_exercise_checks.py's helpers, which take a piece by its name


def callers_of(path, names, by_name_only=False) -> list:
    """The tests of a file that call one of `names`, directly, through a helper function of the file, or by name
    through one of PIECE_TAKERS (by_name_only: that way alone, as tests/test_exercise_checks.py takes each piece, whose
    `memory.minibatch_indices(...)` is ReplayMemory's method, not the function of the same name)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}

    def called(function):
        calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
        return {getattr(node.func, "id", getattr(node.func, "attr", None)) for node in calls if not by_name_only} | {
            node.args[0].value for node in calls if getattr(node.func, "id", None) in PIECE_TAKERS and node.args
            and isinstance(node.args[0], ast.Constant)}
    found = []
    for name, function in functions.items():
        calls = called(function)
        calls |= {call for helper in calls & functions.keys() - {name} for call in called(functions[helper])}
        if name.startswith("test_") and calls & set(names):
            found.append(name)
    return found


def test_each_check_selects_every_test_that_calls_the_exercises_pieces():
    # a check that leaves out a test of its piece lets through what only that test catches (exercise 10's check once
    # left out the test that an epoch visits every stored sample once, and so passed indices drawn with replacement).
    # Every script that holds a piece takes the student's (--impl), so the check runs its test file too; and every
    # piece is compared with the script's own on random inputs, which catches what the hand-worked tests let through
    for title, names, check in exercises():
        words = re.split(r"\s+or\s+", check[check.index("-k") + 1].strip('"'))
        uncompared = [name for name in names if not callers_of(os.path.join(ROOT, COMPARISONS), [name], True)]
        assert not uncompared, f"exercise {title!r}: {COMPARISONS} does not compare {uncompared} with the script's own"
        files = [f"tests/test_{script}.py" for script in SCRIPTS
                 if any(hasattr(importlib.import_module(script), name) for name in names)]
        for path in [*files, COMPARISONS]:
            left_out = [test for test in callers_of(os.path.join(ROOT, path), names, path == COMPARISONS)
                        if test not in INGREDIENT and (path not in check or not any(word in test for word in words))]
            assert not left_out, f"exercise {title!r}: its check leaves out {path}'s {left_out}"


def test_a_check_that_leaves_out_a_test_of_its_piece_is_caught(tmp_path):
    path = tmp_path / "test_piece.py"
    path.write_text("def helper():\n    return piece(1)\n\n\ndef test_piece_by_hand():\n    piece(2)\n\n\n"
                    "def test_through_a_helper():\n    helper()\n\n\ndef test_other():\n    other()\n\n\n"
                    "def test_by_name():\n    compare('piece', [])\n")
    assert callers_of(path, ["piece"]) == ["test_piece_by_hand", "test_through_a_helper", "test_by_name"]


def hand_in(sources, tmp_path, tag):
    """One pytest session that runs the checks of the exercises in `sources` ({an exercise's first piece: the source
    of a student's file}) together: each file in place of its exercise's pieces, the union of the checks' test files
    and of their -k selections."""
    by_piece = {names[0]: (names, check) for _, names, check in exercises()}
    args, files, selections = [], set(), []
    for piece, source in sources.items():
        names, check = by_piece[piece]
        path = tmp_path / f"{tag}_{piece}.py"
        path.write_text(source)
        args += ["--impl", str(path)]
        files.update(os.path.join(ROOT, word) for word in check if word.startswith("tests/"))
        selections.append(f"({check[check.index('-k') + 1]})")
    return pytest_run([*sorted(files), "-k", " or ".join(selections), *args], cwd=ROOT)


def script_source(names, edits, tmp_path):
    """The scripts' own source of `names`, changed by edits [(the script's text, the answer's)]."""
    own_file(names, tmp_path / "own.py")
    text = (tmp_path / "own.py").read_text()
    for old, new in edits:
        assert old in text, f"{names}: the script no longer has {old!r}; tests/exercise_answers.py needs the new text"
        text = text.replace(old, new)
    return text


def test_the_scripts_own_functions_pass_every_exercise(tmp_path):
    sources = {names[0]: script_source(names, [], tmp_path) for _, names, _ in exercises()}
    result = hand_in(sources, tmp_path, "own")
    assert result.returncode == 0, result.stdout[-3000:]
    replaced = re.search(r"^--impl: yours in place of (.*)$", result.stdout, re.M).group(1).split(", ")
    assert {name.split(".")[1] for name in replaced} == {name for _, names, _ in exercises() for name in names}


def comparisons_of(sources, tmp_path, monkeypatch):
    """{(exercise, answer's index, comparison test): the exception it raised, None where it passed}: each answer of
    `sources` ({an exercise's first piece: [the sources of student's files]}) put in place as --impl puts it, one after
    another in this process, and each comparison test of its exercise (test_exercise_checks.py) called directly."""
    by_piece = {names[0]: (title, names) for title, names, _ in exercises()}
    found = {}
    for piece, answers in sources.items():
        title, names = by_piece[piece]
        tests = callers_of(os.path.join(ROOT, COMPARISONS), names, by_name_only=True)
        for number, source in enumerate(answers):
            path = tmp_path / f"{piece}_{number}.py"
            path.write_text(source)
            with monkeypatch.context() as patch:
                for name, value in students_pieces(str(path), f"student_{piece}_{number}").items():
                    for module in map(importlib.import_module, SCRIPTS):
                        if hasattr(module, name):
                            patch.setattr(module, name, value)
                for test in tests:
                    try:
                        getattr(exercise_checks, test)()
                        found[title, number, test] = None
                    except Exception as error:  # a failure of any kind fails the check
                        found[title, number, test] = error
    return found


def test_right_answers_that_order_the_operations_otherwise_pass_the_comparisons(tmp_path, monkeypatch):
    # tests/exercise_answers.py: float64 GAE, logsumexp in the E-step, a randperm per actor in the replay, ...
    assert set(REORDERED) == {names[0] for _, names, _ in exercises()}
    sources = {piece: [answers] if isinstance(answers, str) else answers for piece, answers in REORDERED.items()}
    failed = {key: error for key, error in comparisons_of(sources, tmp_path, monkeypatch).items() if error is not None}
    assert not failed, "\n".join(f"{title}, right answer {number + 1}: {test}: {error}"
                                  for (title, number, test), error in failed.items())


def test_each_wrong_answer_fails_the_comparison_with_the_scripts_own(tmp_path, monkeypatch):
    # tests/exercise_answers.py's wrong answers, among them the nine that passed the checks of issue 79 and those that
    # passed an earlier comparison with the script's own
    by_piece = {names[0]: (title, names) for title, names, _ in exercises()}
    assert set(WRONG) == set(by_piece)
    results = comparisons_of({piece: [script_source(by_piece[piece][1], edits, tmp_path) for _, _, edits in answers]
                              for piece, answers in WRONG.items()}, tmp_path, monkeypatch)
    passed = [f"exercise {by_piece[piece][0]!r}: the wrong answer with {what} ({source or 'exercise_answers.py'})"
              for piece, answers in WRONG.items() for number, (what, source, _) in enumerate(answers)
              if all(error is None for (title, index, _), error in results.items()
                     if title == by_piece[piece][0] and index == number)]
    assert not passed, "passed the comparison with the script's own:\n" + "\n".join(passed)


def test_a_wrong_answer_fails_its_check_as_a_student_runs_it(tmp_path):
    # end to end, the check command with an --impl file: issue 79's E-step that keeps the largest |A|, which passed the
    # hand-worked tests only because topk broke a tie the right way, fails the comparison with the script's own
    (_, names, check), = [exercise for exercise in exercises() if exercise[1] == ["vmpo_e_step"]]
    (_, _, edits), = [answer for answer in WRONG["vmpo_e_step"] if "|A|" in answer[0]]
    path = tmp_path / "my_e_step.py"
    path.write_text(script_source(names, edits, tmp_path))
    check = [os.path.join(ROOT, word) if word.startswith("tests/") else word for word in check]
    result = pytest_run([*check[:-1], str(path)], cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:]
    assert re.search(r"^FAILED \S*test_exercise_checks\.py::test_vmpo_e_step_equals_the_scripts_own", result.stdout,
                     re.M), result.stdout[-2000:]


def test_a_misnamed_function_is_refused_before_any_test_runs(tmp_path):
    (_, names, check), = [exercise for exercise in exercises() if exercise[1] == ["compute_gae"]]
    check = [os.path.join(ROOT, word) if word.startswith("tests/") else word for word in check]
    misnamed = tmp_path / "my_gae2.py"
    misnamed.write_text("def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):\n    pass\n")
    result = pytest_run([*check[:-1], str(misnamed)], cwd=tmp_path)
    assert result.returncode == 4 and "defines gae, none of which a script has" in result.stderr


def test_a_name_that_replaces_nothing_is_said_even_under_q_and_fails_the_check(tmp_path):
    # its tests passed with the script's own in its place: the run must not end green
    (_, names, check), = [exercise for exercise in exercises() if "update_ewma" in exercise[1]]
    path = tmp_path / "my_ewma.py"
    own_file(["update_ewma"], path)  # update_ewma right, com_to_decay misspelt: the script's own would be tested
    path.write_text(path.read_text() + "\n\ndef com_to_deacy(com):\n    return com / (com + 1.0)\n")
    check = [os.path.join(ROOT, word) if word.startswith("tests/") else word for word in check]
    result = pytest_run(["-q", *check[:-1], str(path)], cwd=tmp_path)
    assert result.returncode == 1 and re.search(r"^FAILED my_ewma.py::names that replace nothing", result.stdout, re.M)
    assert re.search(r"^1 failed, \d+ passed", result.stdout, re.M), result.stdout[-2000:]  # its tests ran
    sentence = "--impl: no script has my_ewma.py: com_to_deacy, so no test checks it"
    assert result.stdout.count(sentence) >= 2, result.stdout[-2000:]  # before the tests, and as the failure's message

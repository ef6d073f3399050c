"""docs/exercises.md: each exercise's check runs the project's own tests against a file of the student's (--impl, in
conftest.py). Handed in that way, the scripts' own functions pass every exercise; a wrong one fails; a misnamed one
is refused before any test runs."""
import ast
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys

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
        scripts = [importlib.import_module(re.match(r"tests/test_(\w+)\.py$", word).group(1))
                   for word in check if word.startswith("tests/")]
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
        script = next(module for module in map(importlib.import_module, ("ppo_ewma", "ppg_ewma", "ppo_staleness",
                                                                           "vmpo", "ppo_er")) if hasattr(module, name))
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
SCRIPTS = ("ppo_ewma", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er")


def callers_of(path, names) -> list:
    """The tests of a file that call one of `names`, directly or through a helper function of the file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}

    def called(function):
        return {getattr(node.func, "id", getattr(node.func, "attr", None))
                for node in ast.walk(function) if isinstance(node, ast.Call)}
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
    # Every script that holds a piece takes the student's (--impl), so the check runs its test file too
    for title, names, check in exercises():
        words = re.split(r"\s+or\s+", check[check.index("-k") + 1].strip('"'))
        files = [f"tests/test_{script}.py" for script in SCRIPTS
                 if any(hasattr(importlib.import_module(script), name) for name in names)]
        for path in files:
            left_out = [test for test in callers_of(os.path.join(ROOT, path), names)
                        if test not in INGREDIENT and (path not in check or not any(word in test for word in words))]
            assert not left_out, f"exercise {title!r}: its check leaves out {path}'s {left_out}"


def test_a_check_that_leaves_out_a_test_of_its_piece_is_caught(tmp_path):
    path = tmp_path / "test_piece.py"
    path.write_text("def helper():\n    return piece(1)\n\n\ndef test_piece_by_hand():\n    piece(2)\n\n\n"
                    "def test_through_a_helper():\n    helper()\n\n\ndef test_other():\n    other()\n")
    assert callers_of(path, ["piece"]) == ["test_piece_by_hand", "test_through_a_helper"]


def test_the_scripts_own_functions_pass_every_exercise(tmp_path):
    args, files, selections = [], set(), []
    for number, (_, names, check) in enumerate(exercises()):
        path = tmp_path / f"own_{number}.py"
        own_file(names, path)
        args += ["--impl", str(path)]
        files.update(os.path.join(ROOT, word) for word in check if word.startswith("tests/"))
        selections.append(f"({check[check.index('-k') + 1]})")
    result = pytest_run([*sorted(files), "-k", " or ".join(selections), *args], cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    replaced = re.search(r"^--impl: yours in place of (.*)$", result.stdout, re.M).group(1).split(", ")
    assert {name.split(".")[1] for name in replaced} == {name for _, names, _ in exercises() for name in names}


def test_a_wrong_function_fails_its_exercise_and_a_misnamed_one_is_refused(tmp_path):
    (_, names, check), = [exercise for exercise in exercises() if exercise[1] == ["compute_gae"]]
    wrong = tmp_path / "my_gae.py"
    own_file(names, wrong)  # the script's GAE, with the episode boundary forgotten in the recursion
    text = wrong.read_text()
    assert "gamma * gae_lambda * next_nonterminal * last_gae" in text
    wrong.write_text(text.replace("gamma * gae_lambda * next_nonterminal * last_gae", "gamma * gae_lambda * last_gae"))
    check = [os.path.join(ROOT, word) if word.startswith("tests/") else word for word in check]
    result = pytest_run([*check[:-1], str(wrong)], cwd=tmp_path)
    assert result.returncode == 1 and re.search(r"\d+ failed", result.stdout), result.stdout[-2000:]
    misnamed = tmp_path / "my_gae2.py"
    misnamed.write_text("def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):\n    pass\n")
    result = pytest_run([*check[:-1], str(misnamed)], cwd=tmp_path)
    assert result.returncode == 4 and "defines gae, none of which a script has" in result.stderr


def test_a_name_that_replaces_nothing_is_said_even_under_q(tmp_path):
    (_, names, check), = [exercise for exercise in exercises() if "update_ewma" in exercise[1]]
    path = tmp_path / "my_ewma.py"
    own_file(["update_ewma"], path)  # update_ewma right, com_to_decay misspelt: the script's own would be tested
    path.write_text(path.read_text() + "\n\ndef com_to_deacy(com):\n    return com / (com + 1.0)\n")
    check = [os.path.join(ROOT, word) if word.startswith("tests/") else word for word in check]
    result = pytest_run(["-q", *check[:-1], str(path)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "--impl: no script has my_ewma.py: com_to_deacy, so no test checks it" in result.stdout

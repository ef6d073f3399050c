"""The docs' links: every relative link and image path in README.md and docs/*.md names a file that exists, and
every #fragment names a heading of the page it points to."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCED_BLOCK = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![alt](...)
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"")


def link_targets(markdown):
    """Targets of the Markdown links, images and HTML img/a tags, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCED_BLOCK.sub("", markdown))
    return LINK.findall(prose) + HTML_LINK.findall(prose)


def dead_links(markdown_path):
    """The relative targets in a Markdown file that name no existing file or folder, resolved from the file's
    own folder; web links and pure #anchors are skipped, a #fragment is ignored."""
    with open(markdown_path, encoding="utf-8") as f:
        targets = link_targets(f.read())
    folder = os.path.dirname(os.path.abspath(markdown_path))
    dead = []
    for target in targets:
        path = target.split("#", 1)[0]
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):  # #anchor, https:, mailto:
            continue
        if not os.path.exists(os.path.join(folder, path)):
            dead.append(target)
    return dead


def heading_anchors(markdown):
    """The anchors GitHub gives a page's headings: lower case, punctuation but - and _ dropped, spaces as -,
    a repeated anchor suffixed -1, -2, ...; headings inside code blocks are not headings."""
    anchors, seen = [], {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", FENCED_BLOCK.sub("", markdown), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.append(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def dead_anchors(markdown_path):
    """The link targets in a Markdown file whose #fragment names no heading of the Markdown page it points to."""
    with open(markdown_path, encoding="utf-8") as f:
        targets = link_targets(f.read())
    folder, dead = os.path.dirname(os.path.abspath(markdown_path)), []
    for target in targets:
        path, _, fragment = target.partition("#")
        if not fragment or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
            continue
        page = os.path.join(folder, path) if path else str(markdown_path)
        if page.endswith(".md") and os.path.isfile(page):
            with open(page, encoding="utf-8") as f:
                if fragment not in heading_anchors(f.read()):
                    dead.append(target)
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_exists(page):
    assert dead_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_fragment_names_a_heading(page):
    assert dead_anchors(page) == []


def test_heading_anchors_follow_githubs_rule(tmp_path):
    markdown = ("# Measured at the paper's budget: 1M steps\n## `--batch-divisor c`\n### Results\n## Results\n"
                "```bash\n# a comment, not a heading\n```\n")
    assert heading_anchors(markdown) == ["measured-at-the-papers-budget-1m-steps", "--batch-divisor-c", "results",
                                         "results-1"]
    (tmp_path / "page.md").write_text(markdown)
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](page.md#results-1) [gone](page.md#results-2) [here](#missing) [web](https://a.b/c#d)\n")
    assert dead_anchors(doc) == ["page.md#results-2", "#missing"]


def test_the_docs_pages_are_there_and_linked():
    # the pages the project's layout has, each linked from the README, so the check above covers real links
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme_targets = link_targets(f.read())
    for page in ["ppo_ewma", "ppo_ewma_rnn", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er", "running", "torchrun",
                 "speed", "benchmarks"]:
        assert f"docs/{page}.md" in [t.split("#")[0] for t in readme_targets]


def test_a_dead_link_is_reported(tmp_path):
    (tmp_path / "page.md").write_text("text")
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "curve.png").write_bytes(b"png")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[a page](page.md) and [a section of it](page.md#part), ![a plot](img/curve.png)\n"
        "[the web](https://example.com/missing.md), [here](#results), [mail](mailto:a@b.c)\n"
        "![gone](img/missing.png) and [moved](old/page.md#part \"a title\") and <img src=\"img/lost.png\">\n"
        "`[in code](ghost.md)`\n"
        "```\n[in a block](ghost.md)\n```\n"
    )
    assert dead_links(doc) == ["img/missing.png", "old/page.md#part", "img/lost.png"]


def test_the_readmes_table_of_files_and_lines_is_the_codes():
    # benchmark/lines.py counts them afresh: a module that grows, or moves, makes this fail until the README follows
    import importlib.util

    spec = importlib.util.spec_from_file_location("lines", os.path.join(ROOT, "benchmark", "lines.py"))
    lines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lines)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert lines.table() in f.read(), "rebuild README's table with: python benchmark/lines.py"


def test_the_readme_shows_the_ci_test_command():
    # .ci/run runs exactly the README's test command: the README keeps it on a code line of its own
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert "python -m pytest" in f.read().splitlines()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "python -m pytest" in [line.strip() for line in f]


# ------------------------------------------------------------------------------- recipes, stated once
SCRIPTS = ["ppo_ewma", "ppo_ewma_rnn", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er"]


def recipes(doc: str) -> list:
    """The `python ...` commands of a text (a docstring's recipes), continuation lines joined, comments dropped."""
    commands, lines = [], iter(doc.splitlines())
    for line in lines:
        if line.strip().startswith("python "):
            command = line.split("#")[0].strip()
            while command.endswith("\\"):
                command = command[:-1].strip() + " " + next(lines).split("#")[0].strip()
            commands.append(command)
    return commands


def test_recipes_are_read_from_a_docstring_with_their_continuation_lines():
    doc = "Title.\n\n    python a.py --x 1   # a comment\n    python a.py --y 2 \\\n        --z 3   # more\nText.\n"
    assert recipes(doc) == ["python a.py --x 1", "python a.py --y 2 --z 3"]


def cpu_recipes(text, script):
    """The `python {script}.py` commands of a text that train a Gymnasium env for a set number of steps: its
    recipes (a Procgen run, a --resume or an --eval-checkpoint is not one)."""
    import harness  # noqa: E402  (after conftest.py put the repository root on the path)

    text = re.sub(r"^(\s*)PYTHONPATH=\S+ python ", r"\1python ", text, flags=re.M)  # a user's env module's folder
    commands = [c for c in recipes(text) if c.split()[1] == f"{script}.py" and "--total-timesteps" in c]
    return [c for c in commands if (env := dict(zip(c.split(), c.split()[1:])).get("--env-id"))
            and env not in harness.PROCGEN_GAMES + ("GAME",)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_recipe_in_the_docs_is_the_one_in_help(script):
    import tyro

    module = __import__(script)
    parse = lambda command: tyro.cli(module.Args, args=command.split()[2:])  # noqa: E731
    in_help = {command: parse(command) for command in cpu_recipes(module.__doc__, script)}
    in_docs = {}
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            in_docs.update({command: parse(command) for command in cpu_recipes(f.read(), script)})
    assert in_help, f"{script}.py --help states no recipe"
    for command, args in in_docs.items():  # every recipe the docs give is one of --help's, flag for flag
        assert args in in_help.values(), f"docs: {command}"
    for command, args in in_help.items():  # and every recipe of --help is in the docs
        assert args in in_docs.values(), f"--help: {command}"


# ------------------------------------------------------- the algorithm pages' references to the scripts' lines
REFERENCE = re.compile(r"\[`([^`]+)`\]\(\.\./(\w+)\.py#L(\d+)-L(\d+)\)")  # [`name`](../script.py#L1-L9)


def stale_references(markdown, root=ROOT):
    """The references [`name`](../script.py#LA-LB) of a page whose lines no longer hold what they name, each with
    the lines they should say. `name` is a function, class or Class.method: A-B must be its whole source (decorators
    included); or a comment of train() that opens a block: line A must hold it, and the block end at B, before a
    blank line, a line indented less or the comment that opens the next block."""
    import importlib
    import inspect

    stale = []
    for name, script, first, last in REFERENCE.findall(markdown):
        first, last = int(first), int(last)
        with open(os.path.join(root, f"{script}.py"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        if name.startswith("#"):
            starts = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(name)]
            indent = len(lines[first - 1]) - len(lines[first - 1].lstrip()) if first <= len(lines) else 0
            after = lines[last] if last < len(lines) else ""
            ends = not after.strip() or len(after) - len(after.lstrip()) < indent or after.strip().startswith("#")
            if first not in starts or not ends or not all(lines[i].strip() for i in (first - 1, last - 1)):
                stale.append(f"{script}.py: `{name}` opens line {starts or 'none'}, not the block {first}-{last}")
            continue
        obj = importlib.import_module(script)
        for part in name.split("."):
            obj = getattr(obj, part)
        source, start = inspect.getsourcelines(obj)
        if (first, last) != (start, start + len(source) - 1):
            stale.append(f"{script}.py: `{name}` is lines {start}-{start + len(source) - 1}, not {first}-{last}")
    return stale


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_references_to_the_scripts_lines_hold(page):
    with open(page, encoding="utf-8") as f:
        assert stale_references(f.read()) == []


def test_a_reference_that_has_moved_is_reported(tmp_path):
    (tmp_path / "algo.py").write_text("def first():\n    return 1\n\n\ndef train():\n    # rollout\n    x = 1\n\n"
                                      "    # update\n    y = 2\n")
    page = ("[`first`](../algo.py#L1-L2) [`first`](../algo.py#L1-L3) [`# rollout`](../algo.py#L6-L7) "
            "[`# rollout`](../algo.py#L6-L6) [`# update`](../algo.py#L8-L10)")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        assert stale_references(page, root=str(tmp_path)) == [
            "algo.py: `first` is lines 1-2, not 1-3", "algo.py: `# rollout` opens line [6], not the block 6-6",
            "algo.py: `# update` opens line [9], not the block 8-10"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("algo", None)

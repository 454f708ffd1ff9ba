"""The README and the docs/ pages work as written: docs that match what happens.

Pages: ``README.md`` and every ``docs/*.md`` (``PAGES``). Every fenced ```bash block of every page is read;
each command in it (``\\`` continuations joined, comments dropped) is either run by
``test_readme_quick_commands_run`` or skipped by a rule of ``classify`` that says why (it sets up ``.venv``,
serves the app, runs a benchmark, the studies or the suite itself, or needs GPUs and a hub download). A
command no rule covers fails ``test_every_readme_command_is_covered``: a new command gets tested or
explicitly skipped.

The runnable commands run in page order (README first, then the docs pages in ``PAGES`` order) in one
temporary folder (so what they write, ``artifacts/...`` and ``runs/...``, lands there, and the configs'
relative ``model: artifacts/tiny-qwen3`` finds the model the README's own ``scaledrun.tiny`` command
built), with this interpreter for ``python`` and only a smaller budget appended (``BUDGET``); ``--config``
paths point at the repository's files. Each training command writes the folder its page names, and the
trainer refuses a folder that already holds a run, so two commands sharing a folder fail here too.

The other tests are fast:

- every option of every command, in the code blocks and in the prose (`` `python ...` `` spans), must be
  one its program knows (its ``--help`` or its source), every ``make`` target must exist, and every
  training command must name its own ``--output_dir``;
- every relative link and image of every page points at an existing file (and, for a ``.md`` target
  with ``#anchor``, at one of its headings); the README stays short (``README_MAX_LINES``); papers are
  cited by their short names (docs/papers.md), not by private file numbers;
- numbers the pages quote from code or configs are read from there and compared (a few targeted checks);
  every number in docs/experiments.md appears in ``experiments/REPORT.md`` (generated from the saved
  results), each measured number of its findings on the report row it is read from (``FINDINGS_TIES``),
  and every number of docs/toy.md's "What the toy shows" in the outputs that page prints.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAKEFILE = REPO / "Makefile"
#: the pages whose commands, links and numbers are checked, in the order their commands run
PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: the README is the front door, the manual lives in docs/
README_MAX_LINES = 200
BIN = Path(sys.executable).parent
PYTHONS = ("python", "python3", ".venv/bin/python")
#: options appended to a runnable command to shrink its budget (the last occurrence of an option wins)
BUDGET = {
    "scaledrun.tiny": ["--warm-start-steps", "20"],
    "scaledrun.train": ["--steps", "2", "--eval_every", "2", "--num_eval", "4", "--save_every", "1"],
    "toymodel": ["--steps", "3", "--seeds", "2"],
}
#: ``--resume true`` continues a 2-step run for one more step
RESUME_BUDGET = ["--steps", "3"]
#: make targets a code block may name; none is run here (they set up .venv, run the whole suite
#: or serve the app); ``test_make_targets_exist`` checks the Makefile has them
MAKE_SKIP_REASON = "make targets set up .venv first (and `make app` serves until Ctrl-C)"
NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


@dataclass(frozen=True)
class Command:
    text: str  # as written (continuations joined, comment dropped)
    argv: tuple[str, ...]
    where: str  # "block" or "prose"
    page: str = "README.md"

    @property
    def program(self) -> str:
        """``scaledrun.train``, ``toymodel``, ``benchmarks/x.py``, ``make``, ``accelerate`` or ``pip``."""
        a = self.argv
        if a[0] in PYTHONS:
            return a[2] if len(a) > 2 and a[1] == "-m" else a[1]
        return a[0]

    def trainer_args(self) -> list[str]:
        """The arguments of ``scaledrun.train`` (after ``-m scaledrun.train``), or [] if it is not a training command."""
        a = list(self.argv)
        if "-m" in a and a.index("-m") + 1 < len(a) and a[a.index("-m") + 1] == "scaledrun.train":
            return a[a.index("-m") + 2 :]
        return []


def _options(args: list[str] | tuple[str, ...]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--") and a != "--"]


def _value(args: list[str], option: str) -> str | None:
    vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]
    return vals[-1] if vals else None


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO))


def page_text(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def block_commands(text: str | None = None, page: str = "README.md") -> list[Command]:
    """Every command of every ```bash block of ``text`` (the README by default), in page order."""
    text = readme_text() if text is None else text
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(Command(" ".join(argv), tuple(argv), "block", page))
    return out


def prose_commands(text: str | None = None, page: str = "README.md") -> list[Command]:
    """Every `` `python ...` ``, `` `.venv/bin/python ...` `` and `` `make ...` `` span outside the code blocks."""
    text = readme_text() if text is None else text
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = []
    for span in re.findall(r"`((?:\.venv/bin/)?python3? [^`]+|make [^`]+)`", prose):
        argv = shlex.split(" ".join(span.split()))
        out.append(Command(" ".join(argv), tuple(argv), "prose", page))
    return out


def all_block_commands() -> list[Command]:
    """The code-block commands of every page, README first."""
    return [c for p in PAGES for c in block_commands(p.read_text(encoding="utf-8"), page_name(p))]


def all_prose_commands() -> list[Command]:
    return [c for p in PAGES for c in prose_commands(p.read_text(encoding="utf-8"), page_name(p))]


def _own_data(args: list[str]) -> str | None:
    """Why a training command on a dataset or a hub model is not run here (None: it runs)."""
    from scaledrun.tasks import source_kind

    task, model = _value(args, "--task"), _value(args, "--model")
    if (task and source_kind(task) == "hub") or (model and not model.startswith(("artifacts/", "runs/"))):
        return "needs a hub download (a dataset or a model named owner/name)"
    if task and source_kind(task) != "synthetic":
        return (
            "reads your own data file; tests/scaledrun/test_own_data.py runs each recipe on a small file "
            "in that dataset's format"
        )
    return None


def classify(cmd: Command) -> str | None:
    """None: run it; else why it is not run. Raises for a command no rule covers."""
    a = cmd.argv
    if a[0] == "make":
        return MAKE_SKIP_REASON
    if a[0] in PYTHONS and cmd.program == "scaledrun.train" and _own_data(cmd.trainer_args()):
        return _own_data(cmd.trainer_args())
    if a[0] in PYTHONS and cmd.program in BUDGET:
        return None
    if a[0] in PYTHONS and cmd.program.split(".")[0] == "experiments":
        return (
            "runs the studies or the first-hour measurement (minutes even in --quick); tests/experiments "
            "runs their smallest slices end to end, through their --report-only paths"
        )
    if a[0] in PYTHONS and cmd.program.startswith("benchmarks/"):
        return "a benchmark: it prints timings (a minute or more; trainer_vs_trl.py needs the bench extra)"
    if a[0] in PYTHONS and cmd.program == "pytest":
        return "runs (part of) the test suite, which is what is running this"
    if a[0] in PYTHONS and cmd.program == "tests.machines":
        return "runs the sampling tests once per machine profile (the suite's own markers cover them here)"
    if a[:2] == ("accelerate", "launch") and cmd.trainer_args():
        if "--preset" in cmd.trainer_args():
            return "a --preset names a hub model (a download and GPUs)"
        if not _value(list(a), "--num_processes") or not _value(list(a), "--num_processes").isdigit():
            return "a placeholder process count (N GPUs)"
        return None
    if cmd.page == "docs/plugins.md" and (
        a[:2] == ("accelerate", "launch") or a[:2] == ("trl", "vllm-serve")
    ):
        return (
            "a TRL launch with vLLM (docs/plugins.md, section TRL): needs GPUs, vLLM and a hub model; "
            "tests/scaledrun/test_trl_plugin.py runs the plug-in on CPU"
        )
    if "/tmp/verlvenv" in cmd.text:
        return (
            "verl's venv of its own (docs/plugins.md, section verl): verl 0.9.1 adds about 1 GB and pins "
            "transformers<5.11; its training launch needs GPUs and vLLM or SGLang"
        )
    raise AssertionError(
        f"{cmd.page} command not covered by tests/test_readme.py's rules: {cmd.text!r} (run it in "
        "test_readme_quick_commands_run with a small budget, or add a skip rule that says why)"
    )


# ------------------------------------------------------------------------------------------------
# fast checks: commands


def test_the_readme_has_the_expected_command_blocks():
    programs = [c.program for c in all_block_commands()]
    assert "scaledrun.tiny" in programs and "toymodel" in programs and programs.count("scaledrun.train") >= 4
    # the first-hour path: make app, the tiny model, two objectives into two folders, in that order
    first_hour = readme_text().split("## Your first hour", 1)[1].split("\n## ", 1)[0]
    fh = block_commands(first_hour)
    assert [c.program for c in fh] == ["make", "scaledrun.tiny", "scaledrun.train", "scaledrun.train"]
    assert fh[0].argv == ("make", "app")
    assert {_value(c.trainer_args(), "--objective") for c in fh[2:]} == {"grpo", "grpo_symclip"}
    # the two commands
    two = readme_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert [c.argv for c in block_commands(two)] == [("make", "app"), ("make", "test")]


def test_every_readme_command_is_covered():
    for cmd in all_block_commands():
        classify(cmd)  # raises for an uncovered command


def test_every_training_command_writes_its_own_folder():
    """No two training commands of the pages share an ``--output_dir``, except a ``--resume true`` of an earlier one."""
    seen: list[str] = []
    for cmd in all_block_commands() + all_prose_commands():
        args = cmd.trainer_args()
        if not args or "--help" in args:
            continue
        out = _value(args, "--output_dir")
        assert out, (
            f"{cmd.page}: training command without --output_dir (the config's folder would be shared): {cmd.text}"
        )
        if _value(args, "--resume") == "true":
            assert out in seen, f"{cmd.page}: {cmd.text}: resumes {out}, which no earlier command writes"
        elif cmd.where == "block":
            assert out not in seen, f"{cmd.page}: {cmd.text}: {out} is written by an earlier command too"
            seen.append(out)


def test_make_targets_exist():
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", MAKEFILE.read_text(), flags=re.M))
    for cmd in all_block_commands() + all_prose_commands():
        if cmd.argv[0] == "make":
            named = [a for a in cmd.argv[1:] if "=" not in a and not a.startswith("-")]
            assert set(named) <= targets, (
                f"{cmd.page}: {cmd.text}: no such make target(s) {set(named) - targets}"
            )


@functools.cache
def _known_options(program: str) -> str:
    """The ``--help`` text of ``program`` plus its source (options that ``main`` takes out before argparse)."""
    if program.endswith(".py"):
        path = REPO / program
        assert path.is_file(), f"a page names {program}, which does not exist"
        cmd, source = [sys.executable, str(path), "--help"], path.read_text()
    else:
        spec = importlib.util.find_spec(program)
        assert spec is not None, f"a page names module {program}, which does not exist"
        origin = (
            spec.origin
            if not spec.submodule_search_locations
            else str(Path(spec.origin).parent / "__main__.py")
        )
        cmd, source = [sys.executable, "-m", program, "--help"], Path(origin).read_text()
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    if run.returncode != 0 and "No module named" in run.stderr:
        pytest.skip(f"{program} needs a package this venv lacks: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}"
    return run.stdout + source


def _check_options(program: str, options: list[str], cmd: Command) -> None:
    known = _known_options(program)
    for opt in options:
        assert re.search(re.escape(opt) + r"(?![\w-])", known), (
            f"{cmd.page}: {cmd.text}: {program} has no option {opt}"
        )


def test_every_readme_python_option_exists():
    """A renamed or removed option fails here, for the code blocks and for the commands quoted in the prose."""
    for cmd in all_block_commands() + all_prose_commands():
        a = list(cmd.argv)
        if a[0] in PYTHONS:
            args = a[3:] if a[1] == "-m" else a[2:]
            _check_options(cmd.program, _options(args[: args.index("--")] if "--" in args else args), cmd)
        elif a[:2] == ["accelerate", "launch"]:
            end = a.index("-m") if "-m" in a else next(i for i, v in enumerate(a) if v.endswith(".py"))
            _check_options("accelerate.commands.launch", _options(a[2:end]), cmd)
            _check_options("scaledrun.train", _options(cmd.trainer_args()), cmd)


# ------------------------------------------------------------------------------------------------
# fast checks: links, length, paper names


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(text: str) -> list[str]:
    """The targets of every markdown link and image outside code (blocks and spans)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(([^)\s]+)\)", prose)


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_relative_links_point_at_existing_files(page):
    for target in _links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page_name(page)}: link {target!r}: {dest} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), (
                f"{page_name(page)}: link {target!r}: no heading #{anchor} in {dest}"
            )


def test_the_readme_stays_a_front_door():
    lines = readme_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the manual's parts to docs/"
    )
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in readme_text(), f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_papers_are_cited_by_their_short_names(page):
    """docs/papers.md's short names (DFPO, the cancellation-hypothesis paper, the Lopti paper), not 002/004."""
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    found = re.findall(r".{0,30}(?<![\w.])00[24](?![\w]).{0,30}", prose)
    assert not found, f"{page_name(page)} cites a paper by a file number: {found}"


# ------------------------------------------------------------------------------------------------
# fast checks: numbers the pages quote from code


def _source_value(path: str, pattern: str) -> str:
    match = re.search(pattern, page_text(path))
    assert match, f"{path} has no {pattern!r} (the docs quote it; update this test with the code)"
    return match.group(1)


def _literal(path: str, name: str):
    """The value of the module-level assignment ``name = <literal>`` in ``path``, without importing it."""
    for node in ast.parse(page_text(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no literal {name}")


def _count_word(n: int) -> str:
    return next(w for w, v in NUMBER_WORDS.items() if v == n)


def _flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks of the markdown included) as one space."""
    return " ".join(text.split())


def _sci(x: float) -> str:
    """``1e-3``, ``8e-7``: a power-of-ten-like number as the pages write it."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{x:.0e}").replace("e+", "e")


def test_app_page_count():
    pages = page_text("app/main.py").count("st.Page(")
    word = _count_word(pages)
    assert f"{word.capitalize()} pages, one question each" in _flat(page_text("docs/app.md"))
    assert f"{word} pages, one question each" in _flat(readme_text())
    table = page_text("docs/app.md").split("| page | question | paper |", 1)[1].split("\n\n", 1)[0]
    assert len(re.findall(r"^\| [A-Z]", table, flags=re.M)) == pages, "docs/app.md's table: one row per page"


def test_training_lab_defaults():
    """The first screen's seeds, steps and settings, as app/views/training_lab.py sets them."""
    from toymodel.simulate import DEFAULT_LR

    view = "app/views/training_lab.py"
    seeds = _literal(view, "DEFAULT_SEEDS")
    steps = int(_source_value(view, r'"Steps",[^)]*value=(\d+)'))
    group = int(_source_value(view, r'"group_size": (\d+),'))
    inner = int(_source_value(view, r'"inner_epochs": (\d+),'))
    assert _source_value(view, r'"lr": (DEFAULT_LR\["sgd"\]),') and _source_value(
        view, r'"optimizer": "(sgd)"'
    )
    quoted = [
        (page, m)
        for page in PAGES
        for m in re.findall(
            r"first screen[^.]*?(\d+)\s+seeds × (\d+) steps", page.read_text(encoding="utf-8")
        )
    ]
    assert any(page.name == "app.md" for page, _ in quoted), "docs/app.md no longer quotes the first screen"
    for page, (s, n) in quoted:
        assert (int(s), int(n)) == (seeds, steps), (
            f"{page_name(page)}: first screen {s} × {n}, the page runs {seeds} × {steps}"
        )
    settings = f"G = {group}, {inner} inner SGD epochs at lr {DEFAULT_LR['sgd']:g}"
    assert settings in _flat(page_text("docs/app.md"))
    from app.lab_cost import CONFIRM_ABOVE_S

    assert f"above {CONFIRM_ABOVE_S:g} s" in _flat(page_text("docs/app.md"))


def test_training_lab_measurement_is_quoted_verbatim():
    measured = _literal("app/views/training_lab.py", "MEASURED_10_SEEDS")
    quote = " ".join(line[2:] for line in page_text("docs/app.md").splitlines() if line.startswith("> "))
    assert " ".join(quote.split()) == " ".join(measured.split())


def _config(name: str) -> dict:
    """A shipped config with RunConfig's defaults under it (as load_config resolves unlisted fields)."""
    from scaledrun.config import RunConfig

    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    return {**fields, **yaml.safe_load((REPO / "scaledrun/configs" / name).read_text())}


def test_configs_numbers():
    off, default = _config("offpolicy.yaml"), _config("default.yaml")
    trainer = _flat(page_text("docs/trainer.md"))
    inner, mb = off["inner_epochs"], off["num_minibatches"]
    quoted = [
        (page, m)
        for page in PAGES
        for m in re.findall(
            r"offpolicy\.yaml` reuses each step's batch for (\d+) inner epochs × (\d+) mini-batches \((\d+)\s+optimiser",
            page.read_text(encoding="utf-8"),
        )
    ]
    assert any(page.name == "trainer.md" for page, _ in quoted)
    for page, m in quoted:
        assert tuple(map(int, m)) == (inner, mb, inner * mb), (
            f"{page_name(page)} quotes offpolicy.yaml as {m}"
        )
    d_inner, d_mb = default["inner_epochs"], default["num_minibatches"]
    assert f"fully on-policy ({d_inner} inner epoch × {d_mb} mini-batch)" in trainer
    from scaledrun.tasks import SYNTHETIC_DEFAULT_N

    assert default["num_train"] is None  # every row of a dataset: default.yaml fits any dataset's size
    assert (
        f"It runs {default['steps']} steps, on the synthetic task's {SYNTHETIC_DEFAULT_N} training prompts"
        in trainer
    )
    assert off["lr"] == default["lr"], "docs/trainer.md says both configs share one lr"
    assert f"Both train at lr {_sci(default['lr'])}" in trainer


def test_dfpo_paper_preset_numbers():
    from scaledrun.config import PRESETS

    p = PRESETS["dfpo_paper"]
    minibatch = p["prompts_per_step"] * p["group_size"] // p["num_minibatches"]
    phrase = (
        f"lr {_sci(p['lr'])}, cosine to {p['min_lr_ratio']:g}·lr, {p['warmup_ratio']:.0%} warm-up, "
        f"{p['group_size']} rollouts per prompt, mini-batches of {minibatch} completions"
    )
    assert phrase in _flat(page_text("docs/trainer.md"))


def test_tutorial_count():
    n = len(list((REPO / "tutorials").glob("[0-9][0-9]_*.py")))
    assert f"| {n} step-through notebooks" in readme_text()


def test_machine_profiles_are_the_code_s(capsys):
    """docs/testing.md's profile list is what ``python -m tests.machines --list`` prints now."""
    from tests.machines import main

    assert main(["--list"]) == 0
    printed = capsys.readouterr().out.strip()
    text = page_text("docs/testing.md").split("as `--list` prints them:", 1)[1]
    block = re.search(r"```text\n(.*?)```", text, flags=re.S).group(1).strip()
    assert block == printed


def test_math_defaults():
    """docs/objectives.md's defaults, from the functions' signatures and registries."""
    from cancellation import METRIC_KEYS, OBJECTIVES, TRANSFORMS, group_advantages
    from cancellation.aggregation import AGGREGATIONS
    from cancellation.diagnostics import token_flip_stats

    text = page_text("docs/objectives.md")
    eps = inspect.signature(group_advantages).parameters["eps"].default
    tau = inspect.signature(token_flip_stats).parameters["tau"].default
    assert f"`eps` = {_sci(eps)}" in _flat(text) and f"defaults to {_sci(tau)}" in _flat(text)
    metrics = text.split("| key | meaning |", 1)[1].split("\n\n", 1)[0]
    keys = {
        k for row in re.findall(r"^\| (.+?) \|", metrics, flags=re.M) for k in re.findall(r"`([^`]+)`", row)
    }
    assert keys == set(METRIC_KEYS)
    objectives = text.split("| objective | per-token term", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", objectives, flags=re.M) == list(OBJECTIVES)
    for name in [*TRANSFORMS, *AGGREGATIONS]:
        assert f"`{name}`" in text, f"docs/objectives.md does not name {name}"


def test_tiny_model_size(tmp_path):
    """``Nk-parameter`` wherever a page says it: the tiny model as ``python -m scaledrun.tiny`` builds it."""
    from scaledrun.tiny import build_tiny

    quoted = [
        (page, int(k))
        for page in PAGES
        for k in re.findall(r"(\d+)k-parameter", page.read_text(encoding="utf-8"))
    ]
    if not quoted:
        pytest.skip("no page quotes the tiny model's size")
    out = build_tiny(tmp_path / "tiny", "arithmetic", seed=0, warm_start_steps=0)
    n = json.loads((out / "warm_start.json").read_text())["num_parameters"]
    for page, k in quoted:
        assert k == round(n / 1000), f"{page_name(page)}: {k}k parameters, the tiny model has {n:,}"


# ------------------------------------------------------------------------------------------------
# fast checks: measured numbers come from their source

#: a number as the pages and the report write it: optional sign (− or -, +), digits, decimals, exponent
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[−+-]?\d+)?(?![\w])")
#: references to a paper's parts (eq. 86, App. F/H, Table 4, Sec. 4, §3.1): numbers, but not measurements
REFERENCE = re.compile(
    r"(?<!\w)(?:eq\.|eqs\.|App\.|Appendix|Tables?|Sec\.|Prop\.|Fig\.|§)\s*[\w.]+(?:\s*[/–,-]\s*[\w.]+)*",
    flags=re.I,
)


def _numbers(text: str) -> list[str]:
    """The numbers of ``text``, normalised: − as -, no leading +, no thousands comma."""
    return [m.replace("−", "-").lstrip("+").replace(",", "") for m in NUMBER.findall(text)]


def _prose_numbers(text: str) -> list[str]:
    """The numbers of markdown prose: code blocks, code spans, link targets and paper references left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^#+ .*$", "", text, flags=re.M)
    return _numbers(REFERENCE.sub("", text))


def test_experiments_numbers_are_in_the_report():
    """Every number docs/experiments.md writes is one experiments/REPORT.md prints (generated from results)."""
    report = set(_numbers((REPO / "experiments/REPORT.md").read_text(encoding="utf-8")))
    missing = [n for n in _prose_numbers(page_text("docs/experiments.md")) if n not in report]
    assert not missing, f"docs/experiments.md quotes numbers experiments/REPORT.md does not print: {missing}"


#: docs/experiments.md's findings ("What held, what did not, and why"): each measured number is tied to the
#: one row of experiments/REPORT.md it is read from. An entry: a pattern of the findings' prose (code
#: spans, links and paper references removed, whitespace collapsed, as ``_findings_prose`` gives it) whose
#: groups are quoted numbers, the report section (a substring of its ``## `` heading) and the row (a
#: substring of the report line: a prediction's claim, a table row's measure, a note's opening), one row per
#: group or one for all. The pattern keys on the wording, so the numbers can change with a rerun; when the
#: wording changes, the failure lists the report lines that hold the untied number.
TOY_MAIN, GROUP, FRONTIER, EPS, EQUIV = "GRPO, GSPO, the eq. 86 control", "group size", "own best step", "clip range", "equivalent solutions"  # fmt: skip
ADAM, BATCH, LOWP, LM, LM_BIG = "Adam against", "query-preserved", "low-probability", "Language model with power", "Language model with bigger"  # fmt: skip
RESID = "Language model where the control's residual is large"
FINDINGS_TIES: tuple[tuple[str, str, str | tuple[str, ...]], ...] = (
    (r"adjusted over the report's (\d+) decided predictions", "How a prediction", "decided predictions"),
    (r"sooner than GSPO \(Δ (\S+) steps\)", TOY_MAIN, "DFPO Min-Replace reaches E[R] ≥ 0.9 in fewer steps than GSPO"),
    (r"G = 2 / 4 / 8 / 16: (\S+) / (\S+) / (\S+) / ([^\s)]+)\)", GROUP,
     tuple(f"G = {g}: DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO" for g in (2, 4, 8, 16))),
    (r"shrinkage is (\S+) steps here, not resolved", TOY_MAIN, "DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control"),
    (r"at ε 0.2 it holds \((\S+) steps, Holm p ([^)]+)\)", EPS,
     "With bigger steps, DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control at ε 0.2"),
    (r"group-shared residual (\S+) against GSPO", TOY_MAIN, "DFPO cancels on tokens the whole group shares, GSPO does not"),
    (r"the largest tried, in (\S+) to (\S+) steps\)", FRONTIER, "steps to E[R] ≥ 0.9"),
    (r"\(DFPO − GSPO (\S+) steps,", FRONTIER, "At each arm's best step size, DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO"),
    (r"DFPO − control (\d+), tied", FRONTIER, "At each arm's best step size, DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control"),
    (r"template KL at matched reward (\S+) \(Holm p (\S+)\) at about 20 steps", FRONTIER,
     "At equal speed of about 20 steps, DFPO pays less learning tax than GSPO"),
    (r"\(GSPO (\S+), DFPO (\S+) steps\)", FRONTIER, "steps to E[R] ≥ 0.9"),
    (r"and (\S+) at the fast end", FRONTIER, "At equal speed, DFPO pays less learning tax (template KL at matched reward) than GSPO"),
    (r"against the control it is not resolved \((\S+)\)", FRONTIER,
     "At equal speed of about 20 steps, DFPO pays less learning tax than the eq. 86 control"),
    (r"discovery seeds \((\S+) \[(\S+), ([^\]]+)\]\); on the 1,024 fresh seeds it is lower than the control's, (\S+), held",
     EPS, "With bigger steps, DFPO pays less learning tax (template KL at matched reward) than the eq. 86 control at the paper's ε"),
    (r"ε 0.2: (\S+) on discovery, (\S+) on confirmation", EPS,
     "With bigger steps, DFPO pays less learning tax than the eq. 86 control at ε 0.2"),
    (r"at matched reward than DFPO \((\S+), contradicted\)", EQUIV,
     "DFPO keeps a higher entropy than GSPO at matched reward (seq-mean-token-mean)"),
    (r"above the control only by (\S+)\.", EQUIV, "Sequence coupling alone (same estimator)"),
    (r"\(sequence-net residual (\S+)\)", EPS, "GRPO-fix leaks less than GRPO at ε 0.2"),
    (r"ends higher \((\S+)\), but it is", EPS, "GRPO-fix ends with a higher E[R] than GRPO at ε 0.2"),
    (r"\((\S+) steps, contradicted; also", EPS, "GRPO-fix reaches E[R] ≥ 0.9 later than GRPO at ε 0.2"),
    (r"at each arm's best setting, (\S+)\)", FRONTIER, "GRPO-fix is slower than GRPO"),
    (r"same steps as GRPO-fix \(difference (\S+) steps", EPS, "- GRPO-fix − GRPO without the lower clip"),
    (r"\"more stability\" promises \((\S+), contradicted\)", EPS, "GRPO-fix keeps a higher equivalent-set entropy than GRPO at ε 0.2"),
    (r"more equivalent-set entropy than GRPO \((\S+)\)", EPS, "Clip-higher keeps a higher equivalent-set entropy than GRPO"),
    (r"much faster than GSPO \((\S+) steps\)", ADAM, "Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO"),
    (r"faster than the control \((\S+), not resolved\)", ADAM,
     "Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control"),
    (r"less tax there \((\S+), held\)", ADAM, "Under Adam, DFPO pays less learning tax"),
    (r"group-shared residual (\S+) for GRPO, (\S+) for DFPO", BATCH,
     ("GRPO: query-preserved mini-batches leave a lower group-shared residual",
      "DFPO: query-preserved mini-batches leave a lower group-shared residual")),
    (r"slower \((\S+) steps at ρ = 0.25\)", BATCH, "GRPO: reward-balanced batching (ρ = 0.25) reaches E[R] ≥ 0.9 sooner"),
    (r"\((\S+) steps, contradicted\); Lopti", LOWP, "Advantage Reweighting reaches E[R] ≥ 0.9 in fewer steps than GRPO"),
    (r"Lopti is not resolved \((\S+)\)", LOWP, "Lopti reaches E[R] ≥ 0.9 in fewer steps than GRPO"),
    (r"\(steps 1-10\), is (\S+) under GRPO", LOWP, "high-probability tokens of Â > 0 completions updated upwards"),
    (r"\((\S+) and (\S+), not resolved\): on the toy", LOWP,
     ("Advantage Reweighting updates more high-probability tokens", "Lopti updates more high-probability tokens")),
    (r"its held-out greedy accuracy is ([^)\s]+)\)", LM, "greedy accuracy of the warm start"),
    (r"GSPO 0.0002 \((\S+) / (\S+) / (\S+) at", LM, "- The lr probe"),
    (r"5e-05: (\S+) and (\S+) there, (\S+) and (\S+) at 0.0001\)", LM, "- The lr probe"),
    (r"The reward threshold, (\S+), was fixed from the probe's runs \(start level (\S+) \+", LM, "**Setting.**"),
    (r"avg@8 by (\S+) over the warm start's (\S+) \(", LM, ("avg@k gain over the warm start", "avg@k of the warm start")),
    (r"is at most (\S+)\)", LM, "- Held-out measures are on each seed's own"),
    (r"greedy accuracy by (\S+) over (\S+)\.", LM,
     ("greedy-accuracy gain over the warm start", "greedy accuracy of the warm start")),
    (r"\(speed (\S+) steps, MDE ([^;]+); avg@8 (\S+), MDE ([^;]+); form entropy at step 100 ([^)]+)\)", LM,
     ("DFPO Min-Replace reaches the threshold in fewer steps than the eq. 86 control",) * 2
     + ("DFPO ends with a higher avg@k than the eq. 86 control",) * 2
     + ("DFPO keeps a higher form entropy than the eq. 86 control at the end",)),
    (r"under the control is already (\S+),", LM, "sequence-net residual"),
    (r"where it was \((\S+) for the control\)", LM, "group-shared residual"),
    (r"DFPO is slower by (\S+) steps \(p (\S+), but Holm p (\S+):", LM,
     "DFPO Min-Replace reaches the reward threshold in fewer steps than GSPO"),
    (r"ends lower on avg@8 \((\S+), Holm p (\S+), contradicted\)", LM, "DFPO ends with a higher avg@k than GSPO"),
    (r"most frequent tokens \((\S+), Holm p (\S+), contradicted", LM,
     "DFPO puts a smaller share of gradient energy on the most frequent tokens than GSPO"),
    (r"residual larger \((\S+),", LM_BIG, "group-shared residual"),
    (r"against (\S+) at 0.0001\); both", LM, "group-shared residual"),
    (r"\(avg@8 (\S+) and (\S+), against", LM_BIG, "avg@8 at step 100"),
    (r"against (\S+) and (\S+): a comparison across", LM, "avg@8 at step 100"),
    (r"at step 100 \((\S+), Holm p (\S+): not resolved, and on the", LM,
     "DFPO keeps a higher form entropy than GSPO at the end"),
    (r"template KL (\S+) at E\[R\] ≥ 0.9", TOY_MAIN, "template KL (learning tax) at E[R] ≥ 0.9"),
    (r"and (\S+) at step 200", TOY_MAIN, "template KL at step 200"),
    (r"untransformed control \((\S+)\)", TOY_MAIN, "template KL (learning tax) at E[R] ≥ 0.9"),
    (r"in DFPO's systematic drift is (\S+), the control's (\S+) and GSPO's (\S+);", TOY_MAIN,
     ("| DFPO Min-Replace |", "| GSPO eq. 86 control (paper's estimator, no transform) |",
      "| GSPO (ε 3e-4/4e-4, its clipped objective) |")),
    (r"about 20 steps DFPO's is (\S+) against GSPO's (\S+)\.", FRONTIER,
     ("| DFPO Min-Replace @tax20", "| GSPO (ε 3e-4/4e-4) @tax20")),
    (r"residual is (\S+) per step \(more than four times", RESID, "group-shared residual"),
    (r"'s\), DFPO's (\S+);", RESID, "group-shared residual"),
    (r"speed (\S+) steps \(MDE ([^)]+)\)", RESID, "DFPO Min-Replace reaches the threshold in fewer steps than the eq. 86 control"),
    (r"avg@8 (\S+) \(MDE ([^)]+)\), greedy", RESID, "DFPO ends with a higher avg@k than the eq. 86 control"),
    (r"greedy accuracy (\S+), form entropy", RESID, "DFPO ends with a higher greedy accuracy than the eq. 86 control"),
    (r"at the last step (\S+),", RESID, "DFPO keeps a higher form entropy than the eq. 86 control at the end"),
    (r"from the warm start (\S+) and the clip", RESID, "DFPO's shared head drifts less from the warm start"),
    (r"the clip fraction (\S+) \('s fewer", RESID, "trigger the clip less often than the control's"),
)  # fmt: skip
#: Settings the findings name (learning rates, group sizes, seeds, steps, thresholds): not measurements.
FINDINGS_SETTINGS = {
    "1024",
    "8",
    "0.5",
    "4",
    "0.9",
    "2",
    "16",
    "1.0",
    "256",
    "0.2",
    "0.25",
    "1",
    "10",
    "0.0004",
    "0.0002",
    "0.0001",
    "5e-05",
    "0.01",
    "0.1",
    "100",
    "30",
    "20",
    "200",
    "0",
}  # fmt: skip (0: "scatter of mean 0")


def _findings_prose() -> str:
    """docs/experiments.md's findings section as ``_prose_numbers`` reads it, whitespace collapsed."""
    text = page_text("docs/experiments.md").split("## What held, what did not, and why", 1)[1]
    text = text.split("\n## ", 1)[0]
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return " ".join(REFERENCE.sub("", text).split())


def _report_sections() -> dict[str, list[str]]:
    """experiments/REPORT.md's ``## `` sections: heading → its lines."""
    out: dict[str, list[str]] = {}
    head = ""
    for line in (REPO / "experiments/REPORT.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            head = line[3:]
        out.setdefault(head, []).append(line)
    return out


def test_each_finding_number_is_tied_to_its_report_row():
    """Every measured number of docs/experiments.md's findings is one that its row of the report prints: the
    row of the prediction or measure the sentence quotes, in the study's own section (``FINDINGS_TIES``), not
    merely some number somewhere in the report; every other number is a setting (``FINDINGS_SETTINGS``)."""
    prose, sections = _findings_prose(), _report_sections()
    covered, problems = set(), []
    for pattern, section, rows in FINDINGS_TIES:
        m = re.search(pattern, prose)
        if m is None:
            problems.append(f"the findings no longer say {pattern!r}: update FINDINGS_TIES")
            continue
        lines = [ln for head, body in sections.items() if section in head for ln in body]
        if not lines:
            problems.append(f"the report has no section whose heading contains {section!r}")
            continue
        for i in range(1, (m.lastindex or 0) + 1):
            covered.add(m.start(i))
            number, row = _numbers(m.group(i)), rows if isinstance(rows, str) else rows[i - 1]
            on_row = [ln for ln in lines if row in ln]
            if not on_row:
                problems.append(f"{section!r}: no report line contains the row {row!r}")
            elif not number or not any(number[0] in _numbers(ln) for ln in on_row):
                where = [ln[:120] for ln in (REPO / "experiments/REPORT.md").read_text(encoding="utf-8").splitlines()
                         if number and number[0] in _numbers(ln)][:5]  # fmt: skip
                problems.append(f"{m.group(i)!r} is not on its row {row!r} ({section!r}); it is on: {where}")
    for m in NUMBER.finditer(prose):
        value = m.group().replace("−", "-").lstrip("+").replace(",", "")
        if m.start() not in covered and value not in FINDINGS_SETTINGS:
            problems.append(
                f"untied number {m.group()!r} in '...{prose[max(0, m.start() - 60) : m.end() + 10]}...'"
            )
    assert not problems, "\n".join(problems)


def test_toy_findings_are_in_the_printed_outputs():
    """docs/toy.md's "What the toy shows" quotes only numbers that its own command outputs print."""
    text = page_text("docs/toy.md")
    printed = set(_numbers("\n".join(re.findall(r"^```(?:text|bash)\n(.*?)^```", text, flags=re.S | re.M))))
    section = text.split("### What the toy shows", 1)[1].split("\n#", 1)[0]
    printed.add("0")  # an exact zero (Σ Â = 0) is the math's, not a measurement
    missing = [n for n in _prose_numbers(section) if n not in printed]
    assert not missing, f"docs/toy.md's findings quote numbers its printed outputs do not show: {missing}"


# ------------------------------------------------------------------------------------------------
# the quick commands, run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runnable_argv(cmd: Command) -> list[str]:
    """The command as run here: this interpreter, a smaller budget, the repository's config files."""
    a = list(cmd.argv)
    if a[0] in PYTHONS:
        a[0] = sys.executable
    if a[0] == "accelerate":  # a free port: other test runs may use accelerate's default one
        a = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--main_process_port",
            str(_free_port()),
            *a[2:],
        ]
    a = [str(REPO / v) if i and a[i - 1] == "--config" else v for i, v in enumerate(a)]
    program = "scaledrun.train" if cmd.trainer_args() else cmd.program
    budget = list(BUDGET[program])
    if program == "scaledrun.train" and _value(cmd.trainer_args(), "--resume") == "true":
        budget += RESUME_BUDGET
    return a + budget


@pytest.mark.slow
@pytest.mark.sampling
def test_readme_quick_commands_run(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    done: set[str] = set()
    ran = []
    for cmd in all_block_commands():
        if classify(cmd) is not None or cmd.text in done:
            continue
        done.add(cmd.text)
        argv = runnable_argv(cmd)
        run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (
            f"{cmd.page} command failed: {cmd.text}\nran: {' '.join(argv)}\n"
            f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
        )
        args = cmd.trainer_args()
        if args:  # the one-line summary names the folder the page names, which holds the run
            out = _value(args, "--output_dir")
            assert f"run {out}: " in run.stdout, run.stdout[-2000:]
            assert (tmp_path / out / "metrics.jsonl").is_file()
        ran.append((cmd.page, cmd.program))
    assert {"scaledrun.tiny", "scaledrun.train", "toymodel", "accelerate"} <= {p for _, p in ran}, ran
    assert {"README.md", "docs/trainer.md", "docs/toy.md"} <= {page for page, _ in ran}, ran
    assert (tmp_path / "artifacts" / "tiny-qwen3" / "config.json").is_file()


def test_the_first_hours_numbers_are_the_generated_ones():
    """Every number of the README's first hour comes from docs/first-hour.json (``python -m
    tools.first_hour``: three instruction sets × three seeds) or from the code it describes."""
    import json

    from scaledrun.tiny import DEFAULT_STOP_ACCURACY, DEFAULT_WARM_START_STEPS, NUM_PROBE, STOP_CHECK_EVERY

    data = json.loads((REPO / "docs" / "first-hour.json").read_text())
    text = " ".join(readme_text().split("## Your first hour", 1)[1].split("\n## ", 1)[0].split())
    ranges, models = data["ranges"], data["model_ranges"]

    def span(lo_hi, digits=2):
        return f"{lo_hi[0]:.{digits}f}–{lo_hi[1]:.{digits}f}"

    grpo, fix = ranges["grpo"], ranges["grpo_symclip"]
    runs, pairs = data["runs"], data["pairs"]
    fix_runs = [r for r in runs if r["objective"] == "grpo_symclip"]
    drifted = max(fix_runs, key=lambda r: r["truncated_last10"])
    diff, below = data["symclip_minus_grpo"], data["symclip_below_grpo"]
    per_objective = len(fix_runs)
    expected = [
        f"The ranges below are what {_count_word(per_objective)} runs measured: three instruction sets",
        f"Over the {_count_word(per_objective)} measured runs of each, GRPO gave R",
        f"reaches {DEFAULT_STOP_ACCURACY}",
        f"checked every {STOP_CHECK_EVERY} steps, at most {DEFAULT_WARM_START_STEPS:,} steps",
        f"a probe of {NUM_PROBE} training-split problems",
        f"the three measured builds stopped after {span(models['steps'], 0)} steps, at held-out accuracy "
        f"{span(models['accuracy'])}, in {span(models['seconds'], 0)} s",
        f"GRPO gave R {span(grpo['reward_last10'])} and A {span(grpo['eval_last'])}",
        f"GRPO-fix R {span(fix['reward_last10'])} and A {span(fix['eval_last'])}",
        f"the 200 steps took {span(data['run_seconds'], 0)} s per run",
        f"(`clip/low_frac`, the mean over the steps, measured {span(grpo['clip_low_frac'], 3)} over the "
        f"{_count_word(per_objective)} runs)",
        f"(`clip/high_frac` measured {span(fix['clip_high_frac'], 3)} against GRPO's "
        f"{span(grpo['clip_high_frac'], 3)}, higher in each of the {pairs} pairs)",
        f"was below GRPO's in {below['reward_first_quarter']} of {pairs} pairs "
        f"(by {-diff['reward_first_quarter'][1]:.3f}–{-diff['reward_first_quarter'][0]:.3f})",
        f"it was below in {below['reward_last10']} of {pairs} too, but by as little as "
        f"{-diff['reward_last10'][1]:.3f}",
        f"its last held-out accuracy was below in {below['eval_last']} of {pairs}",
        f"One GRPO-fix run of the {len(runs)} collapsed",
        f"held-out accuracy fell to {drifted['eval_last']:.2f})",
    ]
    # what the prose says about the data, beyond its numbers
    assert sum(r["collapsed"] for r in runs) == 1 and drifted["collapsed"]  # "One GRPO-fix run ... collapsed"
    assert below["clip_high_frac"] == 0 and diff["clip_high_frac"][0] > 0  # "higher in each of the pairs"
    assert below["clip_low_frac"] == pairs and fix["clip_low_frac"] == [0.0, 0.0]  # "0 by construction"
    assert all(d < 0 for d in diff["reward_first_quarter"] + diff["reward_last10"])  # "below" in every pair
    missing = [e for e in expected if e not in text]
    assert not missing, f"the README's first hour does not say (python -m tools.first_hour): {missing}"

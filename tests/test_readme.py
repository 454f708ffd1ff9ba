"""The README's commands work as written: docs that match what happens.

Every fenced ```bash block of README.md is read; each command in it (``\\`` continuations joined, comments
dropped) is either run by ``test_readme_quick_commands_run`` or skipped by a rule of ``classify`` that
says why (it sets up ``.venv``, serves the app, or needs GPUs and a hub download). A command no rule
covers fails ``test_every_readme_command_is_covered``: a new README command gets tested or explicitly
skipped.

The runnable commands run in README order in a temporary folder (so what they write, ``artifacts/...`` and
``runs/...``, lands there, and the configs' relative ``model: artifacts/tiny-qwen3`` finds the model the
README's own ``scaledrun.tiny`` command built), with this interpreter for ``python`` and only a smaller
budget appended (``BUDGET``); ``--config`` paths point at the repository's files. Each training command
writes the folder the README names, and the trainer refuses a folder that already holds a run, so two
README commands sharing a folder fail here too.

The other tests are fast: every option of every README command, in the code blocks and in the prose
(`` `python ...` `` spans), must be one its program knows (its ``--help`` or its source), every ``make``
target must exist, and every training command must name its own ``--output_dir``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAKEFILE = REPO / "Makefile"
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
#: make targets a README code block may name; none is run here (they set up .venv, run the whole suite
#: or serve the app); ``test_make_targets_exist`` checks the Makefile has them
MAKE_SKIP_REASON = "make targets set up .venv first (and `make app` serves until Ctrl-C)"


@dataclass(frozen=True)
class Command:
    text: str  # as written (continuations joined, comment dropped)
    argv: tuple[str, ...]
    where: str  # "block" or "prose"

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
    return [a.split("=")[0] for a in args if a.startswith("--")]


def _value(args: list[str], option: str) -> str | None:
    vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]
    return vals[-1] if vals else None


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def block_commands(text: str | None = None) -> list[Command]:
    """Every command of every ```bash block, in README order."""
    text = readme_text() if text is None else text
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(Command(" ".join(argv), tuple(argv), "block"))
    return out


def prose_commands(text: str | None = None) -> list[Command]:
    """Every `` `python ...` ``, `` `.venv/bin/python ...` `` and `` `make ...` `` span outside the code blocks."""
    text = readme_text() if text is None else text
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = []
    for span in re.findall(r"`((?:\.venv/bin/)?python3? [^`]+|make [^`]+)`", prose):
        argv = shlex.split(" ".join(span.split()))
        out.append(Command(" ".join(argv), tuple(argv), "prose"))
    return out


def classify(cmd: Command) -> str | None:
    """None: run it; else why it is not run. Raises for a command no rule covers."""
    a = cmd.argv
    if a[0] == "make":
        return MAKE_SKIP_REASON
    if a[0] in PYTHONS and cmd.program in BUDGET:
        return None
    if a[0] in PYTHONS and cmd.program == "experiments":
        return (
            "runs the studies (minutes even in --quick); tests/experiments runs their smallest slice end to "
            "end, through this command's --report-only path"
        )
    if a[:2] == ("accelerate", "launch") and cmd.trainer_args():
        if "--preset" in cmd.trainer_args():
            return "a --preset names a hub model (a download and GPUs)"
        if not _value(list(a), "--num_processes") or not _value(list(a), "--num_processes").isdigit():
            return "a placeholder process count (N GPUs)"
        return None
    raise AssertionError(
        f"README command not covered by tests/test_readme.py's rules: {cmd.text!r} (run it in "
        "test_readme_quick_commands_run with a small budget, or add a skip rule that says why)"
    )


# ------------------------------------------------------------------------------------------------
# fast checks


def test_the_readme_has_the_expected_command_blocks():
    cmds = block_commands()
    programs = [c.program for c in cmds]
    assert "scaledrun.tiny" in programs and "toymodel" in programs and programs.count("scaledrun.train") >= 4
    # the first-hour path: make app, the tiny model, two objectives into two folders, in that order
    first_hour = readme_text().split("## Your first hour", 1)[1].split("\n## ", 1)[0]
    fh = block_commands(first_hour)
    assert [c.program for c in fh] == ["make", "scaledrun.tiny", "scaledrun.train", "scaledrun.train"]
    assert fh[0].argv == ("make", "app")
    assert {_value(c.trainer_args(), "--objective") for c in fh[2:]} == {"grpo", "grpo_symclip"}


def test_every_readme_command_is_covered():
    for cmd in block_commands():
        classify(cmd)  # raises for an uncovered command


def test_every_training_command_writes_its_own_folder():
    """No two README training commands share an ``--output_dir``, except a ``--resume true`` of an earlier one."""
    seen: list[str] = []
    for cmd in block_commands() + prose_commands():
        args = cmd.trainer_args()
        if not args or "--help" in args:
            continue
        out = _value(args, "--output_dir")
        assert out, (
            f"README training command without --output_dir (the config's folder would be shared): {cmd.text}"
        )
        if _value(args, "--resume") == "true":
            assert out in seen, f"{cmd.text}: resumes {out}, which no earlier README command writes"
        elif cmd.where == "block":
            assert out not in seen, f"{cmd.text}: {out} is written by an earlier README command too"
            seen.append(out)


def test_make_targets_exist():
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", MAKEFILE.read_text(), flags=re.M))
    for cmd in block_commands() + prose_commands():
        if cmd.argv[0] == "make":
            named = [a for a in cmd.argv[1:] if "=" not in a and not a.startswith("-")]
            assert set(named) <= targets, f"{cmd.text}: no such make target(s) {set(named) - targets}"


@functools.cache
def _known_options(program: str) -> str:
    """The ``--help`` text of ``program`` plus its source (options that ``main`` takes out before argparse)."""
    if program.endswith(".py"):
        path = REPO / program
        assert path.is_file(), f"README names {program}, which does not exist"
        cmd, source = [sys.executable, str(path), "--help"], path.read_text()
    else:
        spec = importlib.util.find_spec(program)
        assert spec is not None, f"README names module {program}, which does not exist"
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
        assert re.search(re.escape(opt) + r"(?![\w-])", known), f"{cmd.text}: {program} has no option {opt}"


def test_every_readme_python_option_exists():
    """A renamed or removed option fails here, for the code blocks and for the commands quoted in the prose."""
    for cmd in block_commands() + prose_commands():
        a = list(cmd.argv)
        if a[0] in PYTHONS:
            _check_options(cmd.program, _options(a[3:] if a[1] == "-m" else a[2:]), cmd)
        elif a[:2] == ["accelerate", "launch"]:
            _check_options("accelerate.commands.launch", _options(a[2 : a.index("-m")]), cmd)
            _check_options("scaledrun.train", _options(cmd.trainer_args()), cmd)


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
    for cmd in block_commands():
        if classify(cmd) is not None or cmd.text in done:
            continue
        done.add(cmd.text)
        argv = runnable_argv(cmd)
        run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (
            f"README command failed: {cmd.text}\nran: {' '.join(argv)}\n"
            f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
        )
        args = cmd.trainer_args()
        if args:  # the one-line summary names the folder the README names, which holds the run
            out = _value(args, "--output_dir")
            assert f"run {out}: " in run.stdout, run.stdout[-2000:]
            assert (tmp_path / out / "metrics.jsonl").is_file()
        ran.append(cmd.program)
    assert {"scaledrun.tiny", "scaledrun.train", "toymodel", "accelerate"} <= set(ran), ran
    assert (tmp_path / "artifacts" / "tiny-qwen3" / "config.json").is_file()

"""The trainer's command line outside the config: ``--import``, the debug hooks, ``--help``, usage errors.

``python -m scaledrun.train`` (``scaledrun.train.main``) takes these options out of the command line first
(``CLI_OPTIONS``, ``pop_option``), imports the ``--import`` modules (``import_modules``), and reads the rest
as ``RunConfig`` fields (``scaledrun.config.load_config``). A mistake in the command, the config or a
folder prints ``error: ...`` without a traceback and exits 2 (``usage_error``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn


def pop_option(argv: list[str], name: str) -> list[str]:
    """Remove every ``name value`` pair from ``argv``; return the values."""
    values = []
    while name in argv:
        i = argv.index(name)
        if i + 1 >= len(argv):
            raise ValueError(f"command line: {name} needs a value")
        values.append(argv[i + 1])
        del argv[i : i + 2]
    return values


#: The command line's options outside ``RunConfig`` (``main`` takes them out first), as ``--help`` lists them.
CLI_OPTIONS = {
    "--config": (
        "PATH.yaml",
        "A YAML file of RunConfig fields (scaledrun/configs/default.yaml); the --field options override it.",
    ),
    "--import": (
        "MODULE",
        "Import this module first (repeatable), e.g. one that registers a reward with "
        "@scaledrun.rewards.register_reward('my_fn') for --reward my_fn. Its folder must be on the Python "
        "path (the working directory is); for a file anywhere use --reward_file PATH.py:FUNCTION.",
    ),
    "--debug_dir": ("DIR", "Debug: each process writes its step batches, gradients and weights under DIR."),
    "--replay_dir": ("DIR", "Debug: a step with a saved batch under DIR trains on it instead of sampling."),
}


def print_help() -> None:
    """``--help``: the options outside the config, then every ``RunConfig`` field with its docstring."""
    import argparse

    from .config import make_parser

    parser = make_parser()
    parser.prog = "python -m scaledrun.train"
    group = parser.add_argument_group("options outside the config")
    for name, (metavar, text) in CLI_OPTIONS.items():
        group.add_argument(name, metavar=metavar, help=text, default=argparse.SUPPRESS)
    parser.print_help()


def import_modules(modules: list[str]) -> None:
    """``--import`` each module; one that cannot be imported is a ``ValueError`` naming it and the path."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not (module == err.name or module.startswith(err.name + ".")):
                raise ValueError(
                    f"--import {module}: it imports {err.name!r}, which is not installed"
                ) from err
            raise ValueError(
                f"--import {module}: no module {err.name!r} on the Python path (the working directory "
                f"{Path.cwd()} and the installed packages); run from the folder that holds {module.split('.')[0]}.py, "
                "add its folder to PYTHONPATH, or pass --reward_file PATH.py:FUNCTION for a reward in a file"
            ) from err
        except Exception as err:  # a module that fails while it runs: say which one
            raise ValueError(f"--import {module} failed: {type(err).__name__}: {err}") from err


def usage_error(err: Exception) -> NoReturn:
    """A mistake in the command, the config or a folder: print the message (no traceback), exit 2."""
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(2) from None

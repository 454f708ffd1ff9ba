"""Suite-wide settings, and the knobs that make this machine behave like another one.

Every tensor in the toy and the math tests has at most a few thousand elements: torch's intra-op
threads only add overhead there, and on a busy 2-core machine a lot of it, so the suite runs torch on
``THREADS`` threads, one unless told otherwise (the app and the toy CLI use one too).

Floating-point results differ between CPUs (which SIMD kernels run, the summation order of a thread
count), so a trained tiny model and the tokens it samples differ from machine to machine. A test must
therefore assert what every correct run has, never what one machine's trajectory happened to give.
``make test-machines`` (``tests/machines.py``) checks that before CI does: it runs the tests marked
``sampling`` (those whose inputs come from a trained model or from sampled tokens) under other seeds,
thread counts and CPU instruction sets, through these environment variables:

- ``CANCELLATION_TEST_SEED`` (default 0): the seed of the tiny models the suite builds and of the
  runs it trains (``SEED``);
- ``CANCELLATION_TEST_THREADS`` (default 1): torch's intra-op threads here and in the subprocesses the
  tests launch (``THREADS``);
- ``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``: read by torch, MKL and
  oneDNN themselves; capping them (``tools/machines.py``, e.g. at AVX2 on an AVX-512 machine)
  runs the kernels another CPU would run.
"""

from __future__ import annotations

import os

import pytest
import torch

SEED = int(os.environ.get("CANCELLATION_TEST_SEED", "0"))
THREADS = int(os.environ.get("CANCELLATION_TEST_THREADS", "1"))

torch.set_num_threads(THREADS)
# ... and in every process a test starts (a documented command, a training run, ``--help``): on two
# cores and two pytest workers, a subprocess on torch's default two threads ran test_readme's commands
# in 223 s against 180 s on one (measured alone, the same commands)
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(THREADS)


#: The files that take longest, longest first (minutes of test time, measured with ``--durations=0`` on
#: two workers on the 2-core machine). ``make test`` hands whole files to its two workers in collection
#: order (``--dist loadfile --no-loadscope-reorder``): starting these first keeps one long file from
#: running alone at the end (it did: 14 min with the default order for 13.5 min of work per worker).
#: Only the order depends on this list; a stale entry costs minutes, never a result.
LONGEST_FIRST = (
    "tests/test_readme.py",  # 4.2
    "tests/tutorials/test_tutorials.py",  # 3.6
    "tests/experiments/test_lm_power.py",  # 2.7
    "tests/app/test_browser.py",  # 2.3
    "tests/scaledrun/test_multiprocess.py",  # 1.5
    "tests/experiments/test_lm.py",  # 1.4
    "tests/toymodel/test_simulate.py",  # 1.1
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a trained tiny model (the ``tiny_model`` fixture) is a ``sampling`` test; the
    ``LONGEST_FIRST`` files go first, each in its own order (a stable sort)."""
    for item in items:
        if "tiny_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sampling)
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))

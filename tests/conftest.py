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
  oneDNN themselves; capping them (``experiments/machines.py``, e.g. at AVX2 on an AVX-512 machine)
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a trained tiny model (the ``tiny_model`` fixture) is a ``sampling`` test."""
    for item in items:
        if "tiny_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sampling)

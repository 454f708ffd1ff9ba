"""How the suite tests a claim of exactness: two code paths that compute the same number.

Micro-batches and one pass, packed and padded passes, the chunked scorer and the full logits, two
processes and one, the batched toy and one run at a time: each pair sums the same terms in another
order, and which order a sum runs in depends on the CPU (its SIMD width, the thread count; ``make
test-machines`` runs these tests as three other machines would). A tolerance that one CPU happens to
meet in float32 (1e-6 of a gradient, 1e-7 of a meter sum) fails on the next one. So such a test

- runs in **float64** (model and batch, ``scaledrun.scoring`` scores a float64 model in float64) and
  compares at ``FLOAT64_RTOL`` of the gross magnitude of the sums compared (``close``): float64 rounds at 1.1e-16, so 1e-9 leaves a factor of ~10^6 for the length of
  the sums and the depth of the network, on any CPU, and a wrong result (a term missed, a group
  normalised by the wrong count) is off by far more;
- or, where float64 cannot run (a bfloat16 path, a float32 path that is itself under test), compares
  at ``rounding_tolerance(gross, terms, dtype)``: the bound on the rounding error of a sum of ``terms``
  terms whose absolute values add up to ``gross`` (|fl(Σx) − Σx| ≤ γ_{n−1}·Σ|x|, γ_n ≈ n·u with
  u = eps/2: N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2), twice
  over (two sums, each with its own order).

Every such test carries the ``exactness`` marker (``pyproject.toml``), which ``tests/machines.py`` runs
under every profile.
"""

from __future__ import annotations

import math
from dataclasses import fields

import torch

#: The relative tolerance of a float64 comparison between two code paths (see the module docstring).
FLOAT64_RTOL = 1e-9


def rounding_tolerance(gross: float, terms: int, dtype: torch.dtype = torch.float32) -> float:
    """The largest difference two orders of one sum can show: ``gross`` × ``terms`` × eps(``dtype``).

    ``gross``: Σ|x_i| of the summed terms (for a chain of sums, of the largest); ``terms``: their count.
    """
    return float(gross) * max(int(terms), 1) * torch.finfo(dtype).eps


def close(a: float, b: float, gross: float = 0.0, rtol: float = FLOAT64_RTOL) -> bool:
    """|a − b| ≤ rtol · max(|a|, |b|, gross), or both NaN. ``gross``: the magnitude of the terms whose sum
    a and b are (a net that cancels to ~0 is compared at the scale of its gross sum, not its own)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rtol * max(abs(a), abs(b), gross)


def max_abs_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| (in float64)."""
    return float((got.double() - want.double()).abs().max())


def as_float64(batch):
    """``batch`` (a ``RolloutBatch``) with every floating-point tensor in float64 (ids and masks' values kept)."""
    out = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        out[f.name] = v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
    return type(batch)(**out)

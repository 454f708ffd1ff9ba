"""Run the machine-dependent tests as other machines would: ``make test-machines``.

A test that passes here because the tiny model happened to learn or sample one way fails on the next
CPU, and so does a comparison of two code paths at a float32 tolerance that this CPU's summation order
happens to meet. This script runs the tests marked ``sampling`` (``tests/conftest.py``: every test
that uses a trained tiny model or sampled tokens) or ``exactness`` (those that compare the
floating-point results of two code paths: ``tests/exactness.py``) once per *profile*, a combination of

- a seed for the tiny models and runs the tests build (``CANCELLATION_TEST_SEED``),
- torch's thread count (``CANCELLATION_TEST_THREADS``: another summation order),
- the CPU instruction set torch, MKL and oneDNN may use (``ATEN_CPU_CAPABILITY``,
  ``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``): capping it runs the kernels a CPU without
  AVX-512 (or without any SIMD) runs, and changes the trained model as much as another machine does,

and prints one line per profile. It exits with 1 when a profile fails, so a trajectory-dependent
assertion, or an exactness one at a tolerance one CPU happens to meet, fails on this machine before it
fails in CI::

    python -m tests.machines                       # every profile, the sampling and exactness tests
    python -m tests.machines --profiles avx2-seed1 -- -k test_update   # one profile, some tests
    python -m tests.machines --list                # the profiles
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tools.machines import INSTRUCTION_SETS

REPO = Path(__file__).resolve().parents[1]
_AVX2, _NO_SIMD = INSTRUCTION_SETS["avx2"], INSTRUCTION_SETS["nosimd"]

#: The tests every profile runs (a pytest ``-m`` expression).
SELECTION = "sampling or exactness"

#: name -> environment. The suite's own run (seed 0, 1 thread, this CPU's instructions) is the default;
#: each profile here changes the seed and the kernels or the thread count.
PROFILES: dict[str, dict[str, str]] = {
    "avx2-seed1": {**_AVX2, "CANCELLATION_TEST_SEED": "1", "CANCELLATION_TEST_THREADS": "1"},
    "nosimd-seed2": {**_NO_SIMD, "CANCELLATION_TEST_SEED": "2", "CANCELLATION_TEST_THREADS": "1"},
    "native-seed3-2threads": {"CANCELLATION_TEST_SEED": "3", "CANCELLATION_TEST_THREADS": "2"},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated profile names")
    ap.add_argument("--list", action="store_true", help="print the profiles and exit")
    ap.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments (e.g. -k NAME)")
    args = ap.parse_args(argv)
    if args.list:
        for name, env in PROFILES.items():
            print(f"{name:24s} " + " ".join(f"{k}={v}" for k, v in env.items()))
        return 0
    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        ap.error(f"unknown profile(s) {', '.join(unknown)}; valid: {', '.join(PROFILES)}")
    results = []
    for name in names:
        env = {**os.environ, **PROFILES[name]}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            SELECTION,
            "-p",
            "no:cacheprovider",
            *args.pytest_args,
        ]
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in PROFILES[name].items())}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        summary = lines[-1] if lines else proc.stderr.strip()[-300:]
        for ln in failed:
            print(f"   {ln}")
        results.append((name, proc.returncode, summary, time.perf_counter() - t0))
        print(f"   {summary}", flush=True)
    print("\nprofile                  result")
    for name, rc, summary, seconds in results:
        print(f"{name:24s} {'ok  ' if rc == 0 else 'FAIL'} {summary} ({seconds:.0f} s)")
    return 0 if all(rc == 0 for _, rc, _, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

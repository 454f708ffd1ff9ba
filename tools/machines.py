"""Running as another CPU would: the instruction sets torch, MKL and oneDNN may use, capped by env vars.

Floating-point results differ between CPUs because they run different SIMD kernels (and sum in other
orders): the tiny model's warm start and the tokens it samples then differ from machine to machine.
These environment variables make this machine run the kernels of a CPU without AVX-512, or without any
SIMD, so that such a difference shows here (``tests/machines.py`` reruns the sampling tests under them;
``tools/first_hour.py`` measures the README's first hour under them; its ``--collapse`` part shows
the same 300-step warm start ending at very different accuracies under each, docs/first-hour.md).
"""

from __future__ import annotations

#: name -> the environment variables that cap the instruction set ("native": this CPU's own).
INSTRUCTION_SETS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "nosimd": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}

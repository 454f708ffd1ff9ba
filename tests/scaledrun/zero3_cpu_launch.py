"""``scaledrun.train`` under DeepSpeed on CPU processes, for ``test_zero3.py``.

Usage: ``accelerate launch --config_file scaledrun/accelerate/zero3.yaml --num_processes 2
tests/scaledrun/zero3_cpu_launch.py <scaledrun.train arguments>`` with ``DS_ACCELERATOR=cpu``.

Accelerate sets DeepSpeed up only on GPUs: on a machine without one, ``PartialState`` finds no backend
for a launched process and reports one process of rank 0 (while DeepSpeed's own ``init_distributed``
has joined the two in gloo), and the trainer, which asks for ``cpu=True`` when no GPU is visible, would
run plain DDP. DeepSpeed itself runs on CPU (its CPU accelerator communicates over gloo). So this file
changes exactly two choices before it calls the trainer's own ``main``:

- Accelerate's backend choice: gloo (``MULTI_CPU``) where it would find none, after which Accelerate
  initialises DeepSpeed and sets ``DistributedType.DEEPSPEED`` as it does on GPUs;
- the trainer's GPU check (``has_accelerator``), so that it does not ask for ``cpu=True``, which
  would skip DeepSpeed.

Everything else (``accelerator.prepare`` building the ZeRO-3 engine, the trainer's loop, its
``full_params``/``zero3_gathered`` around generation, its checkpoints) is the code a GPU run runs.

With ``ZERO3_COUNT_DIR`` set, each process writes ``<dir>/rank<r>.json``: for every ``HFBackend.generate``
call, the number of all-gather collectives issued during it (the parameters are gathered before the
call, by ``zero3_gathered``; ZeRO-3's hooks, if left on, would release and re-gather them around every
submodule's forward, i.e. at every generated token).
"""

from __future__ import annotations

import json
import os
import sys

from accelerate.state import PartialState
from accelerate.utils import DistributedType

_prepare_backend = PartialState._prepare_backend


def _gloo_when_none(self, cpu=False, sagemaker_dp=False, backend=None):
    found, kind = _prepare_backend(self, cpu, sagemaker_dp, backend)
    if found is None and kind == DistributedType.NO:
        return "gloo", DistributedType.MULTI_CPU
    return found, kind


def _count_generate_gathers(out_dir: str) -> None:
    """Wrap ``HFBackend.generate``: all-gathers issued inside each call, written at exit."""
    import atexit

    from scaledrun.backends import HFBackend

    counts: list[int] = []
    generate = HFBackend.generate
    #: DeepSpeed's communication backend object: every ``deepspeed.comm`` all-gather goes through it
    names = ("all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced")

    def counted(self, *args, **kwargs):
        import deepspeed.comm.comm as ds_comm

        backend, calls = ds_comm.cdb, [0]

        def wrap(real):
            def wrapper(*a, **k):
                calls[0] += 1
                return real(*a, **k)

            return wrapper

        for n in names:
            setattr(backend, n, wrap(getattr(backend, n)))
        try:
            return generate(self, *args, **kwargs)
        finally:
            for n in names:
                delattr(backend, n)  # the instance attribute: the class's method shows through again
            counts.append(calls[0])

    HFBackend.generate = counted

    def write() -> None:
        rank = int(os.environ.get("RANK", "0"))  # the launcher's: the trainer has closed its process group
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(counts, f)

    atexit.register(write)


if __name__ == "__main__":
    PartialState._prepare_backend = _gloo_when_none
    import scaledrun.train as train

    train.has_accelerator = lambda: True
    if os.environ.get("ZERO3_COUNT_DIR"):
        _count_generate_gathers(os.environ["ZERO3_COUNT_DIR"])
    train.main(sys.argv[1:])

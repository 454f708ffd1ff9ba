"""The TRL plug-in in each of several processes (``test_trl_plugin.py``'s two-process test launches it with
``accelerate launch --multi_gpu --num_processes 2``, gloo on CPU): every process trains on its own groups of a
saved batch (TRL's sampler gives process k the k-th block of the generation batch), and the main process saves
every optimizer step's gradients (after DDP's reduction, so the same on every process).

    python -m tests.scaledrun.trl_plugin_worker MODEL_DIR BATCH.pt OUT.pt TMP_DIR FIELDS_JSON ITERATIONS SPG
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.scaledrun.test_trl_plugin import run_trl


def main() -> None:
    model, batch_file, out, tmp, fields, iterations, spg = sys.argv[1:8]
    batch = torch.load(batch_file, weights_only=False)
    grads, _, trainer = run_trl(
        model, Path(tmp), batch, json.loads(fields), iterations=int(iterations), spg=int(spg), processes=2,
        lr=float(sys.argv[8]),
    )  # fmt: skip
    assert trainer.accelerator.num_processes == 2, trainer.accelerator.num_processes
    if trainer.accelerator.is_main_process:
        torch.save(grads, out)
    # every process leaves the process group before the interpreter tears down: left to the teardown, gloo's
    # threads aborted a rank once in ~20 runs on this CPU ("terminate called without an active exception")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()

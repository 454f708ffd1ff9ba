"""Peak extra memory and time of one log-prob pass: the scorer before, the chunked one, TRL's. Not a test.

    .venv/bin/python benchmarks/scoring_memory.py            # B = 2, 4, 8 and a chunk sweep at B = 4
    .venv/bin/python benchmarks/scoring_memory.py --quick    # B = 2 only, 1 timing repeat, no sweep
    .venv/bin/python benchmarks/scoring_memory.py --rows 2 4 --chunks 64 128 --threads 2

The model is a random Qwen3-architecture model with Qwen's vocabulary (V = 151,936), hidden 64, 2 layers,
float32 (``scaledrun.tiny.MODEL_SHAPE``, tied embeddings), wrapped in LoRA (r 8, the trainer's default
targets) as the trainer holds it. The batch: B rows of a 64-token prompt (left-padded by 0-6 tokens) and
a T = 512-token completion, every completion token scored. The tiny backbone makes the LM head and the
log-softmax nearly the whole cost, which is what is compared.

Passes (as the trainer runs them):

- ``old T=0.6``, ``old T=1``: no grad, log-probs and entropy (the old-log-prob pass, at the sampling
  temperature; T = 1 skips the division);
- ``loss``: grad enabled, log-probs at T = 0.6, forward and backward of Σ c·logp (the LoRA gradients).

Scorers:

- ``before``: ``scaledrun.rollout.completion_logprobs`` as it was before the chunked scorer (its body is
  copied below as ``before_scores``: full logits of all L positions, the completion slice, float32, / T,
  log_softmax, gather; probs·log-probs for the entropy);
- ``chunked``: ``scaledrun.scoring.completion_scores`` (``chunk_tokens`` positions of logits at a time);
- ``trl-sel``: TRL's ``selective_log_softmax_and_entropy`` (``selective_log_softmax`` in the loss pass)
  on the model's logits of the T + 1 last positions (``logits_to_keep``), as TRL's trainers score
  without the fused head;
- ``trl-fused``: TRL's ``add_fused_lm_head`` and ``model(..., labels=..., fused_lm_head=True)``, the
  path ``GRPOTrainer`` of TRL 1.16 takes (its chunked log-prob function; on CPU it scores all L − 1
  positions in tiles of 4,096 tokens × 32,768 vocabulary entries).

Measuring
---------
Each (scorer, B, chunk) runs in a fresh Python process (``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, so every
large tensor is its own mapping, returned to the system when freed). In it each pass runs once on one row
as a warm-up; then, after ``gc.collect()``, the peak resident set size is reset (``/proc/self/clear_refs``
"5"), the RSS read (``VmRSS``), the pass run once, and the peak read (``VmHWM``): extra = peak − RSS
before, reported as a multiple of one float32 copy of the completion logits, B·T·V·4 bytes. Time: the
median of ``--repeats`` further runs of the pass. A run the machine's free memory could not hold (its
extra memory extrapolated linearly in B from the smallest B) is skipped and says so. Needs Linux.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

VOCAB = 151_936
PROMPT, COMPLETION = 64, 512
TAU = 0.6
SCORERS = ("before", "chunked", "trl-sel", "trl-fused")
PASSES = (("old T=0.6", TAU, False), ("old T=1", 1.0, False), ("loss", TAU, True))
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _status(field: str) -> int:
    """A /proc/self/status memory field, in bytes."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        return int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) * 1024


# --------------------------------------------------------------------------------------------
# the child process: one (scorer, B, chunk), every pass


def before_scores(model: Any, ids: Any, att: Any, t: int, tau: float, with_entropy: bool) -> dict[str, Any]:
    """``scaledrun.rollout.completion_logprobs`` before ``scaledrun.scoring`` (commit ac5ef8e), its body."""
    import torch

    from scaledrun.scoring import position_ids_from_mask

    out = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False)
    logits = out.logits[:, -t - 1 : -1, :].float()
    if tau != 1.0:
        logits = logits / tau
    logsm = torch.log_softmax(logits, dim=-1)
    res = {"logp": logsm.gather(-1, ids[:, -t:].unsqueeze(-1)).squeeze(-1)}
    if with_entropy:
        with torch.no_grad():
            probs = logsm.detach().exp()
            res["entropy"] = -(probs * logsm.detach()).sum(-1)
    return res


def _scorer(name: str, model: Any, chunk: int):
    """score(ids, att, mask, tau, with_entropy) -> logp (B, T) for the named scorer."""

    from scaledrun.scoring import completion_scores, position_ids_from_mask

    t = COMPLETION
    if name == "before":
        return lambda ids, att, mask, tau, ent: before_scores(model, ids, att, t, tau, ent)["logp"]
    if name == "chunked":

        def chunked(ids, att, mask, tau, ent):
            res = completion_scores(
                model,
                ids,
                att,
                t,
                temperature=tau,
                completion_mask=mask,
                with_entropy=ent,
                chunk_tokens=chunk,
            )
            return res["logp"]

        return chunked
    if name == "trl-sel":
        from trl.trainer.utils import selective_log_softmax, selective_log_softmax_and_entropy

        def trl_sel(ids, att, mask, tau, ent):
            pos = position_ids_from_mask(att)
            logits = model(
                input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False, logits_to_keep=t + 1
            ).logits[:, :-1]
            if ent:
                logp, _ = selective_log_softmax_and_entropy(
                    logits, ids[:, -t:], entropy_requires_grad=False, temperature=tau
                )
                return logp
            return selective_log_softmax(logits, ids[:, -t:], temperature=tau)

        return trl_sel
    if name == "trl-fused":
        from trl.trainer.utils import add_fused_lm_head

        base = model.get_base_model()

        def trl_fused(ids, att, mask, tau, ent):
            # the head's settings are fixed when it is added: add it again for this pass's (τ, outputs)
            add_fused_lm_head(
                base, temperature=tau, outputs=("log_probs", "entropy") if ent else ("log_probs",)
            )
            labels = ids.masked_fill(att == 0, -100)
            labels[:, :-t] = -100
            out = model(
                input_ids=ids,
                attention_mask=att,
                position_ids=position_ids_from_mask(att),
                labels=labels,
                fused_lm_head=True,
            )
            return out.log_probs[:, -t:]

        return trl_fused
    raise ValueError(f"unknown scorer {name!r}; valid: {', '.join(SCORERS)}")


def child(spec: dict[str, Any]) -> None:
    """Build the model and batch, run every pass of one scorer; print one JSON line per pass."""
    import torch
    from peft import LoraConfig, get_peft_model

    from scaledrun.tiny import make_model

    torch.set_num_threads(spec["threads"])
    rows, t = spec["rows"], COMPLETION
    model = get_peft_model(
        make_model(VOCAB, 0, 1, 0), LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS)
    )
    model.train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (rows, PROMPT + t), generator=gen)
    att = torch.ones_like(ids)
    for r in range(rows):
        att[r, : 2 * (r % 4)] = 0  # left padding 0, 2, 4, 6
    ids = ids.masked_fill(att == 0, 0)
    mask = torch.ones(rows, t)
    coef = torch.randn(rows, t, generator=gen)
    score = _scorer(spec["scorer"], model, spec["chunk"])
    for name, tau, grad in PASSES:

        def run(k=rows, tau=tau, grad=grad):
            """The pass on the first k rows."""
            if grad:
                (coef[:k] * score(ids[:k], att[:k], mask[:k], tau, False)).sum().backward()
            else:
                with torch.no_grad():
                    score(ids[:k], att[:k], mask[:k], tau, True)

        def reset():
            model.zero_grad(set_to_none=True)
            gc.collect()

        run(1)  # warm-up (lazy initialisations), on one row
        reset()
        _reset_peak()
        before = _status("VmRSS")
        run()
        extra = _status("VmHWM") - before
        times = []
        for _ in range(spec["repeats"]):
            reset()
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        print(
            json.dumps({"pass": name, "extra_bytes": extra, "seconds": statistics.median(times)}), flush=True
        )


# --------------------------------------------------------------------------------------------
# the parent: one child per (scorer, B, chunk), the tables


def measure(scorer: str, rows: int, chunk: int, threads: int, repeats: int) -> dict[str, dict[str, float]]:
    spec = {"scorer": scorer, "rows": rows, "chunk": chunk, "threads": threads, "repeats": repeats}
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONWARNINGS": "ignore",
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env
    )
    print(
        f"  ({scorer}, B={rows}, chunk {chunk}: {time.perf_counter() - t0:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{scorer} B={rows} chunk={chunk} failed:\n{proc.stderr[-3000:]}")
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            out[rec["pass"]] = rec
    return out


def one_copy(rows: int) -> int:
    """Bytes of one float32 copy of the completion logits, B·T·V·4."""
    return rows * COMPLETION * VOCAB * 4


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="B = 2 only, 1 timing repeat, no chunk sweep")
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8], help="batch sizes B")
    parser.add_argument("--chunk", type=int, default=128, help="chunk_tokens of the main table")
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256, 512], help="the sweep's")
    parser.add_argument("--sweep-rows", type=int, default=4, help="B of the chunk sweep")
    parser.add_argument("--scorers", nargs="+", default=list(SCORERS), choices=SCORERS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per pass (median)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    if args.quick:
        args.rows, args.repeats, args.chunks = [2], 1, []
    import torch

    print(
        f"V = {VOCAB}, prompt {PROMPT} + completion T = {COMPLETION} tokens, float32, LoRA, torch {torch.__version__}, "
        f"{args.threads} thread(s); one fp32 copy of the logits B·T·V·4 = "
        + ", ".join(f"{one_copy(b) / 2**20:.0f} MiB (B={b})" for b in args.rows)
    )
    print("peak extra memory of one pass as a multiple of that copy, and seconds per pass (median)\n")
    results: dict[tuple[str, int], dict[str, dict[str, float]] | str] = {}
    for scorer in args.scorers:
        per_row: dict[int, float] = {}  # bytes of the most demanding pass, per B
        for rows in sorted(args.rows):
            if per_row:
                b0 = min(per_row)
                need = per_row[b0] * rows / b0
                if need > 0.8 * _mem_available():
                    results[scorer, rows] = f"skipped: needs ~{need / 2**30:.1f} GiB"
                    continue
            res = measure(scorer, rows, args.chunk, args.threads, args.repeats)
            results[scorer, rows] = res
            per_row[rows] = max(r["extra_bytes"] for r in res.values())
    names = {s: f"{s}({args.chunk})" if s == "chunked" else s for s in args.scorers}
    head = f"{'pass':<10} {'B':>2}  " + "  ".join(f"{names[s]:>17}" for s in args.scorers)
    print(head)
    print(f"{'':<10} {'':>2}  " + "  ".join(f"{'× logits':>9} {'s':>7}" for _ in args.scorers))
    for name, _, _ in PASSES:
        for rows in sorted(args.rows):
            cells = []
            for s in args.scorers:
                res = results[s, rows]
                if isinstance(res, str):
                    cells.append(f"{'skipped':>17}")
                else:
                    r = res[name]
                    cells.append(f"{r['extra_bytes'] / one_copy(rows):>9.2f} {r['seconds']:>7.3f}")
            print(f"{name:<10} {rows:>2}  " + "  ".join(cells))
    for (s, rows), res in results.items():
        if isinstance(res, str):
            print(f"{s} B={rows}: {res}")
    if args.chunks:
        b = args.sweep_rows
        print(
            f"\nchunked scorer, B = {b}: chunk_tokens sweep (× one copy = {one_copy(b) / 2**20:.0f} MiB; MiB; s)"
        )
        print(f"{'chunk':>6}  " + "  ".join(f"{name:>24}" for name, _, _ in PASSES))
        for chunk in args.chunks:
            res = measure("chunked", b, chunk, args.threads, args.repeats)
            cells = [
                f"{res[n]['extra_bytes'] / one_copy(b):>6.3f} {res[n]['extra_bytes'] / 2**20:>7.0f} "
                f"{res[n]['seconds']:>9.3f}"
                for n, _, _ in PASSES
            ]
            print(f"{chunk:>6}  " + "  ".join(cells))


if __name__ == "__main__":
    main()

"""One RL step at a real model's shape, part by part: ``scaledrun.train`` per configuration, TRL beside it.

    .venv/bin/python benchmarks/gpu_step.py --shape tiny --steps 2            # CPU smoke, ~30 s
    python benchmarks/gpu_step.py --shape qwen3-8b --steps 3 --max-new-tokens 128 \\
        --configs eager merged static-compiled paged                            # one H200, see docs/trainer.md

The model is random-initialised at a named real shape (``--shape``: Qwen3-0.6B, 4B or 8B, written out as
``transformers.Qwen3Config`` fields from the published shapes in ``scaledrun.memory.SHAPES``, nothing
downloads; its full 151,936-row vocabulary) on the tiny tokenizer (``scaledrun.tiny``), stored in bf16 on
a GPU (float32 on CPU) in a temporary folder; ``tiny`` is the project's tiny Qwen3 itself. A random model
almost never samples its end token out of 151,936, so its completions run to ``--max-new-tokens`` and are
kept (``truncation: keep``); the reward is a coin flip (``coin_flip``), so that every group has a signal.

Each configuration (``CONFIGS``: a name and its ``RunConfig`` overrides; add one in one line) runs
``--steps`` RL steps of the trainer's own loop (``scaledrun.train.train``) from the default config with
LoRA r ``--lora-rank``, gradient checkpointing, ``--group-size`` × ``--prompts-per-step``, one
process, no evaluation; then TRL's ``GRPOTrainer`` runs at the same settings
(``benchmarks/trainer_vs_trl.py``'s ``trl_trainer``: the same model folder, LoRA, prompts in the same
order, the same reward; ``--no-trl`` leaves it out). A configuration its ``RunConfig`` rejects (a field
this checkout lacks, or one that does not run on this device) is skipped with the config's own error.

Per configuration, the mean over the timed steps (the first step is a warm-up and left out):

- ``step s``: one RL step (ours: the log row's ``time/step_s``; TRL: ``on_step_begin`` to ``on_step_end``);
- ``gen s``: the rollout phase (ours: ``time/generate_s``, sampling and the old log-prob pass; TRL: its
  ``_generate_and_score_completions``: sampling, rewards, advantages);
- ``upd s``: the update (ours: ``time/update_s``; TRL: from the end of the rollout phase to the end of
  the step: loss, backward, optimizer step, its metrics), so step ≥ gen + upd;
- ``tokens``: completion tokens generated per step (through EOS); ``tok/s`` = tokens / gen s;
- ``dec steps`` and ``dec ms``: the positions the model's ``generate`` produced per step (summed over its
  calls: one forward each, the prompt's prefill included; ``generate_batch``, the paged backend: the
  longest completion of the call, its batch steps when every request fits one batch) and the seconds
  inside those calls per position (n/a for a backend that calls neither);
- ``upd tok``: tokens (padding left out) through the model with gradients on, i.e. the update passes;
- ``MFU``: the update's model FLOPs over ``upd s`` × the peak: per update token 2·N (forward) + 2·N
  (backward to the activations) + 2·N_trainable (weight gradients), N the weights of every
  ``nn.Linear`` (LoRA's A and B and the LM head included; the head counted at every token although it
  runs on completion positions only; embeddings, norms and attention's own ``seq²`` FLOPs left out; the
  recomputation of gradient checkpointing not counted, as MFU does not): 6·N for full fine-tuning, ≈ 4·N
  for LoRA. The peak is ``--peak-tflops``, else that of a known GPU (``PEAK_TFLOPS``, dense bf16), else
  n/a;
- ``peak GiB``: ``torch.cuda.max_memory_allocated`` over the run, less what was allocated when it started
  (n/a on CPU).

Not a test (tests/scaledrun/test_gpu_step_bench.py runs the CPU smoke and checks the table's arithmetic).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.trainer_vs_trl import DEFAULT_CONFIG, step_clock, trl_trainer
from scaledrun.config import RunConfig, load_config
from scaledrun.distributed import LaunchError
from scaledrun.memory import SHAPES, Shape
from scaledrun.rewards import REWARDS, register_reward
from scaledrun.runlog import RunLogger
from scaledrun.tiny import build_tiny
from scaledrun.train import train

#: ``--shape`` -> the published shape in ``scaledrun.memory.SHAPES`` (None: the tiny model itself).
MODEL_SHAPES: dict[str, str | None] = {
    "tiny": None,
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
}
#: The configurations: a name and its ``RunConfig`` overrides (one line each).
CONFIGS: dict[str, list[str]] = {
    "eager": [],
    "merged": ["--rollout_merge", "true"],
    "static-compiled": ["--generation_cache", "static", "--compile_decode", "true"],
    "paged": ["--rollout_backend", "paged"],
    "padding-free": ["--padding_free", "true"],
}
#: Dense bf16 TFLOPS of the GPUs the MFU column knows (``--peak-tflops`` overrides; else n/a).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}

_coin = random.Random(0)


def coin_flip(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1 or 0 with probability 1/2 each, whatever the completion (the benchmark's reward, registered as
    ``coin_flip`` by ``main``: importing this module registers nothing)."""
    return [float(_coin.random() < 0.5) for _ in completions]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# the model


def qwen3_config_kwargs(shape: Shape) -> dict[str, Any]:
    """``transformers.Qwen3Config`` fields of a published Qwen3 shape."""
    if not shape.qk_norm or shape.qkv_bias:
        raise ValueError("gpu_step builds Qwen3 shapes only (q/k norms, no q/k/v biases)")
    return {
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied,
        "max_position_embeddings": 40960,
        "rope_theta": 1_000_000.0,
    }


def build_model(shape: str, out: Path, dtype: torch.dtype) -> Path:
    """The model folder of ``shape``: the tiny model (``build_tiny``, no warm start), or a random-initialised
    Qwen3 of the published shape, built on the GPU when there is one, on the tiny tokenizer."""
    tiny = build_tiny(out / "tiny", "arithmetic", seed=0, warm_start_steps=0)
    if MODEL_SHAPES[shape] is None:
        return tiny
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    config = Qwen3Config(**qwen3_config_kwargs(SHAPES[MODEL_SHAPES[shape]]), **ids)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    for k, v in ids.items():
        setattr(model.generation_config, k, v)
    folder = out / shape
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return folder


def linear_params(model_dir: Path, cfg: RunConfig) -> tuple[int, int]:
    """(N, N_trainable): the weights (and biases) of every ``nn.Linear`` of the model, and of those
    trained (LoRA: r·(in + out) per targeted linear; full fine-tuning: all), from the config alone."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    n = n_lora = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            n += sum(p.numel() for p in m.parameters())
            if name.split(".")[-1] in cfg.lora_target_modules:
                n_lora += cfg.lora_rank * (m.in_features + m.out_features)
    if cfg.full_finetune:
        return n, n
    return n + n_lora, n_lora


# ------------------------------------------------------------------------------------------------
# the instruments: seconds inside ``generate``, positions generated, tokens through gradient passes


@dataclass
class StepMeter:
    step_s: float = 0.0
    gen_s: float = 0.0
    upd_s: float = 0.0
    tokens: float = 0.0
    generate_s: float = 0.0
    decode_steps: int = 0
    update_tokens: int = 0
    generate_calls: int = 0


@dataclass
class Meter:
    """Per-step counts; ``mark_step`` closes the current step."""

    steps: list[StepMeter] = field(default_factory=lambda: [StepMeter()])

    @property
    def now(self) -> StepMeter:
        return self.steps[-1]

    def mark_step(self) -> None:
        self.steps.append(StepMeter())

    def done(self) -> list[StepMeter]:
        return self.steps[:-1] if self.steps[-1] == StepMeter() else self.steps


def _patched(cls: type, name: str, wrap: Any) -> contextlib.AbstractContextManager:
    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        own = name in cls.__dict__
        orig = cls.__dict__.get(name)
        setattr(cls, name, wrap(getattr(cls, name)))
        try:
            yield
        finally:
            if own:
                setattr(cls, name, orig)
            else:
                delattr(cls, name)

    return patch()


@contextlib.contextmanager
def instruments(model_dir: Path, meter: Meter, *, log_marks_steps: bool) -> Iterator[None]:
    """Count, on the model's own classes (any instance, wrapped by PEFT or not): each ``generate`` call's
    seconds and new positions, and the tokens of every forward of the decoder body with gradients on;
    with ``log_marks_steps``, each ``RunLogger.log`` (the trainer's per-step log row) closes a step."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

    config_cls = type(AutoConfig.from_pretrained(model_dir))
    lm_cls, body_cls = MODEL_FOR_CAUSAL_LM_MAPPING[config_cls], MODEL_MAPPING[config_cls]

    def timed(new_positions: Any) -> Any:
        """A wrapper of a generation method: its seconds, one call, and ``new_positions(args, kwargs, out)``
        decode steps added to the current step's meter."""

        def wrap(orig: Any) -> Any:
            @functools.wraps(orig)
            def call(model: Any, *args: Any, **kwargs: Any) -> Any:
                sync()
                t0 = time.perf_counter()
                out = orig(model, *args, **kwargs)
                sync()
                meter.now.generate_s += time.perf_counter() - t0
                meter.now.decode_steps += new_positions(args, kwargs, out)
                meter.now.generate_calls += 1
                return out

            return call

        return wrap

    def generate_positions(args: Any, kwargs: Any, out: Any) -> int:
        ids = kwargs.get("input_ids", args[0] if args else None)
        seqs = out if isinstance(out, torch.Tensor) else out.sequences
        return seqs.shape[1] - ids.shape[1]

    # the paged backend: the longest request's new tokens (a lower bound on its decode steps)
    wrap_generate = timed(generate_positions)
    wrap_generate_batch = timed(lambda args, kwargs, out: max(len(r.generated_tokens) for r in out.values()))

    def wrap_body(orig: Any) -> Any:
        @functools.wraps(orig)
        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                mask = kwargs.get("attention_mask")
                ids = kwargs.get("input_ids", args[0] if args else None)
                if isinstance(mask, torch.Tensor) and mask.dim() == 2:
                    meter.now.update_tokens += int(mask.sum())
                elif ids is not None:
                    meter.now.update_tokens += ids.numel()
                else:
                    meter.now.update_tokens += kwargs["inputs_embeds"].shape[:-1].numel()
            return orig(module, *args, **kwargs)

        return forward

    def wrap_log(orig: Any) -> Any:
        @functools.wraps(orig)
        def log(logger: Any, step: int, row: dict[str, float]) -> Any:
            s = meter.now
            s.step_s, s.gen_s, s.upd_s = row["time/step_s"], row["time/generate_s"], row["time/update_s"]
            s.tokens = row["time/tokens_per_s"] * row["time/step_s"]  # the step's tokens_generated
            meter.mark_step()
            return orig(logger, step, row)

        return log

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(lm_cls, "generate", wrap_generate))
        if hasattr(lm_cls, "generate_batch"):  # transformers' continuous batching (the paged backend)
            stack.enter_context(_patched(lm_cls, "generate_batch", wrap_generate_batch))
        stack.enter_context(_patched(body_cls, "forward", wrap_body))
        if log_marks_steps:
            stack.enter_context(_patched(RunLogger, "log", wrap_log))
        yield


# ------------------------------------------------------------------------------------------------
# the runs


def run_config(args: argparse.Namespace, model_dir: Path, name: str | None, out_dir: Path) -> RunConfig:
    """The default config at the benchmark's settings (TRL's), then configuration ``name``'s overrides."""
    overrides = [
        "--model", str(model_dir), "--steps", str(args.steps), "--output_dir", str(out_dir),
        "--eval_every", "0", "--save_every", "0", "--group_size", str(args.group_size),
        "--prompts_per_step", str(args.prompts_per_step), "--max_new_tokens", str(args.max_new_tokens),
        "--inner_epochs", "1", "--num_minibatches", "1", "--beta", "0.0", "--dtype", args.dtype,
        "--truncation", "keep", "--reward", "coin_flip", "--lora_rank", str(args.lora_rank),
        "--lora_alpha", str(2 * args.lora_rank), "--gradient_checkpointing", "true",
        # all of a step's rows in one call (compile_decode needs a fixed call size)
        "--generation_batch_size", str(args.group_size * args.prompts_per_step),
    ]  # fmt: skip
    return load_config(str(DEFAULT_CONFIG), overrides + (CONFIGS[name] if name else []))


def run_ours(cfg: RunConfig) -> list[StepMeter]:
    meter = Meter()
    with instruments(Path(cfg.model), meter, log_marks_steps=True):
        train(cfg)
    return meter.done()


def run_trl(cfg: RunConfig, out_dir: Path) -> list[StepMeter]:
    meter = Meter()
    clock = step_clock(sync)
    marks: dict[str, float] = {}

    def on_step_end(*a: Any, **kw: Any) -> None:
        type(clock).on_step_end(clock, *a, **kw)
        s = meter.now
        s.step_s = clock.secs[-1]
        s.upd_s = clock.t1 - marks["gen_end"]  # so step ≥ gen + upd exactly
        meter.mark_step()

    clock.on_step_end = on_step_end
    trainer, tokens = trl_trainer(cfg, out_dir, reward=coin_flip, callbacks=[clock])
    rollout = trainer._generate_and_score_completions  # TRL's rollout phase

    def timed_rollout(*a: Any, **kw: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = rollout(*a, **kw)
        sync()
        marks["gen_end"] = time.perf_counter()
        meter.now.gen_s += marks["gen_end"] - t0
        return out

    trainer._generate_and_score_completions = timed_rollout
    with instruments(Path(cfg.model), meter, log_marks_steps=False):
        trainer.train()
    steps = meter.done()
    if len(tokens) != len(steps):
        raise RuntimeError(f"TRL generated {len(tokens)} times in {len(steps)} steps; expected once per step")
    for s, t in zip(steps, tokens, strict=True):
        s.tokens = t
    return steps


@dataclass
class Result:
    config: str
    trainer: str
    steps: list[StepMeter] = field(default_factory=list)
    peak_gib: float | None = None
    skipped: str | None = None  # why it did not run
    failed: str | None = None


def measured(config: str, trainer: str, run: Any) -> Result:
    """Run ``run()`` (the per-step meters) with the GPU's peak memory reset first; an error is kept."""
    res = Result(config, trainer)
    gc.collect()
    base = 0
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()  # anything an earlier run left allocated
    try:
        res.steps = run()
    except Exception as err:
        if isinstance(err, (ValueError, LaunchError)) and str(err).startswith("config field"):
            res.skipped = str(err)  # the config's own refusal, raised where the device is known
        else:
            traceback.print_exc()
            res.failed = f"{type(err).__name__}: {err}".splitlines()[0]
    print(
        f"{config} ({trainer}): {f'skipped: {res.skipped}' if res.skipped else res.failed or 'done'}",
        flush=True,
    )
    if torch.cuda.is_available():
        res.peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
    return res


def peak_tflops(given: float | None) -> float | None:
    if given is not None or not torch.cuda.is_available():
        return given
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


#: The table's columns after config and trainer, and their widths (each field has a space before it, so a
#: wide number never runs into its neighbour).
COLUMNS = (("step s", 9), ("gen s", 9), ("upd s", 9), ("tokens", 9), ("tok/s", 10), ("dec steps", 9),
           ("dec ms", 9), ("upd tok", 10), ("MFU %", 8), ("peak GiB", 8))  # fmt: skip


def table(results: list[Result], flops_per_token: float, peak: float | None) -> list[str]:
    def line(config: str, trainer: str, fields: Sequence[str]) -> str:
        return f"{config:<16}{trainer:<7}" + "".join(
            f" {f:>{w}}" for f, (_, w) in zip(fields, COLUMNS, strict=True)
        )

    head = line("config", "trainer", [c for c, _ in COLUMNS])
    lines = [head, "-" * len(head)]
    for r in results:
        if r.skipped or r.failed:
            lines.append(
                f"{r.config:<16}{r.trainer:<7}  {'skipped' if r.skipped else 'FAILED'}: {r.skipped or r.failed}"
            )
            continue
        timed = r.steps[1:]

        def mean(key: str, timed: list[StepMeter] = timed) -> float:
            return sum(getattr(s, key) for s in timed) / len(timed)

        step_s, gen_s, upd_s, tokens = mean("step_s"), mean("gen_s"), mean("upd_s"), mean("tokens")
        dec_steps, upd_tok = mean("decode_steps"), mean("update_tokens")
        dec_ms = f"{1e3 * mean('generate_s') / dec_steps:.3f}" if dec_steps else "n/a"
        mfu = "n/a" if peak is None else f"{100 * upd_tok * flops_per_token / (upd_s * peak * 1e12):.3f}"
        mem = "n/a" if r.peak_gib is None else f"{r.peak_gib:.2f}"
        fields = [f"{step_s:.4f}", f"{gen_s:.4f}", f"{upd_s:.4f}", f"{tokens:.1f}", f"{tokens / gen_s:.1f}"]
        fields += [f"{dec_steps:.1f}", dec_ms, f"{upd_tok:.1f}", mfu, mem]
        lines.append(line(r.config, r.trainer, fields))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=list(MODEL_SHAPES), default="tiny")
    ap.add_argument("--model", type=Path, default=None, help="a model folder built before (skips the build)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help=f"of: {', '.join(CONFIGS)}")
    ap.add_argument("--steps", type=int, default=3, help="RL steps per run (the first is a warm-up)")
    ap.add_argument("--group-size", dest="group_size", type=int, default=8)
    ap.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=4)
    ap.add_argument(
        "--max-new-tokens", dest="max_new_tokens", type=int, default=None, help="default 512; 32 on tiny"
    )
    ap.add_argument("--lora-rank", dest="lora_rank", type=int, default=16)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default bf16 on a GPU")
    ap.add_argument("--peak-tflops", dest="peak_tflops", type=float, default=None, help="for the MFU column")
    ap.add_argument("--no-trl", dest="trl", action="store_false", help="leave TRL's GRPOTrainer out")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be ≥ 2 (the first step of each run is a warm-up)")
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {', '.join(unknown)}; valid: {', '.join(CONFIGS)}")
    if args.max_new_tokens is None:
        args.max_new_tokens = 32 if args.shape == "tiny" else 512
    if args.dtype is None:
        args.dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    if "coin_flip" not in REWARDS:
        register_reward("coin_flip")(coin_flip)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        model_dir = args.model or build_model(args.shape, tmp_path, getattr(torch, args.dtype))
        print(f"model {model_dir} ({args.shape}) ready in {time.perf_counter() - t0:.0f} s", flush=True)
        cfg0 = run_config(args, model_dir, None, tmp_path / "trl")
        n, n_trainable = linear_params(model_dir, cfg0)
        for name in args.configs:
            try:
                cfg = run_config(args, model_dir, name, tmp_path / f"ours_{name}")
            except ValueError as err:  # the config's own error: a field this checkout or device lacks
                results.append(Result(name, "ours", skipped=str(err)))
                print(f"{name} (ours): skipped: {err}", flush=True)
                continue
            results.append(measured(name, "ours", lambda cfg=cfg: run_ours(cfg)))
        if args.trl:
            results.append(measured("eager", "TRL", lambda: run_trl(cfg0, Path(cfg0.output_dir))))

    peak = peak_tflops(args.peak_tflops)
    flops = 4 * n + 2 * n_trainable
    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({torch.get_num_threads()} threads)"
    )
    print()
    print(
        f"shape {args.shape}, {args.dtype}, LoRA r{args.lora_rank}, gradient checkpointing, G={args.group_size} × "
        f"{args.prompts_per_step} prompts, max_new_tokens={args.max_new_tokens}, truncation keep, coin-flip reward, "
        f"{args.steps} steps/run (first excluded), {device}"
    )
    print(
        f"update FLOPs per token = 4·N + 2·N_trainable = {flops} (N = {n}, N_trainable = {n_trainable}); "
        f"peak = {'n/a' if peak is None else f'{peak} TFLOPS'}"
    )
    print("\n".join(table(results, flops, peak)))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

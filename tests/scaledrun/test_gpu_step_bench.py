"""benchmarks/gpu_step.py's CPU smoke: ``--steps 2`` on the tiny model, ours per configuration and TRL's
GRPOTrainer, run as the script runs (a subprocess); the printed table is checked against its own
arithmetic and against counts made here from the model's config and the step's prompts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaledrun.config import load_config
from scaledrun.data import load_tasks, step_prompts
from scaledrun.tasks import format_prompt
from scaledrun.tiny import build_tiny

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_step.py"
G, P, NEW, PEAK = 4, 2, 12, 0.01  # group size, prompts per step, new tokens, --peak-tflops
LORA_RANK = 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COLUMNS = ("step", "gen", "upd", "tokens", "tok_s", "dec_steps", "dec_ms", "upd_tok", "mfu", "peak")

pytestmark = pytest.mark.slow


def run_script(model: Path, *extra: str, code: str | None = None) -> subprocess.CompletedProcess:
    args = ["--model", str(model), "--steps", "2", "--group-size", str(G), "--prompts-per-step", str(P)]
    args += ["--max-new-tokens", str(NEW), "--peak-tflops", str(PEAK), *extra]
    cmd = [sys.executable, str(SCRIPT), *args] if code is None else [sys.executable, "-c", code, *args]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def table_rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("config ") and "step s" in line)
    return {tuple(line.split()[:2]): line.split()[2:] for line in lines[start + 2 :] if line.strip()}


def linear_counts(model: Path) -> tuple[int, int]:
    """(N, N_trainable) in closed form from config.json: the 7 projections of each layer and the LM head
    (no biases in Qwen3), and LoRA's r·(in + out) per projection."""
    c = json.loads((model / "config.json").read_text())
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    shapes |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    base = c["num_hidden_layers"] * sum(a * b for a, b in shapes.values()) + c["vocab_size"] * h
    lora = c["num_hidden_layers"] * sum(LORA_RANK * (a + b) for a, b in shapes.values())
    assert set(shapes) == set(TARGETS)
    return base + lora, lora


def step_prompt_tokens(model: Path, step: int) -> int:
    """Prompt tokens of one RL step's rows: its P prompts, chat-formatted as both trainers feed them, × G."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    cfg = load_config(None, ["--model", str(model), "--output_dir", "unused", "--prompts_per_step", str(P)])
    tasks = load_tasks(cfg, "train", cfg.num_train)
    texts = [format_prompt(tok, t.prompt) for _, t in step_prompts(tasks, step, P, 0, 1, cfg.seed)]
    return G * sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


def test_cpu_smoke_table_is_consistent(tiny_model):
    """On the warm-started tiny model, whose completions end at EOS: rows of different lengths, padding."""
    model = tiny_model
    out = run_script(model)
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_step import CONFIGS

    n, n_trainable = linear_counts(model)
    flops = 4 * n + 2 * n_trainable
    assert f"= {flops} (N = {n}, N_trainable = {n_trainable})" in out.stdout
    rows = table_rows(out.stdout)
    # every configuration has a row (measured, or skipped with its config's error), and TRL one
    assert set(rows) == {(c, "ours") for c in CONFIGS} | {("eager", "TRL")}
    measured = {k: dict(zip(COLUMNS, v, strict=True)) for k, v in rows.items() if v[0] != "skipped:"}
    assert ("eager", "ours") in measured and ("eager", "TRL") in measured
    prompt_tokens = step_prompt_tokens(model, 2)  # --steps 2: step 1 is the warm-up, step 2 is timed
    for key, r in measured.items():
        step, gen, upd, tokens, tok_s, dec_steps, dec_ms, upd_tok, mfu = (float(r[c]) for c in COLUMNS[:-1])
        half = 5e-5  # half a unit of the 4-decimal seconds
        assert step >= gen + upd - 3 * half, key
        # tok/s = tokens / gen s, within the rounding of the three printed numbers
        assert abs(tok_s - tokens / gen) <= 0.05 + 0.05 / gen + tokens * half / (gen - half) ** 2, key
        # the seconds inside generate are part of the rollout phase
        assert dec_ms * dec_steps / 1e3 <= gen + half + 5e-4 * dec_steps / 1e3, key
        # one generate call for the step's P·G rows: at most NEW positions; each row 1..positions tokens
        assert 1 <= dec_steps <= NEW and P * G <= tokens <= P * G * dec_steps, key
        # truncation keep, one inner epoch: every prompt and completion token passes once with gradients
        assert upd_tok == prompt_tokens + tokens, key
        expected_mfu = 100 * upd_tok * flops / (upd * PEAK * 1e12)
        assert mfu == pytest.approx(expected_mfu, rel=2 * half / upd, abs=5e-4), key
        assert r["peak"] == "n/a", key  # CPU


def test_a_configuration_the_config_rejects_is_skipped_with_its_error(tmp_path):
    model = build_tiny(tmp_path / "model", "arithmetic", seed=0, warm_start_steps=0)
    bad = ["--group_size", "1"]  # the config's own check: a group of one has no group-relative advantage
    code = (
        "import sys; sys.path.insert(0, '.'); import benchmarks.gpu_step as g; "
        f"g.CONFIGS = {{'bad': {bad!r}}}; raise SystemExit(g.main(sys.argv[1:]))"
    )
    out = run_script(model, "--no-trl", code=code)
    with pytest.raises(ValueError) as err:
        load_config(None, ["--model", str(model), "--output_dir", "x", *bad])
    assert f"bad (ours): skipped: {err.value}" in out.stdout
    assert table_rows(out.stdout)[("bad", "ours")][0] == "skipped:"

"""The faster generation paths of ``scaledrun.backends`` sample what the plain one samples: the LoRA
adapter merged for the call (and the base restored bit-exactly, also through the real trainer), the
static KV cache (rows padded to the batch size), transformers' continuous batching (the ``paged``
backend); and the settings that cannot work are refused by name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import scaledrun.train as tr
from scaledrun.backends import HFBackend, PagedBackend, Sampling, make_backend, merged_adapter, stop_token_ids
from scaledrun.config import RunConfig
from scaledrun.tasks import format_prompt

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL
from .conftest import LENGTH_REWARD

pytestmark = pytest.mark.sampling

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROMPTS = ["What is 12 + 34?", "What is 5 + 61?", "What is 70 + 8?", "What is 9 + 9?", "What is 41 + 27?"]
G = 2
NEW = 10


@pytest.fixture(scope="module")
def lora(tiny_model):
    """(PEFT model with a large random adapter, tokenizer, prompt ids, mask, stop ids) in float32."""
    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(SEED)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft = get_peft_model(model, config).eval()
    enc = tok(
        [format_prompt(tok, p) for p in PROMPTS], return_tensors="pt", padding=True, add_special_tokens=False
    )
    return peft, tok, enc["input_ids"], enc["attention_mask"], tuple(stop_token_ids(peft, tok))


def _sampling(tok, stop, do_sample=False):
    return Sampling(max_new_tokens=NEW, do_sample=do_sample, stop_ids=stop, pad_id=tok.pad_token_id)


def _base_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_merged_greedy_tokens_equal_unmerged_and_the_base_comes_back_bit_exact(lora):
    model, tok, ids, am, stop = lora
    sampling = _sampling(tok, stop)
    before = _base_weights(model)
    plain = HFBackend(model).generate(ids, am, num_generations=G, sampling=sampling)
    merged = HFBackend(model, merge=True).generate(ids, am, num_generations=G, sampling=sampling)
    assert torch.equal(merged, plain)
    after = _base_weights(model)
    assert all(torch.equal(after[n], before[n]) for n in before)
    # the adapter is in both paths: without it, greedy decoding writes other tokens
    with model.disable_adapter():
        base = HFBackend(model).generate(ids, am, num_generations=G, sampling=sampling)
    assert not torch.equal(base, plain)


def test_merge_changes_the_weights_inside_by_the_adapters_delta_and_restores_them(lora):
    """Inside ``merged_adapter`` a merged layer's weight is base + scale·B·A (computed here by hand), and
    no LoRA layer is marked merged after it."""
    model = lora[0]
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    w0 = layer.base_layer.weight.detach().clone()
    delta = layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    with merged_adapter(model):
        assert torch.allclose(
            layer.base_layer.weight, w0 + delta, rtol=0, atol=1e-6 * float(delta.abs().max())
        )
        assert not torch.equal(layer.base_layer.weight, w0)
    assert torch.equal(layer.base_layer.weight, w0)
    assert not layer.merged


def test_static_cache_gives_the_dynamic_caches_greedy_tokens_with_a_padded_last_chunk(lora):
    """10 rows in chunks of 4: the last chunk is padded with 2 dummy rows (dropped)."""
    model, tok, ids, am, stop = lora
    sampling = _sampling(tok, stop)
    want = HFBackend(model, 4).generate(ids, am, num_generations=G, sampling=sampling)
    got = HFBackend(model, 4, cache="static").generate(ids, am, num_generations=G, sampling=sampling)
    assert got.shape[0] == len(PROMPTS) * G
    assert torch.equal(got, want)
    # the static cache ran, sized prompt + new tokens rounded up to 64
    assert model.base_model.model._previous_max_cache_length == -(-(ids.shape[1] + NEW) // 64) * 64
    merged = HFBackend(model, 4, cache="static", merge=True).generate(
        ids, am, num_generations=G, sampling=sampling
    )
    assert torch.equal(merged, want)


def test_static_cache_samples_the_dynamic_caches_seeded_tokens_in_float64(lora):
    """Same seed, same rows per call: the same draws. In float64 the two caches' logits differ by far less
    than any sampling boundary a uniform draw could fall next to, on any CPU."""
    model, tok, ids, am, stop = lora
    model64 = get_peft_model(
        AutoModelForCausalLM.from_pretrained(
            model.peft_config["default"].base_model_name_or_path, dtype=torch.float64
        ),
        model.peft_config["default"],
    ).eval()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    sampling = _sampling(tok, stop, do_sample=True)
    out = []
    for cache in ("dynamic", "static"):
        torch.manual_seed(SEED)
        out.append(HFBackend(model64, cache=cache).generate(ids, am, num_generations=G, sampling=sampling))
    assert torch.equal(out[0], out[1])
    assert len({tuple(r.tolist()) for r in out[0]}) > 1  # sampled: not one row repeated


def test_paged_backend_gives_hf_greedy_tokens_with_the_adapter(lora):
    model, tok, ids, am, stop = lora
    sampling = _sampling(tok, stop)
    want = HFBackend(model).generate(ids, am, num_generations=G, sampling=sampling)
    got = PagedBackend(model, 3).generate(ids, am, num_generations=G, sampling=sampling)
    assert torch.equal(got, want)
    merged = make_backend("paged", model, merge=True).generate(ids, am, num_generations=G, sampling=sampling)
    assert torch.equal(merged, want)
    assert model.base_model.model.config._attn_implementation == "sdpa"  # the trainer's, restored


def test_paged_backend_sampling_is_reproducible_from_the_torch_seed(lora):
    model, tok, ids, am, stop = lora
    sampling = _sampling(tok, stop, do_sample=True)
    runs, after = [], []
    for _ in range(2):
        torch.manual_seed(SEED)
        runs.append(PagedBackend(model).generate(ids, am, num_generations=G, sampling=sampling))
        after.append(torch.rand(4))
    assert torch.equal(runs[0], runs[1])
    # the caller's generator is where one draw (the sampler's seed) left it, not reseeded by transformers
    torch.manual_seed(SEED)
    torch.randint(2**31 - 1, ())
    assert torch.equal(after[0], torch.rand(4))
    assert runs[0].shape[0] == len(PROMPTS) * G


def test_impossible_settings_are_refused_by_name(tiny_model, lora):
    with pytest.raises(ValueError, match=r"rollout_merge.*full_finetune"):
        RunConfig(model=str(tiny_model), full_finetune=True, rollout_merge=True)
    with pytest.raises(ValueError, match=r"compile_decode.*generation_cache static"):
        RunConfig(model=str(tiny_model), compile_decode=True)
    with pytest.raises(ValueError, match=r"generation_cache.*paged"):
        RunConfig(model=str(tiny_model), rollout_backend="paged", generation_cache="static")
    with pytest.raises(ValueError, match=r"generation_cache.*valid: dynamic, static"):
        RunConfig(model=str(tiny_model), generation_cache="paged")
    # on CPU transformers never compiles the decode step: refused rather than silently eager
    with pytest.raises(ValueError, match=r"compile_decode.*on cpu.*CUDA"):
        make_backend("hf", lora[0], 4, cache="static", compile_decode=True)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match=r"rollout_merge.*no LoRA adapter"):
        make_backend("hf", plain, merge=True)


def test_training_with_merged_rollouts_leaves_every_base_weight_bit_identical(tiny_model, tmp_path):
    """4 steps of the real trainer at lr 0.05 (a large adapter) with merged, static-cache rollouts, a KL
    term (reference = adapter disabled) and an evaluation: every base weight equals the saved model's.
    Truncated completions are kept, so every step updates whatever the adapter does to the lengths."""
    cfg = RunConfig(
        model=str(tiny_model), output_dir=str(tmp_path / "run"), steps=4, group_size=4, prompts_per_step=2,
        max_new_tokens=8, eval_every=4, num_eval=4, eval_k=2, save_every=0, warmup_ratio=0.0, num_train=50,
        reward=LENGTH_REWARD, lr=0.05, seed=SEED, beta=0.05, rollout_merge=True, generation_cache="static",
        generation_batch_size=3, truncation="keep",
    )  # fmt: skip
    result = tr.train(cfg)
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters())
    delta = 0.0
    for name, p in result.model.named_parameters():
        if "lora_B" in name:
            delta = max(delta, float(p.detach().abs().max()))
        elif "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p.detach(), base[key].detach()), f"base weight {key} changed"
    assert delta > 1e-2  # the adapter moved: merging it changed the weights during each rollout
    assert [r["opt_steps"] for r in result.rows] == [1.0] * 4


@pytest.mark.exactness
def test_merge_inside_fsdp2_full_params_restores_the_sharded_base(tiny_model, tmp_path):
    """2 gloo processes, the tiny PEFT Qwen3 sharded by FSDP2 (``fsdp_merge_worker.py``): merged greedy
    tokens inside ``full_params`` = unmerged ones in float64; the merge changes the gathered weights by
    scale·B·A and is undone bit-exactly inside the gather; every base parameter, gathered in full, is
    bit-identical after the merged calls."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
        str(REPO / "tests" / "scaledrun" / "fsdp_merge_worker.py"), str(tmp_path), str(tiny_model), "float64",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for rank in (0, 1):
        r = torch.load(tmp_path / f"merge_rank{rank}.pt", weights_only=True)
        assert r["merged"].shape[0] == 4 and torch.equal(r["merged"], r["plain"])
        assert r["before"].keys() == r["after"].keys() and len(r["before"]) > 0
        assert all(torch.equal(r["after"][k], r["before"][k]) for k in r["before"])
        # the merge acts on the gathered weights, and is undone before the gather ends
        assert r["delta_max"] > 0 and r["merge_err"] <= FLOAT64_RTOL * r["delta_max"]
        assert r["restored"]

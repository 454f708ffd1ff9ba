"""Evaluation in lockstep (issue 27 item 3): under FSDP/ZeRO-3 every forward pass and every ``generate``
call is a collective, so each process must make the same number of them whatever its share of the eval
prompts. Two gloo processes on CPU run ``evaluate`` on 3 eval prompts (2 + 1) and on 1 (1 + 0), with a
``generation_batch_size`` and a form-pass size that split the rows unevenly; a counting wrapper around
the model's own ``generate`` and ``forward`` records each process's calls. The metrics must equal one
process's over the same prompts (float64 model; avg@k sampled with top-p ≈ 0, i.e. the argmax token)."""

from __future__ import annotations

import math
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from scaledrun.config import RunConfig
from scaledrun.evaluate import FORM_KEYS, HEAD_KEY, eval_share, evaluate, form_logprobs, shared_head
from scaledrun.tasks import format_prompt, load_task
from scaledrun.tiny import _tokenizer_corpus, make_model, train_tokenizer

from ..conftest import THREADS
from ..exactness import close
from .conftest import LENGTH_REWARD  # and registers that reward (in the spawned processes too)

#: Eval prompts of each run: 3 on 2 processes (2 + 1) and 1 (1 + 0, one process has none of its own).
NUM_EVALS = (3, 1)
#: k = 2 samples of 2 padded prompts = 4 rows: 2 generate calls of 3 rows; a process with 1 prompt would
#: make 1. Forms: 3 rows per pass, 2 forms per prompt: 2 prompts -> 2 passes, 1 prompt -> 1.
EVAL_K, GEN_BATCH, FORM_ROWS = 2, 3, 3
#: Seconds both processes get: a process waiting on a collective the other never makes hangs.
TIMEOUT_S = 240


def _cfg(model_dir, num_eval: int) -> RunConfig:
    return RunConfig(
        model=str(model_dir), task="template_forms", num_eval=num_eval, eval_k=EVAL_K, max_new_tokens=4,
        temperature=0.7, top_p=1e-9, micro_batch_size=FORM_ROWS, generation_batch_size=GEN_BATCH,
        reward=LENGTH_REWARD,
    )  # fmt: skip


def _tasks(n: int):
    return load_task("template_forms", "eval", n, seed=0, ops="+-")


def _load(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    return tok, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)


def _collective() -> None:
    """What FSDP/ZeRO-3 do at each forward: a collective every process must join (an all-reduce here)."""
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(torch.ones(1))


def _count_calls(model) -> dict[str, int]:
    """Counts the model's ``generate`` calls and its forward passes outside ``generate`` (the real calls,
    wrapped: ``generate`` is replaced on the instance by one that counts, then calls the original); each
    counted call also joins a collective, as under FSDP/ZeRO-3, so unequal counts hang or fail."""
    counts = {"generate": 0, "forward": 0}
    inside = [False]
    real = model.generate

    def generate(*args, **kwargs):
        counts["generate"] += 1
        _collective()
        inside[0] = True
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] = False

    def pre_hook(module, args):
        if not inside[0]:
            counts["forward"] += 1
            _collective()

    model.generate = generate
    model.register_forward_pre_hook(pre_hook)
    return counts


def _eval_on_rank(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(THREADS)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2
    tok, model = _load(model_dir)
    counts = _count_calls(model)
    result = {}
    for n in NUM_EVALS:
        before = dict(counts)
        metrics = evaluate(_cfg(model_dir, n), accelerator, model, tok, _tasks(n))
        result[n] = {"metrics": metrics, "calls": {k: counts[k] - before[k] for k in counts}}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A randomly initialised tiny Qwen3 on the template_forms tokenizer (no warm start: random outputs
    give distinct rewards per prompt and distinct form log-probs)."""
    tok = train_tokenizer(_tokenizer_corpus("template_forms", 0))
    model = make_model(len(tok), tok.pad_token_id, tok.eos_token_id, seed=0)
    out = tmp_path_factory.mktemp("lockstep") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_eval_share_pads_every_process_to_the_same_prompt_count():
    tasks = list("abc")
    assert [eval_share(tasks, r, 2) for r in (0, 1)] == [(["a", "c"], 2), (["b", "a"], 1)]
    assert [eval_share(tasks[:1], r, 2) for r in (0, 1)] == [(["a"], 1), (["a"], 0)]
    assert [eval_share(tasks, r, 4) for r in range(4)] == [(["a"], 1), (["b"], 1), (["c"], 1), (["a"], 0)]
    assert eval_share([], 1, 2) == ([], 0)


def test_form_logprobs_dummy_passes_are_dropped_and_too_few_passes_refused(model_dir):
    tok, model = _load(model_dir)
    t = _tasks(1)[0]
    prompt = [format_prompt(tok, t.prompt)]
    counts = _count_calls(model)
    plain = form_logprobs(model, tok, prompt, [t.forms], 0.7, batch_rows=1)
    assert counts["forward"] == 2
    padded = form_logprobs(model, tok, prompt, [t.forms], 0.7, batch_rows=1, passes=5)
    assert counts["forward"] == 2 + 5
    assert padded == plain  # the same passes on the same rows, then 3 dummy passes whose results are dropped
    with pytest.raises(ValueError, match="passes=1 cannot hold 2 rows"):
        form_logprobs(model, tok, prompt, [t.forms], 0.7, batch_rows=1, passes=1)


@pytest.mark.slow
def test_two_processes_evaluate_in_lockstep_and_match_one_process(model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(
        _eval_on_rank, args=(port, str(model_dir), str(tmp_path)), nprocs=2, start_method="spawn", join=False
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the two processes did not finish within {TIMEOUT_S} s (a collective never matched)")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]

    from accelerate import Accelerator

    tok, model = _load(model_dir)
    for n in NUM_EVALS:
        calls = [ranks[r][n]["calls"] for r in (0, 1)]
        # ⌈n / 2⌉ prompts each: 1 greedy call + ⌈k·⌈n/2⌉ / 3⌉ sampled calls; ⌈2·⌈n/2⌉ / 3⌉ form passes
        # + ⌈⌈n/2⌉ / 3⌉ passes of the shared heads
        per = -(-n // 2)
        want = {
            "generate": 1 + -(-EVAL_K * per // GEN_BATCH),
            "forward": -(-2 * per // FORM_ROWS) + -(-per // FORM_ROWS),
        }
        assert calls == [want, want], (n, calls)

        tasks = _tasks(n)
        one = evaluate(_cfg(model_dir, n), Accelerator(cpu=True), model, tok, tasks)
        two = ranks[0][n]["metrics"]
        assert ranks[1][n]["metrics"] == two and set(two) == set(one) == {
            "eval/greedy_accuracy", f"eval/avg@{EVAL_K}", *FORM_KEYS, HEAD_KEY,
        }  # fmt: skip
        assert two["eval/greedy_accuracy"] == one["eval/greedy_accuracy"]  # exact counts / n
        # avg@k: a mean of n·k rewards in [0, 1], summed in another order; it is not trivial
        assert 0 < one[f"eval/avg@{EVAL_K}"] < 1
        assert close(two[f"eval/avg@{EVAL_K}"], one[f"eval/avg@{EVAL_K}"], gross=1.0)
        # the form metrics: batches padded differently (float64); log-odds at the scale of the log-probs
        lps = form_logprobs(
            model, tok, [format_prompt(tok, t.prompt) for t in tasks], [t.forms for t in tasks], 0.7
        )
        gross = sum(abs(v) for lp in lps for v in lp) / n
        assert all(math.isfinite(one[k]) for k in FORM_KEYS)
        assert close(two["eval/form_entropy"], one["eval/form_entropy"], gross=1.0)
        assert close(two["eval/form_logodds"], one["eval/form_logodds"], gross=gross)
        assert close(two["eval/form_mass"], one["eval/form_mass"])
        heads = form_logprobs(model, tok, [format_prompt(tok, t.prompt) for t in tasks],
                              [(shared_head(t),) for t in tasks], 0.7, eos=False)  # fmt: skip
        assert close(two[HEAD_KEY], one[HEAD_KEY], gross=sum(abs(h[0]) for h in heads) / n)

"""The trainer's held-out evaluation (every ``eval_every`` steps; ``scaledrun.train``).

``evaluate``: greedy accuracy and avg@k (the mean reward of k samples) over the eval prompts, each process
scoring its share; for tasks with several equally correct forms (``template_forms``) also the exact
equivalent-solution entropy, the forms' mass and their log-odds (``FORM_KEYS``), from teacher-forced
log-probs of each whole form + EOS at the sampling temperature (``form_logprobs``, ``form_stats``).

**Lockstep.** Under FSDP and ZeRO-3 every forward pass (hence every ``generate`` call) is a collective:
all processes must make the same number of them, whatever their share of the prompts. Each process
therefore evaluates ⌈N / world⌉ prompts (``eval_share``: its own, then copies of the first prompt) and
makes as many form passes as the process that needs most (``form_logprobs(passes=...)``); the dummy
rows' results are dropped, so the metrics are those of one process over the N prompts. (Within one
``generate`` call, rows that stop early make the step counts differ; transformers keeps the processes in
step itself there with ``synced_gpus`` when it detects ZeRO-3 or an FSDP1 wrapper; it does not detect
accelerate's FSDP2, whose generation needs parameters that stay gathered for the whole call.)
"""

from __future__ import annotations

from typing import Any

import torch

from .backends import run_backend
from .config import RunConfig
from .distributed import max_list, sum_over_processes
from .rewards import compute_rewards
from .rollout import completion_logprobs, generate_texts
from .tasks import Task, format_prompt, reward_columns

#: Eval keys of tasks with several equally correct forms (``Task.forms``, e.g. ``template_forms``), from
#: q_k = π(form_k | prompt) / Σ_j π(form_j | prompt) (whole completions + EOS, teacher-forced at T):
#: ``eval/form_entropy`` the mean over prompts of H(q) in nats (ln 2 for two equally likely forms, 0 when
#: the policy has collapsed onto one), ``eval/form_mass`` the mean of Σ_k π(form_k | prompt) and
#: ``eval/form_logodds`` the mean of log π(form_0 | prompt) − log π(form_1 | prompt).
FORM_KEYS = ("eval/form_entropy", "eval/form_mass", "eval/form_logodds")
#: Eval key of tasks whose references (forms and decoys) open with the same sentence (``shared_head``):
#: the mean over those prompts of log π(head | prompt), teacher-forced at T, no EOS. Every completion of
#: a group shares the head, so this is where drift of shared tokens shows (DFPO Sec. 3.3, App. G).
HEAD_KEY = "eval/head_logprob"


#: Rows (prompt + one form) per no-grad forward pass of ``form_logprobs``.
FORM_BATCH_ROWS = 64


@torch.no_grad()
def form_logprobs(
    model: Any, tokenizer: Any, prompts: list[str], forms: list[tuple[str, ...]], temperature: float,
    batch_rows: int = FORM_BATCH_ROWS, passes: int | None = None, eos: bool = True,
) -> list[list[float]]:  # fmt: skip
    """log π(form | prompt) of whole completions, teacher-forced: ``out[i][k]`` for ``forms[i][k]``
    (``eos=False``: of the text alone, a prefix of completions, without the EOS).

    ``prompts`` are chat-formatted (``format_prompt``). Each row is the prompt's tokens (left-padded, as
    the rollouts) followed by the form's tokens and EOS (right-padded); log π is the sum over those
    completion tokens of ``completion_logprobs`` at ``temperature`` (the trainer's log-probs of
    logits / T), in eval mode (no dropout), ``batch_rows`` rows per forward pass. ``passes``: make exactly
    this many forward passes (≥ the ⌈rows / batch_rows⌉ needed), the extra ones on the first row alone,
    their results dropped: every process then makes the same number (see "Lockstep").
    """
    eos_id = tokenizer.eos_token_id
    if eos_id is None and eos:
        raise ValueError("the tokenizer has no eos_token_id: a form's probability includes its EOS")
    end = [eos_id] if eos else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    device = next(model.parameters()).device
    rows: list[tuple[int, list[int], list[int]]] = []
    for i, (prompt, fs) in enumerate(zip(prompts, forms, strict=True)):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        rows += [(i, p, tokenizer(f, add_special_tokens=False)["input_ids"] + end) for f in fs]
    chunks = [rows[s : s + batch_rows] for s in range(0, len(rows), batch_rows)]
    if passes is not None:
        if passes < len(chunks) or (passes > len(chunks) and not rows):
            raise ValueError(
                f"form_logprobs: passes={passes} cannot hold {len(rows)} rows at {batch_rows} per pass"
            )
        chunks += [rows[:1]] * (passes - len(chunks))  # dummy passes (lockstep), results dropped below
    was_training = model.training
    model.eval()
    sums: list[float] = []
    for chunk in chunks:
        width_p, width_c = max(len(p) for _, p, _ in chunk), max(len(c) for _, _, c in chunk)
        ids, att = [], []
        for _, p, c in chunk:
            lp, rc = width_p - len(p), width_c - len(c)
            ids.append([pad] * lp + p + c + [pad] * rc)
            att.append([0] * lp + [1] * (len(p) + len(c)) + [0] * rc)
        ids_t = torch.tensor(ids, device=device)
        att_t = torch.tensor(att, device=device)
        logp = completion_logprobs(model, ids_t, att_t, width_c, temperature=temperature)["logp"]
        sums += (logp.double() * att_t[:, width_p:]).sum(1).tolist()
    if was_training:
        model.train()
    out: list[list[float]] = [[] for _ in prompts]
    for (i, _, _), v in zip(rows, sums[: len(rows)], strict=True):
        out[i].append(v)
    return out


def form_stats(logps: list[float]) -> dict[str, float]:
    """The entropy (nats) of q_k ∝ π(form_k), the mass Σ_k π(form_k) and log π(form_0) − log π(form_1)."""
    lp = torch.tensor(logps, dtype=torch.float64)
    log_q = torch.log_softmax(lp, 0)
    return {
        "entropy": float(-(log_q.exp() * log_q).sum()),
        "mass": float(lp.exp().sum()),
        "logodds": float(lp[0] - lp[1]),
    }


def shared_head(task: Task) -> str:
    """The sentence every reference of ``task`` (its ``forms`` and ``decoys``) opens with: their common
    prefix up to and including its last ``". "``'s period (``""`` when they share no whole sentence or the
    task has fewer than two references). ``template_decoy``: ``"Let me compute 37 + 45."``."""
    refs = [*task.forms, *task.decoys]
    if len(refs) < 2:
        return ""
    common = refs[0]
    for r in refs[1:]:
        n = 0
        while n < min(len(common), len(r)) and common[n] == r[n]:
            n += 1
        common = common[:n]
    cut = common.rfind(". ")
    return common[: cut + 1] if cut >= 0 else ""


def eval_share(tasks: list[Task], rank: int, world: int) -> tuple[list[Task], int]:
    """This process's eval tasks padded to ⌈N / world⌉ (copies of ``tasks[0]`` after its own) and how many
    are its own: every process evaluates the same number of prompts (see "Lockstep")."""
    mine = tasks[rank::world]
    return mine + tasks[:1] * (-(-len(tasks) // world) - len(mine)), len(mine)


def evaluate(
    cfg: RunConfig, accelerator: Any, model: Any, tokenizer: Any, tasks: list[Task]
) -> dict[str, float]:
    """Greedy accuracy and avg@k (mean reward of k samples) on this process's share of the held-out prompts.

    When some eval tasks carry ≥ 2 equally correct ``forms`` (``template_forms``), also ``FORM_KEYS``:
    exact (teacher-forced, no sampling) means over those prompts of the equivalent-solution entropy,
    the forms' total probability and the forms' log-odds (``form_logprobs`` at ``cfg.temperature``;
    ``micro_batch_size`` rows per forward pass when set, else ``FORM_BATCH_ROWS``); and ``HEAD_KEY``
    over those of them whose references open with a shared sentence (``shared_head``). Every process makes
    the same number of ``generate`` calls and forward passes, on dummy rows when it has fewer prompts
    than another (``eval_share``; their results are dropped): the metrics are those of one process.
    """
    padded, n_own = eval_share(tasks, accelerator.process_index, accelerator.num_processes)
    mine = padded[:n_own]
    unwrapped = accelerator.unwrap_model(model)
    with_forms = any(len(t.forms) >= 2 for t in tasks)  # the whole list: every process decides alike
    local = {"greedy_correct": 0.0, "mean_sampled_reward": 0.0, "prompts": float(len(mine))}
    if with_forms:
        local.update(form_entropy=0.0, form_mass=0.0, form_logodds=0.0, form_prompts=0.0)
    with_heads = any(len(t.forms) >= 2 and shared_head(t) for t in tasks)
    if with_heads:
        local.update(head_logprob=0.0, head_prompts=0.0)
    if padded:  # every process, or none (⌈N / world⌉ prompts each): the same generate calls everywhere
        prompts = [
            format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs) for t in padded
        ]
        backend = run_backend(cfg, unwrapped)
        k = cfg.eval_k
        greedy = generate_texts(
            unwrapped, tokenizer, prompts, n=1, max_new_tokens=cfg.max_new_tokens, do_sample=False,
            backend=backend,
        )[:n_own]  # fmt: skip
        sampled = generate_texts(
            unwrapped, tokenizer, prompts, n=k, max_new_tokens=cfg.max_new_tokens,
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, backend=backend,
        )[: n_own * k]  # fmt: skip
        prompts, answers = prompts[:n_own], [t.answer for t in mine]
    if mine:
        r_greedy, _ = compute_rewards(
            cfg.reward, prompts, greedy, answers, cfg.failure_reward,
            weights=cfg.reward_weights, columns=reward_columns(mine),
        )  # fmt: skip
        r_k, _ = compute_rewards(
            cfg.reward, [p for p in prompts for _ in range(k)], sampled, [a for a in answers for _ in range(k)],
            cfg.failure_reward, weights=cfg.reward_weights, columns=reward_columns([t for t in mine for _ in range(k)]),
        )  # fmt: skip
        local["greedy_correct"] = float(sum(r >= 1.0 for r in r_greedy))
        local["mean_sampled_reward"] = sum(r_k) / k  # summed over prompts: Σ_prompts mean of its k rewards
    if with_forms:
        multi = [t for t in mine if len(t.forms) >= 2]
        heads = [(t, shared_head(t)) for t in multi if shared_head(t)]
        batch_rows = cfg.micro_batch_size or FORM_BATCH_ROWS
        need = -(-sum(len(t.forms) for t in multi) // batch_rows)
        need_heads = -(-len(heads) // batch_rows)
        # the process that needs most, for each kind of pass
        passes, head_passes = (int(v) for v in max_list(accelerator, [float(need), float(need_heads)]))
        dummy = next(t for t in tasks if len(t.forms) >= 2)
        fed, forms = (
            (multi, [t.forms for t in multi]) if multi else ([dummy], [dummy.forms[:1]])
        )  # 1 dummy row
        logps = form_logprobs(
            unwrapped, tokenizer,
            [format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs) for t in fed],
            forms, cfg.temperature, batch_rows, passes=passes,
        )[: len(multi)]  # fmt: skip
        for lp in logps:
            st = form_stats(lp)
            local["form_entropy"] += st["entropy"]
            local["form_mass"] += st["mass"]
            local["form_logodds"] += st["logodds"]
        local["form_prompts"] = float(len(multi))
    if with_heads:
        fed_h = heads or [next((t, shared_head(t)) for t in tasks if len(t.forms) >= 2 and shared_head(t))]
        head_lp = form_logprobs(
            unwrapped, tokenizer,
            [format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs) for t, _ in fed_h],
            [(h,) for _, h in fed_h], cfg.temperature, batch_rows, passes=head_passes, eos=False,
        )[: len(heads)]  # fmt: skip
        local["head_logprob"] = sum(lp[0] for lp in head_lp)
        local["head_prompts"] = float(len(heads))
    total = sum_over_processes(accelerator, local)
    n = max(total["prompts"], 1.0)
    out = {
        "eval/greedy_accuracy": total["greedy_correct"] / n,
        f"eval/avg@{cfg.eval_k}": total["mean_sampled_reward"] / n,
    }
    if with_forms:
        m = max(total["form_prompts"], 1.0)
        out.update({key: total[key.removeprefix("eval/")] / m for key in FORM_KEYS})
    if with_heads:
        out[HEAD_KEY] = total["head_logprob"] / max(total["head_prompts"], 1.0)
    return out

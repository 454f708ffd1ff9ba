"""The cancellation-hypothesis paper's token-level instruments on the tiny Qwen3: one batch, every token's gradient.

The paper: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits"
(arXiv 2605.08666). ``instruments.coupling`` measures its Table 1 on a small neural policy over a toy
scenario; this module supplies the same flat per-token tensors from a Hugging Face causal LM (the tiny
Qwen3 that ``scaledrun.tiny`` builds offline, or any saved model folder), so that every instrument of
``cancellation.coupling`` runs on it unchanged, and measures Table 1 on it (``measure_lm``, ``lm_table1``).

What the model supplies (``LMBatch``): one on-policy batch sampled with the trainer's own rollout code
(``scaledrun.rollout.generate_rollouts``, rewards from ``scaledrun.rewards.compute_rewards``, advantages
from ``cancellation.group_advantages``, coefficients c = ∂J/∂log π from ``cancellation.update.coefficients``
with every ratio 1), flattened row-major over the completion mask: tokens, log-probs, the next-token
distributions π_j, their entropies, and h_j, the input of the unembedding (the last hidden state, which
for Qwen3 is taken *after* the final RMSNorm: ``lm_head(hidden_states[-1])`` is the logits exactly).

The instruments run outside the trainer (Sec. 2 of the paper, App. D.3 on why not Adam): plain SGD, the
model's own weights (no LoRA adapter), every chosen weight trainable, no clipping, no warm-up, float64.
Three updates are defined, because the tiny Qwen3 *ties* its input embedding and its output head (one
matrix E serves both), so "an LM-head-only update" means two different things:

- ``"full"``: every parameter of the model;
- ``"head_tied"``: the tied matrix E alone; its gradient flows through both uses (the output logits and
  the input embeddings of every later position), so this is what "train only the LM head" does to a
  tied model;
- ``"head_untied"``: an untied copy W_out = E of the output use alone, the rest (input embeddings
  included) frozen: the logits are h_j W_outᵀ / τ with h_j fixed. Its exact kernel is the paper's
  output-layer proxy (eq. 6–7) to rounding, and it is what the paper's proxy describes.

The paper's tied models carry the same ambiguity: Qwen3-1.7B-Base and Qwen3-4B-Base tie their input
embedding and LM head (``tie_word_embeddings: true`` in their configs), Qwen2.5-Math-7B does not. For those
two, the LM-head-only column of Table 1 and App. D.1's "updating only the unembedding matrix" are either
update, and the text does not say which; the proxy's kernel is the untied one's.

Temperature. The policy is softmax(logits / τ) (τ = the sampling temperature, as in the trainer): the
score of the untied head is (e_y − π) hᵀ / τ, so ``cancellation.coupling.proxy_kernel`` is called with
``temperature=τ`` (the 1/τ² factor) and ``per_token_scores`` sees the 1/τ through ``logp_of``.

Table 1 on the LM (``measure_lm``, ``summarise_lm``, ``lm_table1``, ``markdown_lm_table1``). Per batch:
the exact kernels K = ⟨g_j, g_k⟩ of the three updates (``per_token_scores`` + ``coupling_kernel``; the tied
head's scores are the tied matrix's columns of the full scores, the same gradient) and the proxy; the actual
Δ log π of one SGD step of each update and its first-order prediction (``first_order_delta``); Table 1's four
mask sets of every token (``mask_sets``), the exact Masking Effect (``masking_effect`` with ``sgd_step`` over
``LMBatch.logp_fn(update)``) of a random subsample of candidates and its first-order prediction
(``first_order_masking_effect``) on all of them. The conventions are ``instruments.coupling``'s (same
names, defaults and helpers: ``candidate_mask``, ``MASK_SETS``, ``PAPER_BOOST_RATE``, ``format_table``), plus
two the LM needs: ``active_only`` and ``n_candidates`` (``measure_lm``).

Run (``experiments/coupling_lm.py``, which builds the power study's model when no folder is given; CPU, 1
thread, about 2–3 minutes; prints the markdown section):

    python -m experiments.coupling_lm [--model FOLDER] [--seeds 0 1] [--quick] [--json OUT]
"""

from __future__ import annotations

import itertools
import json
import math
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from cancellation import group_advantages
from cancellation.coupling import (
    boost_stats,
    coupling_kernel,
    coupling_mass,
    first_order_delta,
    first_order_masking_effect,
    mask_sets,
    masking_effect,
    per_token_scores,
    proxy_kernel,
    sgd_step,
)
from cancellation.update import coefficients
from instruments.coupling import (
    _MASK_OFFSET,
    CANDIDATE_FILTERS,
    CANDIDATES,
    MASK_SETS,
    PAPER_BOOST_RATE,
    TIES,
    _agree,
    _frac,
    candidate_mask,
    format_table,
    paper_distance,
)

#: The three updates of an LM (module docstring).
LM_UPDATES = ("full", "head_tied", "head_untied")

#: The embedding matrix of a Qwen-family model, shared by the output head when the model ties them.
EMBED_NAME = "model.embed_tokens.weight"


def _resolve_model(path: Path) -> tuple[Path, Path | None]:
    """(the base model folder, the LoRA checkpoint folder or None) for a model, checkpoint or run folder."""
    if (path / "checkpoints").is_dir() and not (path / "config.json").is_file():  # a run folder: its newest
        done = sorted(p for p in (path / "checkpoints").iterdir() if (p / "trainer_state.json").is_file())
        if not done:
            raise ValueError(f"the run folder {path} has no finished checkpoint under checkpoints/")
        path = done[-1]
    if (path / "adapter_config.json").is_file():
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ValueError(
                f"the LoRA checkpoint {path} names the base model {base!r}, which is not a model folder here: "
                "pass the base model's folder with the adapter's run, or a merged model folder"
            )
        return Path(base), path
    if not (path / "config.json").is_file():
        raise ValueError(
            f"no model in {path} (no config.json, adapter_config.json or checkpoints/): build one with "
            f"`python -m scaledrun.tiny --out {path}`, or pass a saved Hugging Face model folder, a "
            "scaledrun checkpoint (checkpoints/step_N) or a run folder"
        )
    return path, None


def load_policy(
    folder: str | Path, *, dtype: torch.dtype = torch.float64, exact_norms: bool = True
) -> tuple[Any, Any]:
    """The causal LM and tokenizer in ``folder`` (nothing downloads), in ``dtype``, dropout off.

    ``folder``: a saved Hugging Face model folder; a ``scaledrun`` LoRA checkpoint
    (``<run>/checkpoints/step_N``: its base model, named in ``adapter_config.json``, with the adapter
    merged in, so the instruments see the trained policy's plain weights); or a run folder (its newest
    finished checkpoint). Every parameter requires grad (the instruments choose which to differentiate);
    the tokenizer pads on the left, as generation needs. ``exact_norms`` (default): the model's RMSNorms
    compute in ``dtype`` for good (``float64_norms`` explains why a float64 Qwen3 needs it).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, adapter = _resolve_model(Path(folder))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    if exact_norms:
        _patch_norms(model)
    tokenizer = AutoTokenizer.from_pretrained(
        str(adapter if adapter and (adapter / "tokenizer.json").is_file() else base)
    )
    tokenizer.padding_side = "left"
    return model, tokenizer


def is_tied(model: Any) -> bool:
    """Whether the model's output head is its input embedding matrix (one tensor)."""
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


@dataclass
class LMBatch:
    """One on-policy batch of a causal LM, flattened over its N completion tokens (row-major over the mask).

    Attributes:
        model, tokenizer: the policy (float64, eval mode) and its tokenizer.
        temperature: τ of the sampling policy softmax(logits / τ).
        input_ids: (B, P + T) prompt (left-padded to P) then completion; attention_mask: (B, P + T).
        completion_mask: (B, T) 1 through each completion's first end token.
        group: (B,) prompt ids; rewards, advantages: (B,); completions: the B completion texts.
        coef: (N,) c_j = ∂J/∂log π(y_j) of the objective (on-policy: every ratio 1).
        tokens: (N,) the sampled token ids y_j; texts: their N token strings.
        row, pos: (N,) the completion and the position within it of each token.
        logp: (N,) log π(y_j); probs_taken: (N,) π_j(y_j); probs: (N, V) π_j; entropy: (N,) H(π_j).
        hidden: (N, d) h_j, the input of the unembedding (after the final norm).
        adv_tok: (N,) the advantage of token j's completion.
    """

    model: Any
    tokenizer: Any
    temperature: float
    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    group: Tensor
    rewards: Tensor
    advantages: Tensor
    completions: list[str]
    coef: Tensor
    tokens: Tensor
    texts: list[str]
    row: Tensor
    pos: Tensor
    logp: Tensor
    probs_taken: Tensor
    probs: Tensor
    entropy: Tensor
    hidden: Tensor
    adv_tok: Tensor

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def _logits(self, theta: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """(B, T, V) completion-position logits / τ under ``theta`` (None: the model's own weights), and the
        (B, T, d) last hidden states."""
        kw = dict(input_ids=self.input_ids, attention_mask=self.attention_mask, position_ids=_positions(
            self.attention_mask), use_cache=False, output_hidden_states=True)  # fmt: skip
        out = self.model(**kw) if theta is None else functional_call(self.model, theta, (), kw)
        t = self.completion_mask.shape[1]
        # the logit at position k predicts token k + 1
        logits = out.logits[:, -t - 1 : -1, :] / self.temperature
        return logits, out.hidden_states[-1][:, -t - 1 : -1, :]

    def logp_of(self, theta: dict[str, Tensor]) -> Tensor:
        """(N,) log π_θ(y_j) of the batch's tokens with the model's parameters replaced by ``theta`` (names →
        tensors, as ``named_parameters``; missing names keep the model's weights)."""
        logits, _ = self._logits(theta)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, self.completion_ids.unsqueeze(-1)).squeeze(-1)
        return logp[self.completion_mask.bool()]

    def head_logp_of(self, head: Tensor) -> Tensor:
        """(N,) log π(y_j) with an untied output matrix ``head`` (V, d) on the fixed hidden states h_j."""
        logits = self.hidden @ head.T / self.temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)

    @property
    def completion_ids(self) -> Tensor:
        return self.input_ids[:, -self.completion_mask.shape[1] :]

    def update_params(self, update: str) -> tuple[list[str], list[Tensor]]:
        """The names and (detached) starting values of the parameters ``update`` trains."""
        if update not in LM_UPDATES:
            raise ValueError(f"unknown update {update!r}; valid: {', '.join(LM_UPDATES)}")
        named = dict(self.model.named_parameters())
        if update == "full":
            names = list(named)
        else:
            if EMBED_NAME not in named:
                raise ValueError(
                    f"the model has no {EMBED_NAME!r}: the head updates are defined for Qwen-family models"
                )
            names = [EMBED_NAME]
        return names, [named[n].detach().clone() for n in names]

    def logp_fn(self, update: str) -> tuple[Any, list[Tensor]]:
        """``(logp_of, params)`` for ``update``: ``logp_of(list of tensors) -> (N,)`` over those parameters.

        ``"head_untied"`` differentiates an untied copy of the output matrix on the fixed hidden states;
        ``"head_tied"`` the tied matrix through both of its uses; ``"full"`` every parameter.
        """
        names, params = self.update_params(update)
        if update == "head_untied":
            return (lambda theta: self.head_logp_of(theta[0])), params

        def logp_of(theta: Sequence[Tensor]) -> Tensor:
            return self.logp_of(dict(zip(names, theta, strict=True)))

        return logp_of, params


def _positions(attention_mask: Tensor) -> Tensor:
    from scaledrun.scoring import position_ids_from_mask

    return position_ids_from_mask(attention_mask)


def sample_lm_batch(
    model: Any,
    tokenizer: Any,
    *,
    task: str = "template_decoy",
    reward: str = "exact_match",
    num_prompts: int = 2,
    group_size: int = 8,
    seed: int = 0,
    split: str = "train",
    max_new_tokens: int = 40,
    temperature: float = 1.0,
    objective: str = "grpo",
    digits: int = 2,
    ops: str = "+",
) -> LMBatch:
    """Sample ``group_size`` completions for each of ``num_prompts`` synthetic prompts and flatten them.

    Prompts: ``scaledrun.tasks.synthetic_tasks(task, split, num_prompts, seed=seed, ...)``; sampling: ``generate_rollouts`` with the torch RNG seeded by ``seed``;
    rewards: ``compute_rewards(reward, ...)``; advantages: ``group_advantages`` (truncated completions, no
    end token within ``max_new_tokens``, stay in: the instruments look at every sampled token);
    coefficients: ``coefficients(objective, logp, logp, A, mask, group)`` (on-policy, so ratios are 1).
    """
    from scaledrun.rewards import compute_rewards
    from scaledrun.rollout import generate_rollouts
    from scaledrun.tasks import format_prompt, synthetic_tasks

    for name, v in (
        ("num_prompts", num_prompts),
        ("group_size", group_size),
        ("max_new_tokens", max_new_tokens),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"`{name}` must be a positive int, got {v!r}")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
    chosen = synthetic_tasks(task, split, num_prompts, seed=int(seed), digits=digits, ops=ops)
    torch.manual_seed(int(seed))
    batch, _ = generate_rollouts(
        model, tokenizer, [format_prompt(tokenizer, t.prompt) for t in chosen], [t.answer for t in chosen],
        list(range(len(chosen))), num_generations=group_size, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=1.0,
    )  # fmt: skip
    rewards, _failures = compute_rewards(reward, batch.prompts, batch.completions, batch.answers)
    dtype = next(model.parameters()).dtype
    rew = torch.tensor(rewards, dtype=dtype)
    adv = group_advantages(rew, batch.group)
    mask = batch.completion_mask.to(dtype)
    valid = mask.bool()
    if not bool(valid.any()):
        raise ValueError("the batch has no completion tokens (every completion is empty)")
    lm = LMBatch(
        model=model, tokenizer=tokenizer, temperature=float(temperature), input_ids=batch.input_ids,
        attention_mask=batch.attention_mask, completion_mask=mask, group=batch.group, rewards=rew,
        advantages=adv, completions=list(batch.completions), coef=torch.empty(0), tokens=torch.empty(0),
        texts=[], row=torch.empty(0), pos=torch.empty(0), logp=torch.empty(0), probs_taken=torch.empty(0),
        probs=torch.empty(0), entropy=torch.empty(0), hidden=torch.empty(0), adv_tok=torch.empty(0),
    )  # fmt: skip
    with torch.no_grad():
        logits, hidden = lm._logits()
        logsm = torch.log_softmax(logits, dim=-1)
        logp_bt = logsm.gather(-1, lm.completion_ids.unsqueeze(-1)).squeeze(-1) * mask
        probs = logsm.exp()
    # Sec. 2 eq. (2): the update as a weighted token log-likelihood; on-policy, so old_logp = logp
    coef = coefficients(objective, logp_bt, logp_bt, adv, mask, batch.group, with_metrics=False).coef
    rows, cols = torch.nonzero(valid, as_tuple=True)
    lm.coef = coef[valid].to(dtype)
    lm.tokens = lm.completion_ids[valid]
    lm.texts = tokenizer.convert_ids_to_tokens(lm.tokens.tolist())
    lm.row, lm.pos = rows, cols
    lm.logp = logp_bt[valid]
    lm.probs_taken = lm.logp.exp()
    lm.probs = probs[valid]
    lm.entropy = -(probs[valid] * logsm[valid]).sum(-1)
    lm.hidden = hidden[valid].detach()
    lm.adv_tok = adv[:, None].expand_as(mask)[valid]
    return lm


def max_rel_diff(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |b| (0 when both are 0): how far two kernels are apart on b's scale."""
    scale = float(b.abs().max())
    diff = float((a - b).abs().max())
    return 0.0 if diff == 0.0 else (diff / scale if scale > 0 else math.inf)


# ------------------------------------------------------------------------------------------------
# Table 1 on the LM: the measurement


def _rms_norm_in_dtype(self: Any, hidden_states: Tensor) -> Tensor:
    """An RMSNorm's forward computed in its input dtype (the class's own casts to float32 and back)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _patch_norms(model: Any) -> list[Any]:
    """Make every RMSNorm of ``model`` compute in its input's dtype (``float64_norms``); the newly patched."""
    patched = []
    for mod in model.modules():
        if (
            type(mod).__name__.endswith("RMSNorm")
            and hasattr(mod, "variance_epsilon")
            and hasattr(mod, "weight")
        ):
            if "forward" in vars(mod):
                continue  # already patched (by ``load_policy`` or an enclosing block)
            mod.forward = types.MethodType(_rms_norm_in_dtype, mod)
            patched.append(mod)
    return patched


@contextmanager
def float64_norms(model: Any) -> Iterator[int]:
    """Run the model's RMSNorms in the model's own dtype inside the block; yields how many were patched.

    Qwen3's ``Qwen3RMSNorm.forward`` casts its input to float32 and the result back, even in a float64
    model, so every log-prob of a "float64" forward carries float32 rounding (~1e-7 relative) and is a
    step function of the weights below that scale. A difference of two SGD steps (the Masking Effect of a
    small mask, ~1e-10 at lr = 1e-4) then is rounding noise: on the tiny Qwen3 the exact ME of random masks
    agreed in sign with its first-order value on about half of the candidates whatever the lr. Inside this
    block each RMSNorm (every module with ``variance_epsilon`` and ``weight`` whose class name ends in
    "RMSNorm") computes x·rsqrt(mean(x²) + ε)·w in x's dtype, the same function without the casts; the
    exact ME then converges to the kernel's first-order one linearly in lr. On exit the class's forward is
    back. The rotary tables (computed in float32 from the fixed positions) do not depend on the weights
    and are left alone.
    """
    patched = _patch_norms(model)
    try:
        yield len(patched)
    finally:
        for mod in patched:
            del mod.forward


#: The default SGD step. The full update's kernel is large on the tiny Qwen3 (‖g_j‖² up to ~1e5 on
#: confident tokens), so at lr = 1e-3 its first-order Δ log π is already off by ~10% and some tokens move
#: by 0.25; at 1e-4 the error is ~1% (``first_order_error``), every update stays in the regime the kernel
#: describes, and the smallest update (the untied head, |Δ| ~ 1e-8) is still far above float64 rounding.
DEFAULT_LR = 1e-4
#: Candidates whose exact Masking Effect is computed per batch (a random subsample; every candidate gets
#: the first-order one). The full update's masked steps cost one forward + backward + forward each (~0.1 s
#: on the tiny Qwen3), four per candidate.
N_CANDIDATES = 48
#: The batches of the default run (each: 2 prompts × 8 completions of ``template_decoy``).
DEFAULT_SEEDS = (0, 1)
#: The kernels of a measurement: the three updates' and the output-layer proxy (eq. 7).
KERNELS = (*LM_UPDATES, "proxy")
#: Table 1's column each update is compared with (``PAPER_BOOST_RATE``'s keys).
PAPER_COLUMN = {"full": "full", "head_tied": "head", "head_untied": "head"}
# the candidate subsample draws from its own generator (instruments.coupling uses 10 000 and 20 000)
_CANDIDATE_OFFSET = 30_000


def _check_lr(lr: float) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise TypeError(f"`lr` must be a number, got {type(lr).__name__}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"`lr` must be a finite step size > 0, got {lr}")
    return float(lr)


def _check_updates(updates: Iterable[str]) -> tuple[str, ...]:
    if isinstance(updates, str):
        raise TypeError(f"`updates` must be a sequence of update names, got the string {updates!r}")
    out = tuple(updates)
    if not out:
        raise ValueError(f"`updates` is empty; valid: {', '.join(LM_UPDATES)}")
    for u in out:
        if u not in LM_UPDATES:
            raise ValueError(f"unknown update {u!r}; valid: {', '.join(LM_UPDATES)}")
    if len(set(out)) != len(out):
        raise ValueError(f"`updates` repeats an update: {out}")
    return out


def _check_conventions(candidates: str, ties: str, candidate_filter: str) -> None:
    if candidates not in CANDIDATES:
        raise ValueError(f"unknown candidates {candidates!r}; valid: {', '.join(CANDIDATES)}")
    if ties not in TIES:
        raise ValueError(f"unknown ties {ties!r}; valid: {', '.join(TIES)}")
    if candidate_filter not in CANDIDATE_FILTERS:
        raise ValueError(
            f"unknown candidate_filter {candidate_filter!r}; valid: {', '.join(CANDIDATE_FILTERS)}"
        )


def _check_n_candidates(n: int | None) -> None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"`n_candidates` must be a positive int or None (all), got {n!r}")


def lm_mask_sets(
    batch: LMBatch,
    *,
    same_sign: bool = False,
    low_conf: float = 0.5,
    active_only: bool = True,
    mask_seed: int = 0,
) -> dict[str, Tensor]:
    """Table 1's four mask sets of every token of ``batch``: {set: (N, N) bool}, row j = M_j.

    Row j is ``cancellation.coupling.mask_sets`` of candidate j (its conventions: strict ``low_conf``,
    ``same_sign``, the random mask as large as "both"), the random masks drawn in token order from a
    generator seeded as ``instruments.coupling.measure`` seeds it. ``active_only=True``: the masks draw only
    from the tokens the update sees, c_k ≠ 0 (the candidate itself may have c_j = 0). On an LM batch a
    group whose rewards are all equal has A = 0, so c = 0 on all its tokens: removing them changes no
    step, and a random mask drawn among them would remove nothing (ME = 0, a tie). ``False``: every token is
    eligible, as in the toy.
    """
    n = batch.n_tokens
    gen = torch.Generator().manual_seed(_MASK_OFFSET + int(mask_seed))
    active = batch.coef != 0
    masks = {s: torch.zeros((n, n), dtype=torch.bool) for s in MASK_SETS}
    everyone = torch.arange(n)
    for j in range(n):
        if active_only:
            keep = active.clone()
            keep[j] = True
            idx = torch.nonzero(keep).flatten()
            local = int((idx < j).sum())
        else:
            idx, local = everyone, j
        sets = mask_sets(
            batch.tokens[idx], batch.probs_taken[idx], local, low_conf=low_conf,
            advantages=batch.adv_tok[idx], same_sign=same_sign, generator=gen,
        )  # fmt: skip
        for s in MASK_SETS:
            masks[s][j, idx] = sets[s]
    return masks


@dataclass
class LMMeasurement:
    """Kernels, Δ log π and masking effects of one ``LMBatch`` under one mask convention.

    Attributes:
        batch: the ``LMBatch``; lr: the SGD step; same_sign, low_conf, candidate_filter, active_only: the
            conventions (``measure_lm``); updates: the updates measured.
        masks: {set: (N, N) bool}, row j = M_j (``lm_mask_sets``).
        nonempty: {set: (N,) bool}, the rows whose mask holds a token with c ≠ 0 (the others leave the step
            unchanged: ME = 0 exactly, not run).
        computed: {set: (N,) bool}, the candidates (``candidate_filter``); first-order ME on all of them.
        exact: (N,) bool, the random subsample of candidates whose exact ME was computed.
        me: {update: {set: (N,)}} exact ME (NaN outside ``exact & computed``).
        me_first: {update: {set: (N,)}} first-order ME from the update's own kernel (NaN outside ``computed``).
        kernels: {update or "proxy": (N, N)}.
        delta: {update: (N,) actual Δ log π of the unmasked step; f"{update}_first": its first-order
            prediction (eq. 5); "proxy_first": eq. (9)'s (the proxy kernel)}.
        n_params: {update: number of parameters it trains}.
        seconds: wall-clock seconds per stage.
    """

    batch: LMBatch
    lr: float
    same_sign: bool
    low_conf: float
    candidate_filter: str
    active_only: bool
    updates: tuple[str, ...]
    masks: dict[str, Tensor]
    nonempty: dict[str, Tensor]
    computed: dict[str, Tensor]
    exact: Tensor
    me: dict[str, dict[str, Tensor]]
    me_first: dict[str, dict[str, Tensor]]
    kernels: dict[str, Tensor]
    delta: dict[str, Tensor]
    n_params: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)


def update_scores(batch: LMBatch, update: str) -> Tensor:
    """(N, P) per-token scores g_j = ∇ log π(y_j) over the parameters ``update`` trains (``per_token_scores``)."""
    logp_of, params = batch.logp_fn(update)
    params = [p.requires_grad_(True) for p in params]
    return per_token_scores(lambda: logp_of(params), params)


def _embed_columns(batch: LMBatch) -> tuple[int, int]:
    """The columns of the tied matrix in the full update's scores (``named_parameters`` order)."""
    start = 0
    for name, p in batch.model.named_parameters():
        if name == EMBED_NAME:
            return start, start + p.numel()
        start += p.numel()
    raise ValueError(f"the model has no {EMBED_NAME!r}")


def measure_lm(
    batch: LMBatch,
    *,
    lr: float = DEFAULT_LR,
    same_sign: bool = False,
    low_conf: float = 0.5,
    n_candidates: int | None = N_CANDIDATES,
    candidate_seed: int = 0,
    updates: Iterable[str] = LM_UPDATES,
    candidate_filter: str = "coupled",
    active_only: bool = True,
    mask_seed: int = 0,
    exact_norms: bool = True,
    progress: Callable[[str], Any] | None = None,
) -> LMMeasurement:
    """Kernels, Δ log π and masking effects of ``batch`` under the three LM updates (module docstring).

    - Kernels: K = ``coupling_kernel(update_scores(...))`` for each update; the tied head's from the tied
      matrix's columns of the full scores when "full" is measured too (the same gradient, one pass
      saved); "proxy": ``proxy_kernel(h, π, y, τ)``.
    - Δ log π: one ``sgd_step`` on J = Σ_k c_k log π(y_k) from the batch's weights, minus the starting
      log π under the same ``logp_of``; first order: ``first_order_delta(K, c, lr)``.
    - Masks: ``lm_mask_sets`` (``same_sign``, ``low_conf``, ``active_only``, ``mask_seed``).
    - Candidates, ``candidate_filter`` as ``instruments.coupling.measure`` (no token is forced on an LM):
      ``"coupled"``: tokens whose "both" mask is non-empty (holds a token with c ≠ 0), the same candidates
      in every row; ``"nonempty"``: per set, tokens whose mask is non-empty; ``"none"``: every token, an
      empty mask giving ME = 0.
    - Exact ME (``masking_effect`` over the update's ``sgd_step``) on ``n_candidates`` candidates drawn
      uniformly without replacement (generator seeded with ``candidate_seed``; None: all) from those of
      any set; first-order ME (``first_order_masking_effect``, the update's own kernel) on every candidate.
    - ``exact_norms=True``: kernels and steps inside ``float64_norms(batch.model)`` (without it the exact ME
      of small masks is float32 rounding noise); the batch's own tensors (h, π, log π, c) are the sampled
      policy's, computed before.
    """
    lr = _check_lr(lr)
    updates = _check_updates(updates)
    _check_n_candidates(n_candidates)
    if candidate_filter not in CANDIDATE_FILTERS:
        raise ValueError(
            f"unknown candidate_filter {candidate_filter!r}; valid: {', '.join(CANDIDATE_FILTERS)}"
        )
    if not isinstance(batch, LMBatch):
        raise TypeError(f"`batch` must be an LMBatch (sample_lm_batch), got {type(batch).__name__}")
    with float64_norms(batch.model) if exact_norms else nullcontext():
        return _measure_lm(
            batch, lr=lr, same_sign=same_sign, low_conf=low_conf, n_candidates=n_candidates,
            candidate_seed=candidate_seed, updates=updates, candidate_filter=candidate_filter,
            active_only=active_only, mask_seed=mask_seed, progress=progress,
        )  # fmt: skip


def _measure_lm(
    batch: LMBatch,
    *,
    lr: float,
    same_sign: bool,
    low_conf: float,
    n_candidates: int | None,
    candidate_seed: int,
    updates: tuple[str, ...],
    candidate_filter: str,
    active_only: bool,
    mask_seed: int,
    progress: Callable[[str], Any] | None,
) -> LMMeasurement:
    say = progress or (lambda _m: None)
    seconds: dict[str, float] = {}
    n = batch.n_tokens
    coef = batch.coef

    t0 = time.perf_counter()
    masks = lm_mask_sets(batch, same_sign=same_sign, low_conf=low_conf, active_only=active_only,
                         mask_seed=mask_seed)  # fmt: skip
    active = coef != 0
    nonempty = {s: (masks[s] & active[None, :]).any(dim=1) for s in MASK_SETS}
    if candidate_filter == "coupled":
        computed = {s: nonempty["both"].clone() for s in MASK_SETS}
    elif candidate_filter == "nonempty":
        computed = {s: nonempty[s].clone() for s in MASK_SETS}
    else:
        computed = {s: torch.ones(n, dtype=torch.bool) for s in MASK_SETS}
    pool = torch.nonzero(torch.stack(list(computed.values())).any(dim=0)).flatten()
    exact = torch.zeros(n, dtype=torch.bool)
    if n_candidates is None or n_candidates >= pool.numel():
        exact[pool] = True
    else:
        gen = torch.Generator().manual_seed(_CANDIDATE_OFFSET + int(candidate_seed))
        exact[pool[torch.randperm(pool.numel(), generator=gen)[:n_candidates]]] = True
    seconds["masks"] = time.perf_counter() - t0

    # eq. (5) over each update's parameters, and eq. (7)'s proxy
    kernels: dict[str, Tensor] = {}
    t0 = time.perf_counter()
    if "full" in updates:
        say(f"scores of the full update ({n} tokens)")
        full_scores = update_scores(batch, "full")
        kernels["full"] = coupling_kernel(full_scores)
        if "head_tied" in updates:
            a, b = _embed_columns(batch)
            kernels["head_tied"] = coupling_kernel(full_scores[:, a:b])
        del full_scores
    if "head_tied" in updates and "head_tied" not in kernels:
        kernels["head_tied"] = coupling_kernel(update_scores(batch, "head_tied"))
    if "head_untied" in updates:
        kernels["head_untied"] = coupling_kernel(update_scores(batch, "head_untied"))
    kernels["proxy"] = proxy_kernel(batch.hidden, batch.probs, batch.tokens, temperature=batch.temperature)
    seconds["kernels"] = time.perf_counter() - t0

    delta: dict[str, Tensor] = {}
    me: dict[str, dict[str, Tensor]] = {}
    me_first: dict[str, dict[str, Tensor]] = {}
    n_params: dict[str, int] = {}
    for u in updates:
        t0 = time.perf_counter()
        logp_of, params = batch.logp_fn(u)
        n_params[u] = sum(p.numel() for p in params)
        with torch.no_grad():
            base = logp_of(params).detach()
        step = sgd_step(logp_of, params, lr)
        delta[u] = step(coef) - base
        delta[f"{u}_first"] = first_order_delta(kernels[u], coef, lr).total
        rows, cands, owner = [], [], []
        me[u], me_first[u] = {}, {}
        for s in MASK_SETS:
            out = torch.full((n,), math.nan, dtype=coef.dtype)
            out_first = torch.full((n,), math.nan, dtype=coef.dtype)
            run_first = torch.nonzero(computed[s] & nonempty[s]).flatten()
            if run_first.numel():
                # Sec. 2's Masking Effect to first order, lr·Σ_{k∈M_j} c_k K_jk
                out_first[run_first] = first_order_masking_effect(
                    kernels[u], coef, masks[s][run_first], lr, candidates=run_first
                )
            out_first[computed[s] & ~nonempty[s]] = 0.0
            out[exact & computed[s] & ~nonempty[s]] = 0.0
            run = torch.nonzero(exact & computed[s] & nonempty[s]).flatten()
            rows.append(masks[s][run])
            cands.append(run)
            owner += [s] * run.numel()
            me[u][s], me_first[u][s] = out, out_first
        cand = torch.cat(cands)
        say(f"exact masking effects, {u} update ({cand.numel()} masked steps)")
        if cand.numel():
            # Sec. 2: ME_j = log π_θ'(y_j) − log π_θ'_{−M_j}(y_j), all four sets in one call
            values = masking_effect(step, coef, torch.cat(rows), candidates=cand)
            for r, s in enumerate(owner):
                me[u][s][int(cand[r])] = values[r]
        seconds[f"steps_{u}"] = time.perf_counter() - t0
    delta["proxy_first"] = first_order_delta(kernels["proxy"], coef, lr).total
    return LMMeasurement(
        batch=batch, lr=lr, same_sign=bool(same_sign), low_conf=float(low_conf),
        candidate_filter=candidate_filter, active_only=bool(active_only), updates=updates, masks=masks,
        nonempty=nonempty, computed=computed, exact=exact, me=me, me_first=me_first, kernels=kernels,
        delta=delta, n_params=n_params, seconds=seconds,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Table 1 on the LM: the summaries


def summarise_lm(
    m: LMMeasurement,
    *,
    update: str = "full",
    candidates: str = "all",
    orient_by_sign: bool = False,
    ties: str = "count",
) -> dict[str, dict[str, float]]:
    """Table 1 of one update from an ``LMMeasurement``: {set: row}, as ``instruments.coupling.summarise``.

    ``candidates`` / ``orient_by_sign`` select and orient the candidates (``candidate_mask``: all tokens, or
    those of rollouts with A > 0 / A < 0; oriented ME·sign(A_j) drops A = 0); ``ties="count"``: ME = 0
    exactly counts as not boosted (``boost_stats``), ``"drop"``: left out. A row: ``n`` exact candidates,
    ``n_boosted``, ``boost_rate``, ``mean_boost``; on the same candidates the first-order
    ``first_order_boost_rate``, ``first_order_mean_boost``, ``first_order_gap`` (first-order − exact Boost
    Rate), ``first_order_sign_agreement`` (of the ME signs) and ``first_order_rel_err`` (‖ME₁ − ME‖/‖ME‖);
    on every candidate ``n_all``, ``n_all_boosted``, ``all_first_order_boost_rate``,
    ``all_first_order_mean_boost``; ``tie_rate`` (exact ME = 0) and ``mean_mask_size`` (tokens with c ≠ 0).
    """
    if update not in m.me:
        raise ValueError(f"update {update!r} was not measured; measured: {', '.join(m.me)}")
    _check_conventions(candidates, ties, m.candidate_filter)
    b = m.batch
    sel = candidate_mask(b, candidates, orient_by_sign)  # type: ignore[arg-type]
    sign = torch.sign(b.adv_tok) if orient_by_sign else torch.ones_like(b.adv_tok)
    active = b.coef != 0
    out: dict[str, dict[str, float]] = {}
    for s in MASK_SETS:
        keep = sel & m.exact & m.computed[s]
        zero = keep & (m.me[update][s] == 0)
        tie_rate = float(zero.sum()) / float(keep.sum()) if bool(keep.any()) else math.nan
        keep_all = sel & m.computed[s]
        if ties == "drop":
            keep = keep & ~zero
            keep_all = keep_all & (m.me_first[update][s] != 0)
        # Sec. 2 / Table 1: ME_j, oriented ME_j·sign(A_j) when orient_by_sign
        me = (m.me[update][s] * sign)[keep]
        fo = (m.me_first[update][s] * sign)[keep]
        fo_all = (m.me_first[update][s] * sign)[keep_all]
        row: dict[str, float] = {
            "n": int(keep.sum()),
            "n_boosted": int((me > 0).sum()),
            "tie_rate": tie_rate,
            "mean_mask_size": _frac((m.masks[s][keep] & active[None, :]).sum(1)),
            "n_all": int(keep_all.sum()),
            "n_all_boosted": int((fo_all > 0).sum()),
        }
        nan_keys = ("boost_rate", "mean_boost", "first_order_boost_rate", "first_order_mean_boost",
                    "first_order_gap", "first_order_sign_agreement", "first_order_rel_err")  # fmt: skip
        if me.numel():
            st, st1 = boost_stats(me), boost_stats(fo)
            norm = float(torch.linalg.norm(me))
            row.update(
                boost_rate=st.boost_rate, mean_boost=st.mean_boost, first_order_boost_rate=st1.boost_rate,
                first_order_mean_boost=st1.mean_boost, first_order_gap=st1.boost_rate - st.boost_rate,
                first_order_sign_agreement=_agree(me, fo),
                first_order_rel_err=float(torch.linalg.norm(fo - me)) / norm if norm > 0 else math.nan,
            )  # fmt: skip
        else:
            row.update(dict.fromkeys(nan_keys, math.nan))
        if fo_all.numel():
            st_all = boost_stats(fo_all)
            row.update(
                all_first_order_boost_rate=st_all.boost_rate, all_first_order_mean_boost=st_all.mean_boost
            )
        else:
            row.update(all_first_order_boost_rate=math.nan, all_first_order_mean_boost=math.nan)
        out[s] = row
    return out


def _offdiag_cosine(a: Tensor, b: Tensor) -> float:
    off = ~torch.eye(a.shape[0], dtype=torch.bool)
    x, y = a[off], b[off]
    den = float(torch.linalg.norm(x) * torch.linalg.norm(y))
    return float((x * y).sum()) / den if den > 0 else math.nan


#: The kernel pairs compared, (a, b): a on b's scale.
KERNEL_PAIRS = (
    ("proxy", "head_untied"),
    ("proxy", "head_tied"),
    ("head_untied", "head_tied"),
    ("proxy", "full"),
    ("head_tied", "full"),
    ("head_untied", "full"),
)


def batch_summary(m: LMMeasurement) -> dict[str, Any]:
    """What one measurement says beyond Table 1, as plain numbers.

    - ``kernel_distance``: {"a_vs_b": {max_rel (``max_rel_diff(K_a, K_b)``), fro_rel (‖K_a − K_b‖_F/‖K_b‖_F),
      offdiag_cosine (cosine of their off-diagonal entries)}} for ``KERNEL_PAIRS`` measured;
    - ``sign_agreement``: the fraction of the N tokens whose Δ log π has the same sign under two updates
      (App. D.1 / Fig. 10): "head_tied_vs_full", "head_untied_vs_full" (actual steps), "proxy_first_vs_full",
      "proxy_first_vs_head_tied", "proxy_first_vs_head_untied" (eq. 9's prediction vs the actual step) and
      "<update>_first_vs_<update>" (each update's own first-order prediction vs its step);
    - ``first_order_error``: {update: ‖Δ₁ − Δ‖/‖Δ‖}; ``median_abs_delta``: {update: median |Δ log π|};
    - ``coupling_mass``: {kernel: ``coupling_mass(K, c, y, π(y), low_conf)``}; ``pair_share``: the share of
      the ordered pairs j ≠ k in each class (what the mass fractions would be if every pair weighed alike);
    - token counts, ``n_params``, ``seconds``.
    """
    b, d, k = m.batch, m.delta, m.kernels
    dist = {}
    for a, c in KERNEL_PAIRS:
        if a in k and c in k:
            dist[f"{a}_vs_{c}"] = {
                "max_rel": max_rel_diff(k[a], k[c]),
                "fro_rel": float(torch.linalg.norm(k[a] - k[c]) / torch.linalg.norm(k[c])),
                "offdiag_cosine": _offdiag_cosine(k[a], k[c]),
            }
    sa: dict[str, float] = {}
    for u in ("head_tied", "head_untied"):
        if u in d and "full" in d:
            sa[f"{u}_vs_full"] = _agree(d[u], d["full"])
    for u in LM_UPDATES:
        if u in d:
            sa[f"proxy_first_vs_{u}"] = _agree(d["proxy_first"], d[u])
    for u in LM_UPDATES:
        if u in d:
            sa[f"{u}_first_vs_{u}"] = _agree(d[f"{u}_first"], d[u])
    same = b.tokens[:, None] == b.tokens[None, :]
    low = b.probs_taken < m.low_conf
    both_low = low[:, None] & low[None, :]
    off = ~torch.eye(b.n_tokens, dtype=torch.bool)
    return {
        "n_tokens": b.n_tokens,
        "n_active": int((b.coef != 0).sum()),
        "n_low_confidence": int((b.probs_taken < m.low_conf).sum()),
        "n_candidates": {s: int(m.computed[s].sum()) for s in MASK_SETS},
        "n_exact": int(m.exact.sum()),
        "n_params": dict(m.n_params),
        "kernel_distance": dist,
        "sign_agreement": sa,
        "first_order_error": {
            u: float(torch.linalg.norm(d[f"{u}_first"] - d[u]) / torch.linalg.norm(d[u])) for u in m.updates
        },
        "median_abs_delta": {u: float(d[u].abs().median()) for u in m.updates},
        "coupling_mass": {
            name: coupling_mass(kern, b.coef, b.tokens, b.probs_taken, m.low_conf) for name, kern in k.items()
        },
        "pair_share": {
            "same_token": _frac(same[off]),
            "both_low_confidence": _frac(both_low[off]),
            "same_token_low_confidence": _frac((same & both_low)[off]),
        },
        "seconds": dict(m.seconds),
    }


def _pool_rows(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Table 1 rows of several batches pooled over their candidates (counts summed, means weighted)."""
    n = sum(r["n"] for r in rows)
    n_all = sum(r["n_all"] for r in rows)

    def wmean(key: str, weight: str, total: int) -> float:
        vals = [(r[key], r[weight]) for r in rows if r[weight] and not math.isnan(r[key])]
        return sum(v * w for v, w in vals) / total if total and vals else math.nan

    out = {
        "n": n,
        "n_boosted": sum(r["n_boosted"] for r in rows),
        "boost_rate": sum(r["n_boosted"] for r in rows) / n if n else math.nan,
        "n_all": n_all,
        "n_all_boosted": sum(r["n_all_boosted"] for r in rows),
        "all_first_order_boost_rate": sum(r["n_all_boosted"] for r in rows) / n_all if n_all else math.nan,
        "all_first_order_mean_boost": wmean("all_first_order_mean_boost", "n_all", n_all),
    }
    for key in ("mean_boost", "first_order_boost_rate", "first_order_mean_boost", "first_order_sign_agreement",
                "tie_rate", "mean_mask_size"):  # fmt: skip
        out[key] = wmean(key, "n", n)
    out["first_order_gap"] = out["first_order_boost_rate"] - out["boost_rate"] if n else math.nan
    out["se_pp"] = 100.0 * math.sqrt(out["boost_rate"] * (1 - out["boost_rate"]) / n) if n else math.nan
    return out


def _mean_dicts(dicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The key-wise mean of equally shaped nested dicts of floats (NaN-free entries)."""
    out: dict[str, Any] = {}
    for key, v in dicts[0].items():
        if isinstance(v, dict):
            out[key] = _mean_dicts([d[key] for d in dicts])
        else:
            vals = [float(d[key]) for d in dicts if not math.isnan(float(d[key]))]
            out[key] = sum(vals) / len(vals) if vals else math.nan
    return out


def lm_table1(
    folder: str | Path,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    lr: float = DEFAULT_LR,
    same_sign: bool = False,
    low_conf: float = 0.5,
    candidates: str = "all",
    orient_by_sign: bool = False,
    ties: str = "count",
    candidate_filter: str = "coupled",
    active_only: bool = True,
    n_candidates: int | None = N_CANDIDATES,
    updates: Iterable[str] = LM_UPDATES,
    exact_norms: bool = True,
    task: str = "template_decoy",
    reward: str = "exact_match",
    num_prompts: int = 2,
    group_size: int = 8,
    max_new_tokens: int = 40,
    temperature: float = 1.0,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Table 1 of arXiv 2605.08666 on a causal LM under the full, tied-head and untied-head SGD updates.

    One batch per seed (``sample_lm_batch(..., seed=seed)``: ``num_prompts`` × ``group_size`` completions
    of ``task``), one ``measure_lm`` each (``candidate_seed = mask_seed = seed``), ``summarise_lm`` per
    update, the rows pooled over the seeds' candidates. ``folder``: a saved model folder (``load_policy``;
    ``experiments.coupling_lm.default_model()`` builds the power study's template_decoy warm start).

    Conventions (``instruments.coupling.table1``'s names and defaults; the paper leaves them open):
    ``same_sign=False``, ``low_conf=0.5`` (strict), ``candidates="all"``, ``orient_by_sign=False`` (ME > 0 is
    a boost, as the paper defines it), ``ties="count"``, ``candidate_filter="coupled"``; and the LM's own:
    ``active_only=True`` (``lm_mask_sets``), ``lr=DEFAULT_LR`` (plain SGD, App. D.2), ``n_candidates``,
    ``exact_norms=True`` (``float64_norms``).

    Returns a JSON-serialisable dict (NaN where undefined): ``table`` {update: {set: pooled row}}
    (``summarise_lm``'s keys, plus ``se_pp``, the binomial standard error of the Boost Rate in points),
    ``sign_agreement``, ``kernel_distance``, ``coupling_mass``, ``pair_share``, ``first_order_error``, ``median_abs_delta``
    (seed means of ``batch_summary``'s), ``per_seed`` (each seed's rows and ``batch_summary``), ``n_tokens``,
    ``n_active``, ``n_params``, ``conventions``, ``paper_boost_rate``, ``paper_distance_pp`` {update: mean
    |Boost Rate − paper's| over the four sets}, ``tied``, ``model``, ``seconds``.
    """
    lr = _check_lr(lr)
    updates = _check_updates(updates)
    _check_conventions(candidates, ties, candidate_filter)
    _check_n_candidates(n_candidates)
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"`seeds` must be a non-empty sequence of ints, got {seeds!r}")
    say = progress or (lambda _m: None)
    t_start = time.perf_counter()
    path = Path(folder)
    model, tokenizer = load_policy(path)
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        t0 = time.perf_counter()
        batch = sample_lm_batch(
            model, tokenizer, task=task, reward=reward, num_prompts=num_prompts, group_size=group_size, seed=seed,
            max_new_tokens=max_new_tokens, temperature=temperature,
        )  # fmt: skip
        say(f"seed {seed}: {batch.n_tokens} tokens")
        m = measure_lm(
            batch, lr=lr, same_sign=same_sign, low_conf=low_conf, n_candidates=n_candidates,
            candidate_seed=seed, updates=updates, candidate_filter=candidate_filter, active_only=active_only,
            mask_seed=seed, exact_norms=exact_norms, progress=progress,
        )  # fmt: skip
        rows = {
            u: summarise_lm(m, update=u, candidates=candidates, orient_by_sign=orient_by_sign, ties=ties)
            for u in updates
        }
        summary = batch_summary(m)
        summary["seconds"]["total"] = time.perf_counter() - t0
        per_seed.append({"seed": seed, "rewards": batch.rewards.tolist(), "sets": rows, **summary})
    table = {u: {s: _pool_rows([p["sets"][u][s] for p in per_seed]) for s in MASK_SETS} for u in updates}
    n_tokens = sum(p["n_tokens"] for p in per_seed)

    def token_mean(key: str) -> dict[str, float]:
        keys = per_seed[0][key]
        return {k: sum(p[key][k] * p["n_tokens"] for p in per_seed) / n_tokens for k in keys}

    return {
        "model": str(path),
        "tied": is_tied(model),
        "task": task,
        "reward": reward,
        "seeds": seeds,
        "lr": lr,
        "conventions": {
            "same_sign": bool(same_sign),
            "low_conf": float(low_conf),
            "candidates": candidates,
            "orient_by_sign": bool(orient_by_sign),
            "ties": ties,
            "candidate_filter": candidate_filter,
            "active_only": bool(active_only),
            "n_candidates": n_candidates,
            "exact_norms": bool(exact_norms),
            "num_prompts": num_prompts,
            "group_size": group_size,
            "max_new_tokens": max_new_tokens,
            "temperature": float(temperature),
        },
        "updates": list(updates),
        "n_tokens": n_tokens,
        "n_active": sum(p["n_active"] for p in per_seed),
        "n_params": per_seed[0]["n_params"],
        "table": table,
        "paper_boost_rate": PAPER_BOOST_RATE,
        "paper_distance_pp": {
            u: paper_distance({s: table[u][s]["boost_rate"] for s in MASK_SETS}, PAPER_COLUMN[u])
            for u in updates
        },
        "sign_agreement": token_mean("sign_agreement"),
        "kernel_distance": _mean_dicts([p["kernel_distance"] for p in per_seed]),
        "coupling_mass": _mean_dicts([p["coupling_mass"] for p in per_seed]),
        "pair_share": _mean_dicts([p["pair_share"] for p in per_seed]),
        "first_order_error": _mean_dicts([p["first_order_error"] for p in per_seed]),
        "median_abs_delta": _mean_dicts([p["median_abs_delta"] for p in per_seed]),
        "per_seed": per_seed,
        "seconds": time.perf_counter() - t_start,
    }


# ------------------------------------------------------------------------------------------------
# the report section

UPDATE_LABEL = {"full": "Full", "head_tied": "LM head (tied)", "head_untied": "LM head (untied)"}
SHORT_LABEL = {"full": "full", "head_tied": "tied head", "head_untied": "untied head"}


def _pct(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{100.0 * x:.2f}%" if 0 < abs(x) < 0.01 else f"{100.0 * x:.1f}%"


def markdown_lm_table1(result: dict[str, Any]) -> str:
    """A report section of ``lm_table1``'s result: Table 1 per update, the kernels, the signs, the mass."""
    t, conv = result["table"], result["conventions"]
    updates = result["updates"]
    lines = [
        "## Table 1 on the tiny Qwen3: Masking Effect under the full, tied-head and untied-head updates",
        "",
        f"Model `{result['model']}` ({'tied' if result['tied'] else 'untied'} embedding/LM head), task "
        f"`{result['task']}`, seeds {result['seeds']}: {result['n_tokens']} completion tokens "
        f"({result['n_active']} with c ≠ 0), one plain SGD step at lr = {result['lr']:g} in float64. "
        "Parameters trained: "
        + ", ".join(f"{UPDATE_LABEL[u]} {result['n_params'][u]:,}" for u in updates)
        + ".",
        "",
        "Conventions (as `instruments.coupling.table1`): "
        + ", ".join(
            f"{k}={v}" for k, v in conv.items() if k not in ("num_prompts", "group_size", "max_new_tokens")
        )
        + ". Boost Rate: exact ME on a random subsample of candidates (n); first-order: lr·Σ_{k∈M} c_k K_jk from "
        "the update's own kernel on the same candidates, and on every candidate (n_all); paper: Table 1's "
        "Boost Rate (LM-head column for both head updates).",
        "",
    ]
    for u in updates:
        ref = PAPER_BOOST_RATE[PAPER_COLUMN[u]]
        rows = [
            {
                "mask": s,
                "n": r["n"],
                "boost_rate": r["boost_rate"],
                "se_pp": r["se_pp"],
                "paper_br": ref[s],
                "mean_boost": r["mean_boost"],
                "first_order_boost_rate": r["first_order_boost_rate"],
                "fo_sign_agree": r["first_order_sign_agreement"],
                "n_all": r["n_all"],
                "all_first_order_boost_rate": r["all_first_order_boost_rate"],
                "tie_rate": r["tie_rate"],
                "mask_size": r["mean_mask_size"],
            }
            for s, r in t[u].items()
        ]
        lines += [f"**{UPDATE_LABEL[u]}** ({u}; rates in %)", "", _format(rows), ""]
    kd = result["kernel_distance"]
    if kd:
        rows = [{"kernels": k, **v} for k, v in kd.items()]
        lines += [
            "**Kernels** (a_vs_b: a on b's scale; seed means; offdiag_cosine in %)",
            "",
            _format(rows, sci=("max_rel", "fro_rel")),
            "",
        ]
    sa = result["sign_agreement"]
    lines += ["**Sign agreement of Δ log π** (fraction of all tokens; in %)", "",
              _format([{"pair": k, "agreement": v} for k, v in sa.items()]), ""]  # fmt: skip
    cm = result["coupling_mass"]
    mass_keys = ("same_token", "both_low_confidence", "same_token_low_confidence")
    lines += [
        "**Coupling mass** Σ_{j≠k}|c_k K_jk| by pair class (fractions in %, seed means)",
        "",
        _format(
            [{"kernel": k, **{c: v[c] for c in mass_keys}} for k, v in cm.items()]
            + [{"kernel": "(share of the pairs)", **{c: result["pair_share"][c] for c in mass_keys}}]
        ),
        "",
        *_sentences(result),
    ]
    return "\n".join(lines)


_PCT_KEYS = frozenset({"boost_rate", "paper_br", "first_order_boost_rate", "fo_sign_agree",
                       "all_first_order_boost_rate", "tie_rate", "agreement", "offdiag_cosine",
                       "same_token", "both_low_confidence", "same_token_low_confidence"})  # fmt: skip


def _format(rows: Sequence[dict[str, Any]], sci: Sequence[str] = ()) -> str:
    """``format_table`` with this section's percent and scientific columns."""
    out = []
    for r in rows:
        row = {}
        for k, v in r.items():
            if isinstance(v, float) and not math.isnan(v):
                if k in _PCT_KEYS:
                    v = f"{100.0 * v:.2f}" if 0 < abs(v) < 0.01 else f"{100.0 * v:.1f}"
                elif k in sci or k == "mean_boost":
                    v = f"{v:.2e}"
                elif k == "se_pp":
                    v = f"±{v:.1f}"
            row[k] = v
        out.append(row)
    return format_table(out)


def _sentences(result: dict[str, Any]) -> list[str]:
    """3-6 sentences on what the numbers show, every claim computed from them."""
    t, updates = result["table"], result["updates"]
    br = {u: {s: t[u][s]["boost_rate"] for s in MASK_SETS} for u in updates}
    labels = " / ".join(SHORT_LABEL[u] for u in updates)
    out = [
        'Masking the same-token, low-confidence tokens ("both") boosts the candidate in '
        + " / ".join(_pct(br[u]["both"]) for u in updates)
        + f" of the exact candidates ({labels}; n = "
        + " / ".join(str(t[u]["both"]["n"]) for u in updates)
        + f"), against the paper's {_pct(PAPER_BOOST_RATE['full']['both'])} (Full) and "
        f"{_pct(PAPER_BOOST_RATE['head']['both'])} (LM-head); random masks give "
        + " / ".join(_pct(br[u]["random"]) for u in updates)
        + " (paper ≈ 50%)."
    ]
    order = ("both", "same_token", "random", "low_confidence")
    holds = [u for u in updates if all(br[u][a] > br[u][b] for a, b in itertools.pairwise(order))]
    fails = [u for u in updates if u not in holds]
    if not fails:
        out.append(
            "The paper's ordering (both > same token > random > low confidence) holds under every update."
        )
    elif not holds:
        out.append("The paper's ordering (both > same token > random > low confidence) holds under none of the "
                   "updates: " + "; ".join(f"{UPDATE_LABEL[u]} " + " / ".join(_pct(br[u][s]) for s in order)
                                           for u in updates) + " (in that order).")  # fmt: skip
    else:
        out.append("The paper's ordering (both > same token > random > low confidence) holds under "
                   + ", ".join(UPDATE_LABEL[u] for u in holds) + " but not under "
                   + ", ".join(f"{UPDATE_LABEL[u]} (" + " / ".join(_pct(br[u][s]) for s in order) + ")"
                               for u in fails) + ".")  # fmt: skip

    # how much of that ordering the sample can resolve: the SE of a rate over n candidates, √(p(1 − p)/n)
    def se_pp(u: str, s: str) -> float:
        p, n = br[u][s], t[u][s]["n"]
        return 100.0 * math.sqrt(p * (1.0 - p) / n) if n else math.nan

    lo_minus_random = "; ".join(
        f"{UPDATE_LABEL[u]} {100.0 * (br[u]['low_confidence'] - br[u]['random']):+.1f} ± "
        f"{math.hypot(se_pp(u, 'low_confidence'), se_pp(u, 'random')):.1f}"
        for u in updates
    )
    out.append(
        "Each rate is an estimate over its n candidates (SE about ±"
        + f"{max(se_pp(u, s) for u in updates for s in MASK_SETS):.1f} points at most), so only differences of "
        "more than about twice their SE are resolved; the rows same token, low confidence and both are not "
        f"told apart here, while low confidence − random is {lo_minus_random} points (the paper has it "
        "below random)."
    )
    gaps = [
        abs(t[u][s]["first_order_gap"])
        for u in updates
        for s in MASK_SETS
        if not math.isnan(t[u][s]["first_order_gap"])
    ]
    agree = [
        t[u][s]["first_order_sign_agreement"]
        for u in updates
        for s in MASK_SETS
        if not math.isnan(t[u][s]["first_order_sign_agreement"])
    ]
    fe = result["first_order_error"]
    if gaps:
        verdict = (
            "so at this step size the table is a statement about the kernels"
            if max(gaps) <= 0.05 and min(agree) >= 0.95
            else "so the exact and first-order tables differ at this step size"
        )
        out.append(
            f"Each update's own kernel predicts the exact Boost Rates to within {100 * max(gaps):.1f} points on the "
            f"same candidates (the signs of ME agree on "
            + ("all" if min(agree) == 1.0 else f"at least {100 * min(agree):.1f}%")
            + " of them; first-order Δ log π off by "
            + " / ".join(f"{100 * fe[u]:.1f}%" for u in updates)
            + f" in norm), {verdict}."
        )
    kd, sa = result["kernel_distance"], result["sign_agreement"]
    if "proxy_vs_head_untied" in kd and "proxy_vs_head_tied" in kd:
        out.append(
            f"The untied head's exact kernel is the paper's proxy (eq. 7) to {kd['proxy_vs_head_untied']['max_rel']:.0e} "
            f"(max relative), while the tied head's differs from it by {kd['proxy_vs_head_tied']['max_rel']:.2f} on the "
            f"tied kernel's scale (off-diagonal cosine {kd['proxy_vs_head_tied']['offdiag_cosine']:.2f}): on a tied model, "
            'as the paper\'s Qwen3-1.7B-Base and Qwen3-4B-Base are, "LM-head-only" names two different updates.'
        )
    if "head_tied_vs_full" in sa and "head_untied_vs_full" in sa:
        out.append(
            f"Their Δ log π agree in sign with the full update's on {_pct(sa['head_tied_vs_full'])} (tied) and "
            f"{_pct(sa['head_untied_vs_full'])} (untied) of tokens, the proxy's first-order prediction on "
            f"{_pct(sa['proxy_first_vs_full'])} (App. D.1 reports the proxy-vs-full agreement on the paper's models)."
        )
    cm, ps = result["coupling_mass"], result["pair_share"]
    if "full" in cm:
        out.append(
            f"Same-token pairs, {_pct(ps['same_token'])} of the pairs, carry {_pct(cm['full']['same_token'])} of "
            f"the full kernel's coupling mass ({_pct(cm['proxy']['same_token'])} of the proxy's), and same-token "
            f"pairs of two low-confidence tokens, {_pct(ps['same_token_low_confidence'])} of the pairs, carry "
            f"{_pct(cm['full']['same_token_low_confidence'])} ({_pct(cm['proxy']['same_token_low_confidence'])})."
        )
    return [" ".join(out)]


__all__ = [
    "DEFAULT_LR",
    "DEFAULT_SEEDS",
    "EMBED_NAME",
    "KERNELS",
    "LM_UPDATES",
    "N_CANDIDATES",
    "LMBatch",
    "LMMeasurement",
    "batch_summary",
    "is_tied",
    "lm_mask_sets",
    "lm_table1",
    "load_policy",
    "markdown_lm_table1",
    "max_rel_diff",
    "measure_lm",
    "sample_lm_batch",
    "summarise_lm",
    "update_scores",
]

"""DFPO and the eq. (86) control as verl policy losses (verl 0.9.1's ``register_policy_loss``).

Importing this module registers three policy losses in verl's registry
(``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``), each a thin adapter around
``cancellation.compute_loss``: the math is ``cancellation/``'s, not a copy.

| verl ``loss_mode`` | ``cancellation`` objective |
|---|---|
| ``dfpo_min_replace`` | ``dfpo``, ``transform="min_replace"``, the paper's estimator |
| ``dfpo_orth_proj`` | ``dfpo``, ``transform="orth_proj"``, the paper's estimator |
| ``gspo_paper`` | ``gspo``, ``estimator="paper"``: the eq. (86) control (DFPO without a transform) |

verl calls a policy loss as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights)``: tensors (B, T), no group ids. The group transforms need them, so the
group id reaches the loss through a context variable that :func:`groups` sets around the call. In a
verl run :func:`install` (done on import) wraps verl's ``ppo_loss`` (``verl.workers.utils.losses``),
whose micro-batch ``data`` still carries verl's ``uid`` (the prompt id ``ray_trainer`` gives every
completion of a group), so that each policy-loss call sees the ``uid`` of its own rows. A call with no
group ids set raises instead of treating the batch as one group.

Exact: the loss of one call equals ``cancellation``'s on the same rows whenever every group of the call
is whole (its ``config.rollout_n`` rows all present; checked, else a ``ValueError`` names the verl
settings that keep groups whole), and the micro-batch losses then add up to the mini-batch's, because
verl's global counts (``config.global_batch_info``) are passed as ``cancellation``'s ``token_count`` /
``seq_count``. docs/plugins.md (the verl section) says which verl settings keep groups whole.

Run it in verl with ``VERL_USE_EXTERNAL_MODULES=scaledrun.verl_plugin`` (verl imports the module in every
process that imports verl, Ray workers included) and ``actor_rollout_ref.actor.policy_loss.loss_mode=
dfpo_min_replace`` (or another name above).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from cancellation import compute_loss

try:
    from verl.trainer.ppo.core_algos import register_policy_loss
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "scaledrun.verl_plugin needs verl 0.9.1 (`pip install -e '.[verl]'`, in a virtual environment of its "
        "own: docs/plugins.md, section verl)"
    ) from exc

#: verl ``loss_mode`` -> (``cancellation`` objective, its fixed parameters)
LOSSES: dict[str, tuple[str, dict[str, Any]]] = {
    "dfpo_min_replace": ("dfpo", {"transform": "min_replace", "estimator": "paper"}),
    "dfpo_orth_proj": ("dfpo", {"transform": "orth_proj", "estimator": "paper"}),
    "gspo_paper": ("gspo", {"estimator": "paper"}),
}

#: verl's ``loss_agg_mode`` values this adapter maps onto ``cancellation.aggregation``
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

#: the verl settings that keep every group in one policy-loss call (quoted by the errors)
WHOLE_GROUP_SETTINGS = (
    "trainer.balance_batch=False, actor_rollout_ref.actor.shuffle=False, "
    "actor_rollout_ref.actor.use_dynamic_bsz=False, actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu "
    "a multiple of actor_rollout_ref.rollout.n, and actor_rollout_ref.actor.ppo_mini_batch_size a multiple "
    "of the data-parallel size"
)

_GROUPS: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "cancellation_verl_groups", default=None
)


def group_ids(uid: Sequence[Hashable]) -> Tensor:
    """(B,) int64 ids, one per distinct ``uid`` in order of first appearance (verl's uids are strings)."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uid], dtype=torch.long)


@contextlib.contextmanager
def groups(uid: Sequence[Hashable] | Tensor) -> Iterator[None]:
    """Within the block, the policy losses of this module read the rows' group ids from ``uid``.

    ``uid``: (B,) the prompt id of each row of the next policy-loss calls' tensors, in row order: verl's
    ``non_tensor_batch["uid"]`` (strings) or integer ids.
    """
    ids = uid.to(torch.long) if isinstance(uid, Tensor) else group_ids(list(uid))
    token = _GROUPS.set(ids)
    try:
        yield
    finally:
        _GROUPS.reset(token)


def _current_groups(batch: int, group_size: int | None) -> Tensor:
    ids = _GROUPS.get()
    if ids is None:
        raise ValueError(
            "the DFPO policy losses need each row's group id (verl's `uid`), which verl does not pass to a "
            "policy loss: run the call inside `scaledrun.verl_plugin.groups(uid)`, or in verl import "
            "scaledrun.verl_plugin in every worker (VERL_USE_EXTERNAL_MODULES=scaledrun.verl_plugin), which "
            "wraps verl's ppo_loss to do it (verl's distillation loss is not wrapped)"
        )
    if ids.shape != (batch,):
        raise ValueError(
            f"the group ids set by `groups` have shape {tuple(ids.shape)}, the batch has {batch} rows"
        )
    if group_size is not None:
        _, counts = torch.unique(ids, return_counts=True)
        if bool((counts != group_size).any()):
            raise ValueError(
                f"a group is split across policy-loss calls: this call has group sizes "
                f"{sorted(set(counts.tolist()))}, rollout.n is {group_size}; DFPO's group transform needs "
                f"whole groups in one call: set {WHOLE_GROUP_SETTINGS}"
            )
    return ids


def sequence_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """verl's (B, T) advantages as the (B,) one-per-completion vector the group transforms act on.

    verl's outcome estimators (GRPO, RLOO, ...) broadcast one scalar to every response token; a row whose
    unmasked tokens hold different values (a per-token estimator such as GAE) is refused. A row with no
    unmasked token gets 0 (it is outside the loss; ``cancellation`` keeps it out of its group's transform).
    """
    mask = response_mask.bool()
    first = mask.to(torch.long).argmax(-1, keepdim=True)  # the first unmasked token of each row
    adv = advantages.gather(-1, first)
    if not bool(torch.where(mask, advantages == adv, True).all()):
        raise ValueError(
            "the DFPO policy losses need one advantage per completion (an outcome estimator such as "
            "algorithm.adv_estimator=grpo), but a row's advantages differ between its tokens"
        )
    return torch.where(mask.any(-1), adv.squeeze(-1), torch.zeros_like(adv.squeeze(-1)))


def aggregation_counts(loss_agg_mode: str, response_mask: Tensor, config: Any) -> dict[str, Any]:
    """``cancellation.aggregate``'s keyword arguments that reproduce verl's ``agg_loss`` normalisation.

    verl divides a micro-batch's sum by the global token count (token-mean) or sequence count (seq-mean-*)
    of the mini-batch and multiplies by the data-parallel size (``config.global_batch_info``); without
    them it uses the micro-batch's own counts, counting only sequences with an unmasked token.
    """
    if loss_agg_mode not in AGG_MODES:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} is not supported here; valid: {', '.join(AGG_MODES)}"
        )
    info = dict(getattr(config, "global_batch_info", None) or {})
    dp_size = int(info.get("dp_size") or 1)
    if loss_agg_mode == "token-mean":
        total = info.get("batch_num_tokens")
        if total is None:
            if dp_size > 1:
                raise ValueError(
                    "(global) batch_num_tokens is required when dp_size > 1, as in verl's agg_loss"
                )
            return {}
        return {"token_count": float(total) / dp_size}
    total = info.get("global_batch_size")
    if total is None:
        if dp_size > 1:
            raise ValueError("global_batch_size is required when dp_size > 1, as in verl's agg_loss")
        out: dict[str, Any] = {"seq_count": float(response_mask.any(-1).sum())}
    else:
        out = {"seq_count": float(total) / dp_size}
    if loss_agg_mode == "seq-mean-token-sum-norm":
        factor = info.get("loss_scale_factor")
        out["norm_constant"] = float(response_mask.shape[-1] if factor is None else factor)
    return out


def clip_range(config: Any) -> tuple[float, float]:
    """(ε_low, ε_high) from verl's actor config, as verl's own ``gspo`` loss reads them."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return float(low), float(high)


def _make_loss(loss_mode: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    objective, fixed = LOSSES[loss_mode]

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "seq-mean-token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(
                f"policy loss {loss_mode!r} needs verl's actor config (the clip range, the counts)"
            )
        if rollout_is_weights is not None:
            raise ValueError(
                f"policy loss {loss_mode!r} does not take verl's rollout-correction weights: DFPO's weights "
                "are its own; turn off algorithm.rollout_correction"
            )
        group = _current_groups(log_prob.shape[0], getattr(config, "rollout_n", None))
        e_low, e_high = clip_range(config)
        loss, m = compute_loss(
            objective,
            log_prob,
            old_log_prob,
            sequence_advantages(advantages, response_mask),
            response_mask,
            group.to(log_prob.device),
            aggregation=loss_agg_mode,
            epsilon_low=e_low,
            epsilon_high=e_high,
            **fixed,
            **aggregation_counts(loss_agg_mode, response_mask, config),
        )
        mask = response_mask.to(log_prob.dtype)
        ppo_kl = float(((old_log_prob - log_prob.detach()) * mask).sum() / mask.sum())
        metrics = {
            "actor/pg_clipfrac": m["clip/frac"],
            "actor/pg_clipfrac_lower": m["clip/low_frac"],
            "actor/ppo_kl": ppo_kl,
            **{f"actor/cancellation/{k}": v for k, v in m.items()},
        }
        return loss, metrics

    policy_loss.__name__ = f"compute_policy_loss_{loss_mode}"
    policy_loss.__doc__ = f"verl policy loss {loss_mode!r}: cancellation's {objective!r} with {fixed}."
    return policy_loss


for _name in LOSSES:
    register_policy_loss(_name)(_make_loss(_name))


def _uids(value: Any) -> list[Hashable]:
    """A micro-batch's ``uid`` entry (a tensordict ``NonTensorStack``/``LinkedList``, a list or an array)."""
    if not isinstance(value, list) and hasattr(value, "tolist"):
        value = value.tolist()
    return list(value)


def with_groups(ppo_loss: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap verl's ``ppo_loss(config, model_output, data, dp_group=None)`` so its policy loss sees ``data["uid"]``."""
    if getattr(ppo_loss, "__cancellation_groups__", False):
        return ppo_loss

    @functools.wraps(ppo_loss)
    def wrapped(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
        if "uid" not in data.keys():
            raise ValueError(
                "verl's micro-batch has no `uid` (the prompt id of each row), so the DFPO policy losses "
                "cannot find its groups"
            )
        with groups(_uids(data["uid"])):
            return ppo_loss(config, model_output, data, dp_group=dp_group)

    wrapped.__cancellation_groups__ = True  # type: ignore[attr-defined]
    return wrapped


def install() -> None:
    """Wrap verl's ``ppo_loss`` with :func:`with_groups` (idempotent; done when this module is imported).

    ``verl.workers.engine_workers`` binds ``ppo_loss`` by name when it is imported and builds its loss from
    it in ``init_model``; both bindings are replaced, so import this module before the workers start
    (``VERL_USE_EXTERNAL_MODULES`` does: verl imports it at ``import verl``).
    """
    import verl.workers.utils.losses as losses

    losses.ppo_loss = with_groups(losses.ppo_loss)
    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None and hasattr(workers, "ppo_loss"):
        workers.ppo_loss = with_groups(workers.ppo_loss)


install()

__all__ = [
    "AGG_MODES",
    "LOSSES",
    "aggregation_counts",
    "clip_range",
    "group_ids",
    "groups",
    "install",
    "sequence_advantages",
    "with_groups",
]

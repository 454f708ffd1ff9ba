"""DFPO, GRPO-fix, GSPO's eq. 86 control, Advantage Reweighting and the cancellation meter inside TRL's GRPOTrainer.

A TRL user keeps their trainer, their vLLM, DeepSpeed/FSDP and PEFT settings, and changes two names::

    from scaledrun.trl_plugin import CancellationGRPOConfig, CancellationGRPOTrainer

    args = CancellationGRPOConfig(output_dir="out", objective="dfpo", transform="orth_proj", ...)
    trainer = CancellationGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

``CancellationGRPOConfig`` is a ``GRPOConfig`` with the objective fields of ``scaledrun.config.ObjectiveConfig``
(the same names, defaults, docstrings and checks as ``RunConfig``'s: they are declared once). Two of them
replace GRPOConfig fields of the same name: ``epsilon`` is grpo_symclip's symmetric ε here (TRL's lower clip is
``epsilon_low``) and ``epsilon_high`` is None by default (the objective's own default: 0.2 for grpo, GSPO's
4e-4 for gspo and dfpo). ``beta`` is TRL's field and means the same (the k3 KL coefficient).

``CancellationGRPOTrainer`` is a ``GRPOTrainer`` whose update is the one ``scaledrun.train.update`` runs:

1. after TRL generates and scores a generation batch, the advantages are ``cancellation.group_advantages`` of
   the weighted reward sum (``adv_scale``; truncated rows out of their group's statistics under
   ``mask_truncated_completions``), every row carries its group id, and the batch is kept in whole groups;
2. at the first micro-batch of every optimizer step, the current log-probs of the whole mini-batch (the
   ``gradient_accumulation_steps`` slices the step accumulates, whole groups) come from no-grad passes (or are
   the old ones, on-policy), and one ``cancellation.update.coefficients`` call gives its coefficients
   c = ∂J/∂logp (Advantage Reweighting applied to the advantages first; under Lopti one call per stage, every
   stage but the last an optimizer step of its own, taken here in one process, as ``scaledrun.train`` does);
3. each micro-batch backpropagates −W·Σ c·logp of its rows (W: processes, for DDP's mean), so the accumulated
   gradient is the mini-batch's exact gradient for every objective, transform and aggregation, whatever
   ``steps_per_generation`` and ``num_iterations`` are (``tests/scaledrun/test_trl_plugin.py``);
4. the objective's metrics (clip fractions, ratios, ``asym``) and the cancellation meter (``shared_residual``,
   ``group_shared_residual``, ``sequence_net_residual`` of the coefficients of each optimizer step) go to
   TRL's metrics under ``cancellation/``.

Settings under which TRL would compute another loss than the one configured (``loss_type``,
``importance_sampling_level``, ``delta``, the entropy mask and bonus, the off-policy mask, the MoE auxiliary
loss, Liger's fused loss, ...) are refused with an error that names them, and so is a layout that splits a
group between processes or optimizer steps (``check_layout``). docs/plugins.md says what stays exact.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from cancellation import METRIC_KEYS, group_advantages, reweight_advantages
from cancellation.diagnostics import prefix_event_keys
from cancellation.objectives import compute_loss as objective_loss
from cancellation.update import CancellationMeter, MeterTotals, coefficients, lopti_stage_advantages

from .config import ObjectiveConfig, class_field_docs

try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict
except ImportError as err:  # pragma: no cover - the bench extra installs it
    raise ImportError(
        "scaledrun.trl_plugin needs TRL >= 1.16: pip install -e '.[bench]' (or pip install 'trl>=1.16')"
    ) from err

#: The ``loss_type`` / ``importance_sampling_level`` with which TRL's own loss computes our grpo and gspo
#: objectives (token-mean: bnpo in one micro-batch, dapo under accumulation; seq-mean-token-mean: grpo).
TRL_LOSS_TYPE = {"grpo": "bnpo", "gspo": "grpo"}

#: The GRPOConfig settings that change TRL's loss, which this trainer replaces: each must stay at TRL's
#: default (read from ``GRPOConfig``); the message says what to set instead.
BYPASSED = {
    "loss_type": "the objective's `aggregation` decides the normalisation (token-mean is TRL's dapo, "
    "seq-mean-token-mean its grpo, seq-mean-token-sum-norm its dr_grpo)",
    "importance_sampling_level": "the `objective` decides it (gspo and dfpo: the sequence ratio)",
    "delta": "the objective's clip range is `epsilon_low` / `epsilon_high` (or `epsilon` for grpo_symclip)",
    "top_entropy_quantile": "the entropy mask is part of TRL's loss, not of the objectives here",
    "entropy_coef": "the entropy bonus is part of TRL's loss, not of the objectives here",
    "use_adaptive_entropy": "the entropy bonus is part of TRL's loss, not of the objectives here",
    "off_policy_mask_threshold": "the off-policy sequence mask is part of TRL's loss, not of the objectives here",
    "multi_objective_aggregation": "the advantages are cancellation.group_advantages of the weighted reward sum",
}


def _trl_default(name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(GRPOConfig)}[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def trl_loss_settings(cfg: ObjectiveConfig) -> dict[str, Any]:
    """The ``GRPOConfig`` settings with which TRL's *own* loss computes ``cfg``'s grpo or gspo objective at its
    default aggregation (``benchmarks/trainer_vs_trl.py`` and the parity tests): ``loss_type``,
    ``importance_sampling_level``, ``epsilon``, ``epsilon_high``, ``scale_rewards``. Other objectives have no
    TRL counterpart (a ValueError says so)."""
    if cfg.objective not in TRL_LOSS_TYPE or cfg.aggregation is not None:
        raise ValueError(
            f"TRL's own loss computes grpo (token-mean) and gspo (seq-mean-token-mean) only, not "
            f"objective={cfg.objective!r} with aggregation={cfg.aggregation!r}"
        )
    low, high = resolved_eps(cfg)
    return {
        "loss_type": TRL_LOSS_TYPE[cfg.objective],
        "importance_sampling_level": "sequence" if cfg.objective == "gspo" else "token",
        "epsilon": low,
        "epsilon_high": high,
        "scale_rewards": cfg.adv_scale,
    }


def resolved_eps(cfg: ObjectiveConfig) -> tuple[float, float]:
    """The clip range ``cfg``'s objective runs with, as TRL's (epsilon, epsilon_high): the values set, else the
    defaults of the objective's dataclass (``ObjectiveConfig.objective_param_values``, ``cancellation.params``:
    grpo 0.2/0.2, gspo and dfpo GSPO's 3e-4/4e-4); grpo_symclip's symmetric ε both ways; TRL's own (0.2, 0.2)
    for an objective registered without a clip range."""
    p = cfg.objective_param_values()
    if hasattr(p, "epsilon"):
        return p.epsilon, p.epsilon
    if hasattr(p, "epsilon_low"):
        return p.epsilon_low, p.epsilon_high
    return 0.2, 0.2


@dataclass
class CancellationGRPOConfig(ObjectiveConfig, GRPOConfig):
    """TRL's ``GRPOConfig`` with the objective fields of ``scaledrun.config.ObjectiveConfig`` (module docstring).

    ``scale_rewards`` follows ``adv_scale`` (set either; both set and different is an error). Settings that
    would change TRL's loss (``BYPASSED``) and layouts that split a group (``check_layout``) are refused here,
    when the config is built.
    """

    def __post_init__(self) -> None:
        try:
            self.validate_objective()
        except ValueError as err:
            if not str(err).startswith("config field `epsilon`="):
                raise
            # the field most TRL configs set: here it is only grpo_symclip's symmetric ε
            raise ValueError(
                f"{err} (in CancellationGRPOConfig `epsilon` is grpo_symclip's symmetric ε only; TRL's lower "
                "clip is `epsilon_low` here: drop `epsilon`, or set epsilon_low)"
            ) from None
        for name, instead in BYPASSED.items():
            if getattr(self, name) != _trl_default(name):
                raise ValueError(
                    f"CancellationGRPOConfig: `{name}`={getattr(self, name)!r} changes TRL's loss, which "
                    f"CancellationGRPOTrainer replaces: leave it at {_trl_default(name)!r} ({instead})"
                )
        if getattr(self, "use_liger_loss", False):  # TRL versions with Liger's fused GRPO loss
            raise ValueError(
                "CancellationGRPOConfig: `use_liger_loss`=True computes TRL's GRPO loss in a fused Liger kernel "
                "and bypasses the objective; set it False (Liger's layer kernels, `use_liger_kernel`, are fine)"
            )
        if self.beta != 0.0 and self.use_bias_correction_kl:
            raise ValueError(
                "CancellationGRPOConfig: `use_bias_correction_kl`=True weights TRL's KL term by the ratio; the "
                "objectives here use the plain k3 estimator: set use_bias_correction_kl=False (or beta=0.0)"
            )
        scale = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)  # type: ignore[arg-type]
        if scale != _trl_default("scale_rewards") and scale != self.adv_scale:
            raise ValueError(
                f"CancellationGRPOConfig: `scale_rewards`={self.scale_rewards!r} and `adv_scale`="
                f"{self.adv_scale!r} disagree; set `adv_scale` (the advantages are cancellation.group_advantages): "
                f"adv_scale={scale!r} is what scale_rewards={self.scale_rewards!r} means"
            )
        self.scale_rewards = self.adv_scale
        GRPOConfig.__post_init__(self)
        check_layout(self)


# ``--help`` of TRL's ``TrlParser`` / transformers' ``HfArgumentParser`` shows each objective field's docstring
# (on copies of the fields: ``RunConfig`` shares ObjectiveConfig's field objects)
for _name, _doc in class_field_docs(ObjectiveConfig).items():
    _field = copy.copy(CancellationGRPOConfig.__dataclass_fields__[_name])
    _field.metadata = MappingProxyType({"help": _doc})
    CancellationGRPOConfig.__dataclass_fields__[_name] = _field


def check_layout(args: Any) -> None:
    """Refuse a layout in which a group's completions would not all reach one coefficient computation.

    TRL gives each process ``per_device_train_batch_size × steps_per_generation`` consecutive rows of the
    generation batch, whose groups are ``num_generations`` consecutive rows; an optimizer step accumulates
    ``gradient_accumulation_steps`` slices of ``per_device_train_batch_size`` rows. The transform (and every
    coupling aggregation) sees a group whole only if the group lies on one process and in one optimizer step.
    """
    g = args.num_generations
    per_process = args.per_device_train_batch_size * args.steps_per_generation
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    keep = (
        "per_device_train_batch_size × gradient_accumulation_steps a multiple of num_generations, and "
        "steps_per_generation a multiple of gradient_accumulation_steps"
    )
    if per_process % g:
        raise ValueError(
            f"CancellationGRPOConfig: per_device_train_batch_size ({args.per_device_train_batch_size}) × "
            f"steps_per_generation ({args.steps_per_generation}) = {per_process} rows per process is not a "
            f"multiple of num_generations ({g}): a group would be split between processes, where its transform "
            f"cannot see it whole. Keep groups whole: {keep}"
        )
    if args.steps_per_generation % args.gradient_accumulation_steps:
        raise ValueError(
            f"CancellationGRPOConfig: steps_per_generation ({args.steps_per_generation}) is not a multiple of "
            f"gradient_accumulation_steps ({args.gradient_accumulation_steps}): an optimizer step would span two "
            f"generation batches. Keep groups whole: {keep}"
        )
    if per_step % g:
        raise ValueError(
            f"CancellationGRPOConfig: per_device_train_batch_size ({args.per_device_train_batch_size}) × "
            f"gradient_accumulation_steps ({args.gradient_accumulation_steps}) = {per_step} rows per optimizer "
            f"step is not a multiple of num_generations ({g}): a group would be split between optimizer steps. "
            f"Keep groups whole: {keep}"
        )


def meter_totals(completion_ids: Tensor, mask: Tensor, group: Tensor, coef: Tensor) -> list[float]:
    """This process's cancellation-meter sums (``MeterTotals.as_list``) of one optimizer step's coefficients."""
    meter = CancellationMeter(prefix_event_keys(completion_ids, mask, group), mask, group)
    meter.add(coef)
    return meter.totals.as_list()


class CancellationGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` running the objective of its ``CancellationGRPOConfig`` (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, CancellationGRPOConfig):
            raise TypeError(
                "CancellationGRPOTrainer needs args=CancellationGRPOConfig(...) (a GRPOConfig with the objective "
                f"fields), got {type(config).__name__}"
            )
        super().__init__(*args, **kwargs)
        if config.lopti_eta is not None and self.accelerator.num_processes > 1:
            raise ValueError(
                "CancellationGRPOConfig: `lopti_eta` (Lopti's two stages) runs in one process only in the TRL "
                "plug-in: its first stage is an optimizer step the plug-in takes inside TRL's step, outside "
                "DDP's, DeepSpeed's or FSDP's gradient synchronisation; launch one process, or use scaledrun.train "
                "(docs/plugins.md)"
            )
        if self.aux_loss_enabled:
            raise ValueError(
                "CancellationGRPOTrainer: the model's MoE router auxiliary loss is added by TRL's own loss, which "
                "this trainer replaces: set router_aux_loss_coef=0.0"
            )
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        # TRL's clip metrics and anything else that reads them: the objective's resolved clip range
        self.epsilon_low, self.epsilon_high = resolved_eps(cfg)
        self._generation: dict[str, Any] | None = None
        self._coef: list[Tensor] = []
        self._captured_rewards: Tensor | None = None

    # ---- 1. the generation batch: our advantages, group ids, whole groups per optimizer step

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured_rewards = rewards  # (rows of every process, reward functions)
        return rewards

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        out = super()._generate_and_score_completions(inputs)
        size = self.num_generations if self.model.training else self.num_generations_eval
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        per_func = self._captured_rewards
        n = out["completion_ids"].shape[0]
        rank = self.accelerator.process_index
        dtype = torch.promote_types(self.accelerator.unwrap_model(self.model).dtype, torch.float32)
        rewards = (per_func * self.reward_weights.to(per_func.device)[None]).nansum(dim=1).to(dtype)
        scorable = ~torch.isnan(per_func).all(dim=1)  # TRL: a row no reward function scored gets 0
        mask = out["completion_mask"]
        # the rows in the loss, over every process (``mask_truncated_completions`` zeroes a truncated row's mask)
        in_loss = self.accelerator.gather(mask.sum(-1) > 0)
        group = torch.arange(rewards.shape[0], device=rewards.device) // size
        adv = group_advantages(
            rewards, group, scale=cfg.adv_scale, valid=scorable & in_loss.to(scorable.device)
        )
        out["advantages"] = adv[rank * n : (rank + 1) * n].to(out["completion_ids"].device)
        out["group"] = group[rank * n : (rank + 1) * n].to(out["completion_ids"].device)
        return out

    def _prepare_inputs(self, generation_batch):  # type: ignore[no-untyped-def]
        if not self.model.training:  # evaluation: TRL's batch; compute_loss scores it alone
            return super()._prepare_inputs(generation_batch)
        spg, ga = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        generate_every = spg * self.num_iterations
        fresh = self._step % generate_every == 0 or self._buffered_inputs is None
        if fresh:
            # TRL shuffles the rows here; the rows stay in whole groups instead, so that each optimizer
            # step's ``gradient_accumulation_steps`` slices hold whole groups (``check_layout``)
            self._generation = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = split_tensor_dict(self._generation, spg)
        k = self._step % spg
        if self._step % ga == 0:  # an optimizer step's first micro-batch: the whole mini-batch's coefficients
            self._coef = self._minibatch_coefficients(k // ga, on_policy=fresh)
        inputs = dict(self._buffered_inputs[k])
        inputs["coef"] = self._coef[k % ga]
        return inputs

    # ---- 2. the coefficients of a whole mini-batch: one cancellation.update.coefficients call

    def _logps(
        self, model: Any, inputs: dict[str, Any], entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """TRL's own scoring pass (its chunked float32 log-softmax); ``entropy``: the token entropies too, as
        TRL's loss pass computes them (the same kernel call, so the same log-probs as TRL's loss)."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = inputs["completion_ids"].size(1)
        logp, ent, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=entropy
        )
        return logp, ent

    @staticmethod
    def _mask(inputs: dict[str, Any]) -> Tensor:
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    def _loss_params(self, sub: dict[str, Any]) -> dict[str, Any]:
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        params = cfg.objective_params()
        if cfg.aggregation == "seq-mean-token-sum-norm" and "norm_constant" not in params:
            params["norm_constant"] = float(self.max_completion_length)  # as scaledrun.train.loss_params
        if self.beta != 0.0:
            params["ref_logp"] = sub["ref_per_token_logps"]
        return params

    def _minibatch_coefficients(self, j: int, *, on_policy: bool) -> list[Tensor]:
        """Coefficients of optimizer step ``j`` of the generation batch, one (b, T) tensor per micro-batch.

        With Lopti (``lopti_eta``) every stage but the last is an optimizer step taken here (``_inner_step``),
        as ``scaledrun.train`` takes one per stage; the last stage's coefficients go to TRL's step."""
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        ga = self.args.gradient_accumulation_steps
        slices = self._buffered_inputs[j * ga : (j + 1) * ga]
        b = slices[0]["completion_ids"].shape[0]
        gen = self._generation
        rows = slice(j * ga * b, (j + 1) * ga * b)
        sub = {k: v[rows] for k, v in gen.items() if isinstance(v, Tensor) and v.dim() > 0}
        mask = self._mask(sub)
        old = sub.get("old_per_token_logps")
        if on_policy and old is not None:
            logp = old  # the weights that scored them: no pass (as scaledrun's first optimizer step)
        else:
            logp = self._current_logps(slices)
        old = logp if old is None else old  # TRL: no old pass when the update is on-policy
        adv = sub["advantages"]
        if cfg.ar_alpha is not None:
            # Advantage Reweighting (Lopti paper §4.1, eq. 4): per-token A·[α·π_old + (1 − α)]
            adv = reweight_advantages(adv, old, cfg.ar_alpha)
        if cfg.lopti_eta is not None:
            # Lopti (Lopti paper §4.2): the low-probability tokens' stage first, then the rest
            stages = lopti_stage_advantages(adv, old, mask, cfg.lopti_eta)
            for stage in stages[:-1]:
                coef = self._coefficients(sub, logp, old, stage, mask)
                self._inner_step(slices, list(coef.split(b)))
                logp = self._current_logps(slices)  # the stage moved the weights
            adv = stages[-1] if stages else torch.zeros_like(old)
        return list(self._coefficients(sub, logp, old, adv, mask).split(b))

    def _current_logps(self, slices: list[dict[str, Any]]) -> Tensor:
        """No-grad passes over the micro-batches (the same slices as the backward passes)."""
        with torch.no_grad():
            return torch.cat([self._logps(self.model, s)[0] for s in slices], dim=0)

    def _coefficients(
        self, sub: dict[str, Any], logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor
    ) -> Tensor:
        """One ``cancellation.update.coefficients`` call on the whole mini-batch, with the global counts."""
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        local = torch.tensor(
            [float(mask.sum()), float(mask.shape[0])], dtype=torch.float64, device=mask.device
        )
        tokens, sequences = self.accelerator.reduce(local, "sum").tolist()
        co = coefficients(
            cfg.objective, logp.detach(), old, adv, mask, sub["group"], aggregation=cfg.aggregation,
            token_count=tokens, seq_count=sequences, **self._loss_params(sub),
        )  # fmt: skip
        coef = co.coef
        if "importance_sampling_ratio" in sub:
            # TRL's vLLM importance-sampling correction (truncated or masked π_trainer/π_vLLM, no gradient)
            # weights each token's (or sequence's) term, as TRL's own loss does: docs/plugins.md
            coef = coef * sub["importance_sampling_ratio"].to(coef.dtype)
        self._log_update(sub, mask, coef, co.metrics, float(co.loss))
        return coef

    def _inner_step(self, slices: list[dict[str, Any]], coefs: list[Tensor]) -> None:
        """One optimizer step on the mini-batch's coefficients (a Lopti stage before TRL's own step; one
        process: ``__init__`` refuses more): a backward pass per micro-batch, TRL's gradient clipping, the
        optimizer's step (the wrapped optimizer's own ``step`` would skip inside an accumulation window)."""
        for inputs, coef in zip(slices, coefs, strict=True):
            logp, _ = self._logps(self.model, inputs, entropy=True)  # the same kernel call as the loss pass
            mask = self._mask(inputs)
            logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
            self.accelerator.backward(-(coef.detach().to(logp.dtype) * logp).sum())
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.args.max_grad_norm is not None and self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _log_update(
        self, sub: dict[str, Any], mask: Tensor, coef: Tensor, metrics: dict[str, float], loss: float
    ):
        """The objective's metrics (mean over processes) and the cancellation meter (sums over processes)."""
        dev = self.accelerator.device
        keys = [k for k in METRIC_KEYS if k in metrics]
        values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=dev)
        values = self.accelerator.reduce(values, "mean")
        for k, v in zip(keys, values.tolist(), strict=True):
            self._metrics["train"][f"cancellation/{k}"].append(v)
        sums = torch.tensor(meter_totals(sub["completion_ids"], mask, sub["group"], coef), device=dev)
        totals = MeterTotals.from_list(self.accelerator.reduce(sums.double(), "sum").tolist())
        for k, v in totals.residuals().items():
            self._metrics["train"][f"cancellation/{k}"].append(v)
        self._minibatch_loss = loss

    # ---- 3. each micro-batch: −W·Σ c·logp, whose gradient is the mini-batch's

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        if return_outputs:
            raise ValueError("CancellationGRPOTrainer does not return outputs")
        cfg: CancellationGRPOConfig = self.args  # type: ignore[assignment]
        logp, entropy = self._logps(model, inputs, entropy=True)
        mask = self._mask(inputs)
        mode = "train" if model.training else "eval"
        totals = torch.stack([(entropy * mask).sum(), mask.sum().to(entropy.dtype)]).detach()
        totals = self.accelerator.reduce(totals, "sum")
        self._metrics[mode]["entropy"].append(float(totals[0] / totals[1].clamp(min=1.0)))  # TRL's metric
        if "coef" not in inputs:  # evaluation: this batch's objective, alone
            old = inputs.get("old_per_token_logps", logp.detach())
            params = self._loss_params(inputs)
            loss, _ = objective_loss(
                cfg.objective,
                logp,
                old,
                inputs["advantages"],
                mask,
                inputs["group"],
                aggregation=cfg.aggregation,
                **params,
            )
            return loss
        world = self.accelerator.num_processes
        logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))  # padding: no gradient
        surrogate = -(inputs["coef"].detach().to(logp.dtype) * logp).sum() * world
        # the value TRL logs: the mini-batch's loss, spread over its micro-batches (the gradient is the surrogate's)
        value = self._minibatch_loss * world / self.args.gradient_accumulation_steps
        return surrogate - surrogate.detach() + value

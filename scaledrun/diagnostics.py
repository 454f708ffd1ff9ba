"""What the trainer measures about an update, beside it and never inside its arithmetic.

``update`` (``scaledrun.train``) calls the hooks of ``UpdateDiagnostics`` in order and returns its
``UpdateResult``: the cancellation meter (``cancellation.update.CancellationMeter``) on every step; with
``measure`` (every ``flip_every`` steps) the energy by token-frequency bucket (DFPO eq. 24) of the first
mini-batch and the token flips (cancellation-hypothesis paper App. C) of the last; the debug dump of the
first optimizer step's gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cancellation.diagnostics import FLIP_KEYS, energy_by_bucket, prefix_event_keys, token_flip_stats
from cancellation.update import CancellationMeter, Coefficients, MeterTotals, MiniBatch

from .config import RunConfig
from .distributed import full_params
from .packing import RowLengths
from .rollout import RolloutBatch, completion_logprobs

#: energy_by_bucket needs the (B, T, V) probabilities of the first mini-batch; skipped above this size.
ENERGY_MAX_ELEMENTS = 2**26


NUM_ENERGY_BUCKETS = 3


ENERGY_KEYS = tuple(f"energy/bucket_{k}" for k in range(NUM_ENERGY_BUCKETS))


@dataclass
class UpdateResult:
    """What one RL step's update did, for the log row.

    Attributes:
        metrics: the objective's metrics of the last mini-batch (empty without an update).
        opt_steps: optimizer steps taken; grad_norm: the last one's norm before clipping.
        meter: this process's cancellation-meter sums (add them over processes, then ``.residuals()``).
        energy: ``ENERGY_KEYS`` → share, of the first mini-batch (NaN: not measured).
        flip: ``FLIP_KEYS`` → fraction, of the last mini-batch (NaN: not measured).
        rows_scored: rows run through the model by the update and its diagnostics (every pass counted).
        slots, tokens: token slots (padding included) and real tokens of the gradient passes.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    opt_steps: int = 0
    grad_norm: float = math.nan
    meter: MeterTotals = field(default_factory=MeterTotals)
    energy: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENERGY_KEYS, math.nan))
    flip: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FLIP_KEYS, math.nan))
    rows_scored: float = 0.0
    slots: float = 0.0
    tokens: float = 0.0


class UpdateDiagnostics:
    """What the trainer measures about an update, beside it: ``update`` calls these hooks, in order.

    - the cancellation meter (``cancellation.update.CancellationMeter``) built on the step batch, fed
      each optimizer step's coefficients (every step);
    - with ``measure`` (every ``flip_every`` steps): energy by token-frequency bucket (DFPO eq. 24) of the
      **first** mini-batch (a no-grad pass before its optimizer step, when its (b, T, V) probabilities
      stay under ``ENERGY_MAX_ELEMENTS``), and token flips (cancellation-hypothesis paper App. C) of
      the **last** mini-batch: its log-probs before its optimizer step and after the step's last one (a
      no-grad pass in ``finish``);
    - ``first_grads`` (debug): the first optimizer step's gradients, after the cross-process reduction,
      before clipping.
    """

    def __init__(
        self,
        cfg: RunConfig,
        accelerator: Any,
        model: Any,
        batch: RolloutBatch,
        first_grads: dict[str, Tensor] | None,
        measure: bool = True,
    ) -> None:
        self.cfg, self.accelerator, self.model, self.batch = cfg, accelerator, model, batch
        self.first_grads, self.measure = first_grads, measure
        self.unwrapped = accelerator.unwrap_model(model)
        mask = batch.completion_mask
        keys = prefix_event_keys(batch.completion_ids, mask, batch.group)
        self.meter = CancellationMeter(keys, mask, batch.group)
        self.result = UpdateResult()
        self.last: tuple[RolloutBatch, Tensor] | None = (
            None  # (rows, log-probs before) of the last mini-batch
        )

    def _no_grad_pass(self, sub: RolloutBatch, **kw: Any) -> dict[str, Tensor]:
        """A pass over ``sub`` in eval mode, outside the update's graph (full parameters gathered)."""
        t = sub.completion_mask.shape[1]
        with torch.no_grad(), full_params(self.accelerator, self.model):
            was = self.unwrapped.training
            self.unwrapped.eval()
            out = completion_logprobs(
                self.unwrapped, sub.input_ids, sub.attention_mask, t, temperature=self.cfg.temperature,
                completion_mask=sub.completion_mask, chunk_tokens=self.cfg.logprob_chunk_tokens, **kw,
            )  # fmt: skip
            self.unwrapped.train(was)
        self.result.rows_scored += len(sub)
        return out

    def before_step(self, sub: RolloutBatch, co: Coefficients) -> None:
        """Energy by bucket of the first mini-batch, at the weights its coefficients were computed at."""
        size = len(sub) * sub.completion_mask.shape[1] * vocab_size(self.unwrapped)
        if not self.measure or self.result.opt_steps > 0 or size > ENERGY_MAX_ELEMENTS:
            return
        if float(sub.completion_mask.sum()) == 0:
            return
        fwd = self._no_grad_pass(sub, with_hidden=True)
        shares = energy_by_bucket(
            co.coef.double(), fwd["probs"], sub.completion_ids, sub.completion_mask,
            hidden_norm=fwd["hidden_norm"], num_buckets=NUM_ENERGY_BUCKETS,
        )  # fmt: skip
        self.result.energy = dict(zip(ENERGY_KEYS, shares.tolist(), strict=True))

    def after_backward(self) -> None:
        if self.first_grads is not None and self.result.opt_steps == 0:
            for name, p in self.unwrapped.named_parameters():
                if p.requires_grad and p.grad is not None:
                    self.first_grads[name] = p.grad.detach().cpu().clone()

    def after_step(
        self, mb: MiniBatch, sub: RolloutBatch, logp: Tensor, co: Coefficients, grad_norm: float
    ) -> None:
        res = self.result
        self.meter.add(co.coef, mb.rows)
        if co.metrics:
            res.metrics = co.metrics
        res.grad_norm = grad_norm
        res.opt_steps += 1
        self.last = (sub, logp.detach())

    def finish(self) -> UpdateResult:
        res = self.result
        res.meter = self.meter.totals
        if self.measure and self.last is not None:
            sub, before = self.last
            after = self._no_grad_pass(sub)["logp"]
            # cancellation-hypothesis paper App. C eq. (16): the last mini-batch's log-probs before vs after its update
            res.flip = token_flip_stats(before, after, sub.advantages, sub.completion_mask)
        return res


def vocab_size(model: Any) -> int:
    """The vocabulary size from the model's config (a sharded head's local rows are not the vocabulary:
    9056 for a 282-row head under FSDP1 on 2 ranks, 0 under ZeRO-3)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size else int(model.get_output_embeddings().weight.shape[0])


def measure_step(cfg: RunConfig, step: int) -> bool:
    """Whether step ``step`` runs the energy and token-flip diagnostics (``flip_every``; None: ``eval_every``)."""
    every = cfg.eval_every if cfg.flip_every is None else cfg.flip_every
    return every > 0 and (step % every == 0 or step == cfg.steps)


def pass_tokens(sub: RolloutBatch, micro: list[Tensor | None]) -> tuple[float, float]:
    """(token slots, real tokens) of the forward passes over ``micro`` (each trimmed to its own rows)."""
    lengths = RowLengths.of(sub)
    slots = sum(lengths.padded_tokens(rows) for rows in micro if rows is not None)
    slots += sum(lengths.padded_tokens([0]) for rows in micro if rows is None)
    real = float((lengths.prompt + lengths.completion).sum())
    return float(slots), real

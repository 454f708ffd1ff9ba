"""The trainer's model: where it comes from, LoRA, the precision its passes run in, its optimizer.

- ``check_model_source``: a model that can be neither read nor fetched fails at once, naming the local
  model folders (before the run folder is touched; ``scaledrun.train``);
- ``load_model``: ``from_pretrained`` in the config's dtype and attention kernel, gradient checkpointing,
  the LoRA adapter (``lora_config``) unless full fine-tuning;
- ``master_fp32``, ``compute_precision``: full fine-tuning in bfloat16 keeps float32 master weights and
  runs its passes under bfloat16 autocast;
- ``build_optimizer``: AdamW and the warm-up + cosine schedule.
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from .config import RunConfig


def lora_config(cfg: RunConfig):
    """The ``peft.LoraConfig`` of a run (rank, alpha, dropout, target modules from the config)."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def master_fp32(cfg: RunConfig) -> bool:
    """Full fine-tuning in bfloat16 keeps float32 master weights and computes in bfloat16 (autocast).

    AdamW on bfloat16 weights loses every update below bfloat16's resolution (8 bits of mantissa: a step
    of lr 8e-7 on a weight of 0.02 is 4e-5 of it, far below 2^-8), so one step at the ``dfpo_paper`` lr
    changed 0.5 % of the weights. With float32 parameters and the forward and backward passes under
    bfloat16 autocast (``compute_precision``; verl too keeps fp32 master weights), every
    weight moves as in float32 (tests/scaledrun/test_train.py). LoRA keeps the frozen base in bfloat16:
    its trainable adapters are float32 already (PEFT's ``autocast_adapter_dtype``).
    """
    return cfg.full_finetune and cfg.dtype == "bfloat16"


def compute_precision(cfg: RunConfig, device: torch.device) -> Any:
    """The context every pass of a run runs in: bfloat16 autocast for ``master_fp32`` runs, else nothing.

    (Autocast rather than Accelerate's ``mixed_precision``: Accelerate's state is one per process, and
    tests run several configurations in one process.)
    """
    if not master_fp32(cfg):
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def load_model(cfg: RunConfig) -> Any:
    """``from_pretrained`` (dtype and ``attn_implementation`` from the config), LoRA unless full fine-tuning.

    Full fine-tuning in bfloat16 loads float32 weights (``master_fp32``): the passes then run under
    bfloat16 autocast (``compute_precision``).
    """
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if master_fp32(cfg) else getattr(torch, cfg.dtype)
    try:  # ``train`` has checked the source already (``check_model_source``)
        # attn_implementation None: transformers' default (sdpa); padding-free passes work under every kernel
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model, dtype=dtype, attn_implementation=cfg.attn_implementation
        )
    except OSError as err:
        raise FileNotFoundError(f"config field `model`={cfg.model!r} could not be loaded: {err}") from err
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.full_finetune:
        from peft import get_peft_model

        torch.manual_seed(cfg.seed)  # the LoRA A init
        with warnings.catch_warnings():
            # PEFT reads transformers' deprecated `is_gradient_checkpointing`: a FutureWarning on every run
            # that is not ours to fix (seen with transformers 5.24, PEFT 0.21)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, lora_config(cfg))
    elif cfg.beta > 0:
        raise ValueError(
            "config field `beta` > 0 needs LoRA (the reference is the base model with the adapter off)"
        )
    return model


#: Seconds the hub probe of ``check_model_source`` waits for an answer.
HUB_PROBE_TIMEOUT_S = 5.0


def local_model_folders(root: Path | None = None) -> list[str]:
    """Folders under ``root`` (the working directory) or ``root/artifacts`` that hold a model (config.json)."""
    root = Path.cwd() if root is None else root
    found = [*root.glob("*/config.json"), *root.glob("artifacts/*/config.json")]
    return sorted({str(p.parent.relative_to(root)) for p in found if not p.parent.name.startswith(".")})


def _hub_answer(name: str) -> str | None:
    """None when the hub serves model ``name`` (or answers unexpectedly); otherwise why it cannot be fetched."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = f"{constants.ENDPOINT.rstrip('/')}/api/models/{name}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code in (401, 404):
            return f"the Hugging Face hub has no model {name!r} (HTTP {err.code})"
        return None  # rate limits, gated models, ...: let from_pretrained report it
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return f"the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({reason})"
    return None


def check_model_source(name: str) -> None:
    """Fail at once, naming the local model folders, when ``model`` can be neither read nor fetched.

    A local folder must hold ``config.json``. A name that looks like a path (absolute, ``./``, ``~``,
    under ``artifacts/`` or ``runs/``, more than ``org/name``) and does not exist fails here without
    touching the network; so does a hub name that is not in the local hub cache when ``HF_HUB_OFFLINE``
    is set, or when one short request (``HUB_PROBE_TIMEOUT_S``) finds the hub unreachable or without
    that model. Without this, ``from_pretrained`` retries the download for a long while before its own error.
    """
    path = Path(name).expanduser()
    folders = local_model_folders()
    listing = (
        f"local model folders here: {', '.join(folders)}"
        if folders
        else "no local model folder here; build the tiny model with `python -m scaledrun.tiny --out artifacts/tiny-qwen3`"
    )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"config field `model`={name!r}: the folder holds no config.json; {listing}"
            )
        return
    looks_local = (
        path.is_absolute() or name.startswith((".", "~")) or name.endswith("/") or len(Path(name).parts) > 2
        or Path(name).parts[:1] in (("artifacts",), ("runs",))
    )  # fmt: skip
    if looks_local:
        reason = "no such folder"
    else:
        from huggingface_hub import constants, try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # in the local hub cache: from_pretrained reads it from there
        if constants.HF_HUB_OFFLINE:
            reason = "not a local folder, not in the local hub cache, and HF_HUB_OFFLINE is set"
        else:
            hub = _hub_answer(name)
            if hub is None:
                return
            reason = f"not a local folder, not in the local hub cache, and {hub}"
    raise FileNotFoundError(f"config field `model`={name!r}: {reason}; {listing}")


def build_optimizer(cfg: RunConfig, model: Any) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW on the trainable parameters; cosine schedule with linear warm-up and a minimum LR ratio."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # DFPO App. I: 3% warm-up, cosine decay to 0.2·lr
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=math.ceil(cfg.warmup_ratio * cfg.steps),
        num_training_steps=cfg.steps,
        min_lr_rate=cfg.min_lr_ratio,
    )
    return optimizer, scheduler


def load_model_and_tokenizer(cfg: RunConfig) -> tuple[Any, Any]:
    """``load_model(cfg)`` and ``load_tokenizer(cfg)``."""
    return load_model(cfg), load_tokenizer(cfg)


def load_tokenizer(cfg: RunConfig) -> Any:
    """The model's tokenizer, left-padding (pad = EOS when it has none). Cheap: the trainer loads it
    before the model, to check and format the data first."""
    from transformers import AutoTokenizer

    try:  # ``train`` has checked the source already (``check_model_source``)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, padding_side="left")
    except OSError as err:
        raise FileNotFoundError(f"config field `model`={cfg.model!r} could not be loaded: {err}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer

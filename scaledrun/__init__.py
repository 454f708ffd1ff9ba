"""The LM trainer: Accelerate + PEFT LoRA on Hugging Face causal LMs, the ``cancellation`` objectives.

Modules: ``config`` (``RunConfig``, ``load_config``), ``tasks`` (synthetic and file tasks), ``rewards``
(reward registry, crash-proof ``compute_rewards``), ``tiny`` (the locally built tiny Qwen3).
Imports ``cancellation`` only, never ``toymodel``.
"""

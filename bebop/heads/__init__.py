"""MTP draft heads as a library: pre-RL training (`train`: config, the policy's self-generated data with the frozen
backbone's hidden states, one optimiser step and held-out evaluation of the draft loss, checkpoints), their
speculative acceptance by method, temperature and task (`evaluate`), and per-position measurements along the policy's
own text (`positions`). The jobs `bebop train-mtp` and `bebop eval-mtp` and the notebooks call these."""

"""Pre-RL MTP head training as a library (the `bebop train-mtp` job is bebop.commands.train_mtp): its config, the
policy's self-generated data with the frozen backbone's hidden states, and one optimiser step / held-out evaluation
of the draft loss."""

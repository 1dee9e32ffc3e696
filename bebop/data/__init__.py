"""What the policy reads and writes: the tokenizer, the tasks and their rewards, pretraining batches
(`batches`), and completions played through an engine (`completions`)."""

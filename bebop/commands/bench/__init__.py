"""Benchmarks behind `bebop bench ...`: each module has `add_arguments(parser)` and `run(args)`."""

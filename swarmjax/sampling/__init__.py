"""On-device sampling: logits processors and the jitted KV-cache decode loop."""

from swarmjax.sampling.processors import SamplingConfig, filter_logits, select_tokens
from swarmjax.sampling.sampler import SampleOutput, Sampler, generate, left_align, pad_prompts

__all__ = ["SamplingConfig", "filter_logits", "select_tokens", "SampleOutput", "Sampler",
           "generate", "left_align", "pad_prompts"]

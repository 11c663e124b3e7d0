"""`swarmjax sample --config configs/sample_cpu.py`: the ~1M random Qwen3 on the CPU.

Point `hf_path` at a Qwen3/Llama checkpoint directory to sample from real weights.
"""

from swarmjax.cli.sample import SampleJob
from swarmjax.models.config import preset
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sharding.mesh import MeshConfig


def get_config() -> SampleJob:
    return SampleJob(
        model=preset("1m"),
        sampling=SamplingConfig(temperature=0.8, top_k=50, top_p=0.95, max_new_tokens=64),
        mesh=MeshConfig(data=-1, fsdp=1, tensor=1),
        hf_path=None,
        prompts=((1, 2, 3, 4), (5, 6), (7,), (8, 9, 10, 11, 12, 13)),
        stop_tokens=(0,),
        seed=0,
    )

"""swarmjax: a JAX/TPU-native RL stack for training parallel-agent orchestrators.

Every subpackage imports on its own (``from swarmjax.models import transformer``)
without pulling in a trainer, the CLI or TFDS.
"""

__version__ = "0.1.0"

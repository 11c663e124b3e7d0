"""RL core: trajectory batches, group advantages, GSPO-family losses, the update step.

Import the pieces directly (``from swarmjax.rl import losses``); nothing here
pulls in a trainer, the CLI or TFDS.
"""

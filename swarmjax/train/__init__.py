"""Training stages: SFT warm start from scripted demonstrations (``sft``)."""

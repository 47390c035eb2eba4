"""quantkit: offline post-training quantization of omni LLMs into compressed-tensors checkpoints."""

__version__ = "0.1.0"

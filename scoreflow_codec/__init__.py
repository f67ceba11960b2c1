"""scoreflow-codec: lossless image compression with score-based diffusion models."""

__version__ = "0.10.6"

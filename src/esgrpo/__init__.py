"""esgrpo: Evolution Strategies vs GRPO post-training of language models, as a pipeline."""

__version__ = "0.1.0"

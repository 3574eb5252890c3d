"""RCA models (MoT, single-stream), their training and evaluation, baselines and diagnosis."""

from teller.models.mot import ModelConfig, RCAModel, build_model

__all__ = ["ModelConfig", "RCAModel", "build_model"]

"""Datasets for teller's RCA models: the LLM-serving fault simulator, the dataset format, validation,
ground-truth culprit events, and tokenization into memory-mapped shards (``docs/dataset.md``,
``docs/faults.md``)."""

from __future__ import annotations

from teller.data.dataset import (
    SPLITS,
    Problem,
    culprit_mask,
    generate,
    kernel_family,
    load_config,
    plan,
    preset_names,
    validate,
)
from teller.data.faults import FAULT_TYPES, LABELS, NORMAL

__all__ = [
    "FAULT_TYPES",
    "LABELS",
    "NORMAL",
    "SPLITS",
    "Problem",
    "culprit_mask",
    "generate",
    "kernel_family",
    "load_config",
    "plan",
    "preset_names",
    "validate",
]

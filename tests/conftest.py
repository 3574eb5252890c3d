from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
FIXTURES = sorted(p.name for p in TRACES.glob("*.kineto.json.gz"))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return TRACES


@pytest.fixture(scope="session")
def fixture_json():
    """Parsed JSON of each fixture (cached), from the standard json module."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            with gzip.open(TRACES / name, "rt") as f:
                cache[name] = json.load(f)
        return cache[name]

    return get

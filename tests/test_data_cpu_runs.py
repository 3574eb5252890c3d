"""Real CPU fault runs (teller dataset collect-cpu): the collector, a real workload, a real fault."""

from __future__ import annotations

import json

import numpy as np
import pytest
import teller.trace as T
from teller.collect import shim
from teller.data import validate
from teller.data.cpu_runs import collect_cpu

pytestmark = pytest.mark.skipif(shim.locate() is None, reason="the shim is not built (make build builds it)")


def test_slow_operator_and_contention_runs(tmp_path):
    out = tmp_path / "cpu"
    man = collect_cpu(
        out, 3, seed=1, requests=12, new_tokens=6, kinds=["normal", "slow_operator", "cpu_contention"]
    )
    assert man["num_samples"] == 3 and man["splits"]["test"] == ["cpu0000", "cpu0001", "cpu0002"]
    assert validate(out, deep=True) == []
    anns = {s: json.loads((out / s / "annotation.json").read_text()) for s in man["splits"]["test"]}
    assert anns["cpu0000"]["faults"] == [] and anns["cpu0000"]["label"] == "normal"

    # slow_operator: the slowed GPT2MLP calls are inside the window and much longer than the others
    slow = anns["cpu0001"]
    f = slow["faults"][0]
    assert f["type"] == "slow_operator" and f["target"]["name"] == "GPT2MLP"
    tr = T.load(out / "cpu0001" / "trace.json", warn=False)
    mlp = np.asarray([i for i in range(len(tr)) if tr.name_of(i) == "GPT2MLP"])
    inside = (tr.ts[mlp] >= f["start_ns"]) & (tr.ts[mlp] < f["end_ns"])
    assert inside.sum() >= 8 and (~inside).sum() >= 8
    delay_ns = f["params"]["delay_ms"] * 1e6
    assert np.median(tr.dur[mlp][inside]) > np.median(tr.dur[mlp][~inside]) + 0.8 * delay_ns

    # cpu_contention: a window inside the run, measured when the busy processes ran
    c = anns["cpu0002"]["faults"][0]
    assert c["type"] == "cpu_contention" and c["params"]["busy_processes"] >= 1
    assert anns["cpu0002"]["trace"]["start_ns"] <= c["start_ns"] < c["end_ns"]
    log = (out / "cpu0002" / "log.txt").read_text()
    assert "generated in" in log

    # resumable: a second call reuses the finished samples
    again = collect_cpu(
        out, 3, seed=1, requests=12, new_tokens=6, kinds=["normal", "slow_operator", "cpu_contention"]
    )
    assert again["samples"] == man["samples"]

"""A real CUDA torch inference collected with CUPTI (skipped without a GPU).

Run on a GPU machine: `python -m pytest -q tests/gpu` (with the shim built: `teller shim build`).
Checks that kernels and memcpys are linked to the runtime calls that launched them and, through the
call-chain tree, to the NVTX range (module) that launched those.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cuda_inference_is_collected_and_linked(tmp_path):
    import teller.trace as T

    prog = tmp_path / "cuda_infer.py"
    prog.write_text(
        textwrap.dedent("""
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=64)
        model = GPT2LMHeadModel(cfg).eval().cuda()
        ids = torch.randint(0, 512, (2, 16)).cuda()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        print("tokens", out.shape, out.cpu().sum().item())
    """)
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "teller",
            "collect",
            "--trace-dir",
            str(tmp_path / "t"),
            "--nvtx-json",
            "transformers",
            "--",
            sys.executable,
            str(prog),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    run = sorted((tmp_path / "t").glob("run-*"))[-1]
    tr = T.load(run, warn=False)
    s = tr.summary()
    assert s["by_layer"].get("kernel", 0) > 50, s
    assert s["by_layer"].get("memcpy", 0) >= 1, s
    assert s["linked_gpu_events"] >= 0.95 * s["gpu_events"], s
    gpu = np.flatnonzero(tr.layer_mask("kernel", "memcpy") & (tr.link >= 0))
    # every linked kernel's launch sits under an NVTX module range (GPT2Block, GPT2Attention, ...)
    with_range = 0
    for i in gpu:
        p_ = int(tr.parent[int(tr.link[i])])
        while p_ >= 0 and tr.layer_name(p_) != "annotation":
            p_ = int(tr.parent[p_])
        with_range += p_ >= 0
    assert with_range >= 0.9 * len(gpu)
    # external correlation: the launching call carries the innermost NVTX range id
    launches = np.unique(tr.link[gpu])
    assert (tr.ext[launches] > 0).mean() > 0.9
    # CUPTI and NVTX on one clock: kernels start after their launch begins and within the run
    assert np.all(tr.ts[gpu] >= tr.ts[tr.link[gpu]] - 1_000)
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["exit_code"] == 0

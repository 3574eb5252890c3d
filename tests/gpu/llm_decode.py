"""A small LLM serving loop on a CUDA GPU: a randomly initialised Llama (no hub access), batched
prefill plus greedy decode through transformers' ``generate``, logging like a serving engine.

Used by tests/gpu/device_check.sh as a real workload for ``teller collect`` and, with ``--kineto``,
for the same workload under the PyTorch profiler (the peer capture). Prints one JSON line of timings.

    python llm_decode.py [--layers 4] [--batch 8] [--prompt 128] [--new 32] [--reps 3] [--kineto OUT.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

log = logging.getLogger("llm_decode")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kineto", default=None, help="also profile one rep with torch.profiler, export here")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(asctime)s [%(name)s] %(message)s"
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 11 // 4,
        num_hidden_layers=a.layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), device="cuda")
    mask = torch.ones_like(ids)  # (token 0, the pad id, occurs in random prompts: nothing is padding)
    log.info(
        "model llama layers=%d hidden=%d dtype=bfloat16 device=%s pid=%d",
        a.layers,
        a.hidden,
        torch.cuda.get_device_name(0),
        os.getpid(),
    )

    def once() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=a.new,
                min_new_tokens=a.new,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        assert out.shape == (a.batch, a.prompt + a.new), out.shape
        return time.perf_counter() - t

    once()  # warm-up: cuBLAS handles, autotuning, allocator
    times = []
    for r in range(a.reps):
        dt = once()
        times.append(dt)
        log.info(
            "request batch %d: %d seqs, prompt %d tokens, %d new tokens, %.1f ms (%.1f tok/s)",
            r,
            a.batch,
            a.prompt,
            a.new,
            dt * 1e3,
            a.batch * a.new / dt,
        )
    res = {"pid": os.getpid(), "rep_s": times, "median_s": sorted(times)[len(times) // 2]}
    if a.kineto:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            res["kineto_rep_s"] = once()
        prof.export_chrome_trace(a.kineto)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

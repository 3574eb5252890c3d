"""A tiny, unmodified LLM inference: GPT-2 built from a config (no download), greedy generation on CPU.

Run it under the collector to see module ranges without touching this file:

    teller collect --nvtx-json transformers -- python examples/tiny_inference.py
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

log = logging.getLogger("tiny_inference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    cfg = GPT2Config(n_layer=args.layers, n_head=4, n_embd=128, vocab_size=1024, n_positions=128)
    model = GPT2LMHeadModel(cfg).eval()
    log.info(
        "model ready: %d layers, %.1fM parameters",
        args.layers,
        sum(p.numel() for p in model.parameters()) / 1e6,
    )
    for r in range(args.requests):
        prompt = torch.randint(0, cfg.vocab_size, (1, 16))
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        dt = time.perf_counter() - t0
        n = out.shape[1] - prompt.shape[1]
        log.info("request %d: %d tokens in %.1f ms (%.1f tokens/s)", r, n, dt * 1e3, n / dt)


if __name__ == "__main__":
    main()

"""A tiny, unmodified LLM inference: GPT-2 built from a config (no download), greedy generation on CPU.

    python -m teller.workloads.tiny_gpt2 --requests 4 --new-tokens 8
    teller collect --nvtx-json transformers -- python -m teller.workloads.tiny_gpt2

Each request is logged like a serving engine would (tokens, latency, throughput), so logs and traces
can be aligned. ``--threads`` sets torch's intra-op threads (a misconfiguration knob for fault runs);
``--log-file`` also appends every log line to a file, flushed and fsynced (a synchronous I/O path).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

log = logging.getLogger("tiny_gpt2")


class _FsyncFileHandler(logging.FileHandler):
    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if self.stream is not None:
            self.stream.flush()
            os.fsync(self.stream.fileno())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-file", default=None)
    args = ap.parse_args(argv)
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if args.log_file:
        handlers.append(_FsyncFileHandler(args.log_file))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers
    )
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    cfg = GPT2Config(n_layer=args.layers, n_head=4, n_embd=128, vocab_size=1024, n_positions=256)
    model = GPT2LMHeadModel(cfg).eval()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log.info("model ready: %d layers, %.1fM parameters, %d threads", args.layers, n_params, args.threads)
    for r in range(args.requests):
        prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_len))
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        dt = time.perf_counter() - t0
        n = out.shape[1] - prompt.shape[1]
        log.info(
            "request %d: %d prompt tokens, %d generated in %.1f ms (%.1f tokens/s)",
            r,
            args.prompt_len,
            n,
            dt * 1e3,
            n / dt,
        )


if __name__ == "__main__":
    main()

"""A tiny, unmodified LLM inference (GPT-2 from a config, CPU). See teller.workloads.tiny_gpt2.

teller collect --nvtx-json transformers -- python examples/tiny_inference.py
"""

from teller.workloads.tiny_gpt2 import main

if __name__ == "__main__":
    main()

"""GPU smoke test for the CUPTI side (needs a CUDA GPU and a CUDA build of torch).

Run by gpu_check.sh with CUDA_INJECTION64_PATH, NVTX_INJECTION64_PATH and TELLER_TRACE_DIR set.
Prints one JSON line of facts for `check_raw.py gpu`."""

import json
import os
import threading

import nvtx
import torch

assert torch.cuda.is_available(), "no CUDA device"
with nvtx.annotate("gpu-step", domain="smoke"):
    a = torch.randn(1024, 1024, device="cuda")
    b = a @ a
    torch.cuda.synchronize()
with nvtx.annotate("gpu-copy", domain="smoke"):
    c = b.cpu()
    torch.cuda.synchronize()
props = torch.cuda.get_device_properties(0)  # for the header's deviceProperties (device 0)
facts = {"pid": os.getpid(), "tid": threading.get_native_id(), "checksum": float(c.sum())}
facts.update(gpu_name=props.name, gpu_mem=props.total_memory, gpu_sms=props.multi_processor_count)
facts.update(gpu_cc=[props.major, props.minor])
print(json.dumps(facts))

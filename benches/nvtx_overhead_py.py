"""ns per Python `nvtx.push_range`/`pop_range` pair (run with and without NVTX_INJECTION64_PATH)."""

import sys
import time

import nvtx

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
dom = nvtx.get_domain("bench")
attr = dom.get_event_attributes("py-range")
push, pop = dom.push_range, dom.pop_range
push(attr)
pop()
t0 = time.perf_counter()
for _ in range(n):
    push(attr)
    pop()
dt = time.perf_counter() - t0
print(f"{dt * 1e9 / n:.1f}")

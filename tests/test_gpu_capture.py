"""A real GPU capture, read on the CPU: the shim's recording of a Llama decode on an H200 next to
torch.profiler's recording of the same program (tests/data/gpu/README.md has the provenance).

The two collectors must agree on the GPU work: the same kernels (as symbols), the same copies, the same
launching runtime calls; and the shim's capture must link every kernel to its launch and, through the
call-chain tree, to the NVTX module range that issued it.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import teller.trace as T

GPU = Path(__file__).parent / "data" / "gpu"
RUN = GPU / "h200_llama_tiny"
KINETO = GPU / "h200_llama_tiny.kineto.json.gz"


@pytest.fixture(scope="module")
def shim():
    return T.load(RUN, warn=False)


@pytest.fixture(scope="module")
def kineto():
    return T.load(KINETO, warn=False)


def _symbols(tr, layer, mask=None):
    m = tr.layer_mask(layer) if mask is None else tr.layer_mask(layer) & mask
    return collections.Counter(tr.symbol_of(int(i)) for i in np.flatnonzero(m))


def _last_request(tr):
    st = tr.steps()[-1]  # the warm-up request is step 0, the timed one step 1
    return (tr.ts >= st.start_ns) & (tr.ts < st.end_ns)


def test_the_capture_loads_with_its_gpu(shim):
    s = shim.summary()
    assert s["steps"] == 2 and s["by_layer"]["kernel"] == 850
    assert s["linked_gpu_events"] == s["gpu_events"] == 948
    (dev,) = shim.device_properties
    assert dev["name"] == "NVIDIA H200" and dev["numSms"] == 132 and dev["computeMajor"] == 9


def test_shim_and_kineto_see_the_same_gpu_work(shim, kineto):
    req = _last_request(shim)
    k = _symbols(shim, "kernel", req)
    assert sum(k.values()) == 424 and len(k) == 21
    assert k == _symbols(kineto, "kernel")
    assert _symbols(shim, "memcpy", req).total() == _symbols(kineto, "memcpy").total() == 40
    launches = ("runtime:cudaLaunchKernel", "runtime:cudaLaunchKernelExC", "runtime:cudaMemcpyAsync")
    rs, rk = _symbols(shim, "runtime", req), _symbols(kineto, "runtime")
    assert [rs[x] for x in launches] == [rk[x] for x in launches] == [383, 5, 40]
    assert (
        _symbols(shim, "driver", req)["driver:cuLaunchKernelEx"] == 36 == _symbols(kineto, "driver").total()
    )


def test_no_mangled_or_versioned_names_reach_the_model(shim):
    names = {shim.name_of(int(i)) for i in np.flatnonzero(shim.layer_mask("kernel", "runtime", "driver"))}
    assert not [n for n in names if n.startswith("_Z")]
    assert not [n for n in names if n.rsplit("_v", 1)[-1].isdigit() and len(n.rsplit("_v", 1)[-1]) >= 4]


def test_every_kernel_sits_under_the_module_that_launched_it(shim):
    gpu = np.flatnonzero(shim.layer_mask("kernel") & _last_request(shim))
    owners = collections.Counter()
    assert (shim.link[gpu] >= 0).all()
    for i in gpu:
        p = int(shim.parent[int(shim.link[i])])
        while p >= 0 and shim.layer_name(p) != "annotation":
            p = int(shim.parent[p])
        assert p >= 0, shim.name_of(int(i))
        owners[shim.name_of(p)] += 1
    for module in ("LlamaAttention", "LlamaRMSNorm", "LlamaRotaryEmbedding", "Linear"):
        assert owners[module] > 0, owners


def test_summary_reports_launch_delay_and_sync_wait(shim, tmp_path):
    (d,) = shim.summary()["devices"]
    assert d["launches"] == 948  # one launching call per GPU activity in this capture
    assert 0 < d["launch_delay_p50_ns"] < 50_000 and d["launch_delay_p99_ns"] >= d["launch_delay_p50_ns"]
    assert d["sync_ns"] > 0
    # hand-made: one kernel starts 2 ms after its launch returned, one as it returns; a 0.5 us sync
    from teller.rawfmt import RawWriter

    f = tmp_path / "p.tmsgpack"
    with RawWriter(f, pid=7, clock_sync=(0, 0)) as w:
        w.span("runtime", "cudaLaunchKernel", tid=7, start=0, end=10, corr=1)
        w.gpu("kernel", "k", device=0, stream=7, start=2_010, end=2_020, corr=1)
        w.gpu("kernel", "k", device=0, stream=7, start=3_000, end=3_020, corr=1)  # same launch: later
        w.span("runtime", "cudaLaunchKernel", tid=7, start=100, end=110, corr=2)
        w.gpu("kernel", "k", device=0, stream=7, start=105, end=120, corr=2)  # before the call returned
        w.gpu("sync", "cudaStreamSynchronize", device=0, stream=7, start=200, end=700)
    (d,) = T.load(f, warn=False).summary()["devices"]
    assert (d["launches"], d["launch_delay_p50_ns"], d["launch_delay_p99_ns"], d["sync_ns"]) == (
        2,
        0,
        2_000,
        500,
    )

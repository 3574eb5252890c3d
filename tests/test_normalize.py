from __future__ import annotations

import pytest
from teller.trace import symbol


@pytest.mark.parametrize(
    "layer, name, expected",
    [
        (
            "kernel",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
            "kernel:vectorized_elementwise_kernel",
        ),
        (
            "kernel",
            "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
            "kernel:ampere_bf16_s16816gemm_bf16_*_ldg8_f2f_stages_*_tn",
        ),
        (
            "kernel",
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4, false, false, cutlass::half_t> >"
            "(Flash_fwd_params)",
            "kernel:flash_fwd_kernel",
        ),
        (
            "kernel",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel:ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
        ("kernel", "triton_poi_fused_add_mul_0", "kernel:triton_poi_fused_add_mul"),
        ("annotation", "ProfilerStep#17", "annotation:ProfilerStep#N"),
        ("annotation", "model.layers.11.self_attn", "annotation:model.layers.N.self_attn"),
        (
            "python",
            "/x/y/vllm/worker/model_runner.py(1529): execute_model",
            "python:model_runner.py:execute_model",
        ),
        ("runtime", "cudaLaunchKernel", "runtime:cudaLaunchKernel"),
        ("host_op", "aten::mm", "host_op:aten::mm"),
    ],
)
def test_symbols(layer, name, expected):
    assert symbol(layer, name) == expected


def test_options():
    n = "void at::native::foo_kernel<1>(int)"
    assert symbol("kernel", n, {"strip_namespaces": False}) == "kernel:at::native::foo_kernel"
    assert symbol("kernel", "gemm_128x64", {"collapse_tiles": False}) == "kernel:gemm_128x64"
    assert symbol("annotation", "step 3", {"collapse_digits": False}) == "annotation:step 3"
    assert len(symbol("kernel", "k" * 5000, {"max_len": 20})) == len("kernel:") + 20

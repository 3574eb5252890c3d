"""GPU and model specifications, and a roofline model of per-kernel durations.

Every kernel the simulator emits has a FLOP count and a byte count; its duration is

    dur = launch_floor + max(flops / (peak_flops * eff_c * clock), bytes / (hbm_bw * eff_m * mem))

times a lognormal jitter, where ``clock`` and ``mem`` are the fault factors in force (1.0 when
healthy). Kernel names are the ones real serving engines show in Nsight/Kineto traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.errors import ConfigError


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_tflops: float  # dense bf16 tensor-core TFLOP/s
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # per-direction NVLink bandwidth per GPU, GB/s
    pcie_gbps: float  # effective host<->device bandwidth, GB/s (pinned)
    memory_gib: float
    sm: int  # compute capability (80, 90)
    launch_floor_ns: int  # smallest kernel duration


GPUS: dict[str, GPUSpec] = {
    "A100": GPUSpec("A100-SXM4-80GB", 312.0, 2039.0, 300.0, 24.0, 79.15, 80, 2_200),
    "H100": GPUSpec("H100-SXM5-80GB", 989.0, 3350.0, 450.0, 50.0, 79.10, 90, 1_800),
    "L40S": GPUSpec("L40S-48GB", 362.0, 864.0, 32.0, 24.0, 44.39, 89, 2_500),
    # in no benchmark preset's workloads, only in ``diverse`` (extra training data over more GPUs), so
    # that a model meets more ratios of compute, memory and interconnect bandwidth than A100 and H100
    # without seeing the benchmark's OOD GPU. Datasheet numbers (dense bf16); the A10 has no NVLink
    # (peer traffic over PCIe), the A40 a two-GPU NVLink bridge (112.5 GB/s both directions).
    "A10": GPUSpec("NVIDIA A10", 125.0, 600.0, 20.0, 24.0, 22.06, 86, 2_500),
    "A40": GPUSpec("NVIDIA A40", 149.7, 696.0, 56.0, 24.0, 44.35, 86, 2_400),
    "H200": GPUSpec("NVIDIA H200", 989.0, 4800.0, 450.0, 50.0, 139.8, 90, 1_800),
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    layers: int  # layers of the real model (the simulator traces `traced_layers` of them)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def weight_bytes(self) -> float:
        per_layer = self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden
        per_layer += 3 * self.hidden * self.ffn
        return 2.0 * (per_layer * self.layers + 2 * self.vocab * self.hidden)


MODELS: dict[str, ModelSpec] = {
    "llama-3.2-1b": ModelSpec("meta-llama/Llama-3.2-1B", 2048, 32, 8, 8192, 128256, 16),
    "llama-3.1-8b": ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 8, 14336, 128256, 32),
    "qwen2.5-14b": ModelSpec("Qwen/Qwen2.5-14B-Instruct", 5120, 40, 8, 13824, 152064, 48),
    "mistral-7b": ModelSpec("mistralai/Mistral-7B-Instruct-v0.3", 4096, 32, 8, 14336, 32768, 32),
    "llama-2-13b": ModelSpec("meta-llama/Llama-2-13b-chat-hf", 5120, 40, 40, 13824, 32000, 40),
    "llama-3.1-70b": ModelSpec("meta-llama/Llama-3.1-70B-Instruct", 8192, 64, 8, 28672, 128256, 80),
}


def weights_fit(model: ModelSpec, gpu: GPUSpec, tp: int) -> bool:
    """The placement rule: a rank's share of the weights takes at most 70 % of the GPU's memory."""
    return model.weight_bytes() / tp <= 0.7 * gpu.memory_gib * 2**30


def gpu_spec(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


# Kernel families: the `target.name` of kernel-level faults and the key of the culprit mask.
COMPUTE_FAMILIES = ("gemm", "attention_prefill", "lm_head")
MEMORY_FAMILIES = (
    "attention_decode",
    "rms_norm",
    "rotary",
    "reshape_and_cache",
    "silu_and_mul",
    "embedding",
    "sampling",
)
COMM_FAMILIES = ("all_reduce",)


def gemm_name(gpu: GPUSpec, m: int, n: int, k: int) -> str:
    """A cuBLAS/CUTLASS GEMM kernel name for an (m x k) @ (k x n) bf16 GEMM, tile chosen by m."""
    if gpu.sm >= 90:
        tile = "64x64x64" if m <= 64 else ("128x128x64" if m <= 1024 else "128x256x64")
        seg = "on" if m <= 64 else "off"
        return (
            f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{tile}_warpgroupsize1x1x1"
            f"_execute_segment_k_{seg}_kernel__5x_cublas"
        )
    if m <= 64:
        return (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
            "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)"
        )
    tile = "128x128" if m <= 1024 else "256x128"
    return f"ampere_bf16_s16816gemm_bf16_{tile}_ldg8_f2f_stages_64x3_tn"


KERNEL_NAMES = {
    "rms_norm": "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, "
    "c10::BFloat16 const*, float, int, int)",
    "fused_add_rms_norm": "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, "
    "c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
    "rotary": "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, "
    "c10::BFloat16*, c10::BFloat16 const*, int, long, long, int, int, int)",
    "reshape_and_cache": "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
    "(vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, "
    "__nv_bfloat16*, long const*, long, long, long, long, int, int, int, float const*, float const*)",
    "silu_and_mul": "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel"
    "<c10::BFloat16>(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)",
    "embedding": "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, "
    "unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, "
    "at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<long, "
    "unsigned int>, int, int, unsigned int, unsigned int, long)",
    "sampling_softmax": "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, "
    "float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "sampling_argmax": "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4> >(at::native::ReduceOp<float, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4>)",
    "custom_all_reduce": "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, "
    "vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
    "nccl_all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    # foreign kernels of a co-located (noisy-neighbour) job
    "foreign_elementwise": "void at::native::vectorized_elementwise_kernel<4, at::native::"
    "CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3>)",
    "foreign_copy": "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
    "{lambda(float)#1}, at::detail::Array<char*, 2>, 4, TrivialOffsetCalculator<1, unsigned int>, "
    "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1> >(int, ...)",
}


def attention_name(gpu: GPUSpec, prefill: bool) -> str:
    if gpu.sm >= 90:
        if prefill:
            return "void flash::FlashAttnFwdSm90<flash::kernel_traits<128, 128, 128, 16, 2, false, 1, cutlass::bfloat16_t>, true, false>(flash::Flash_fwd_params)"  # noqa: E501
        return "void flash::FlashAttnFwdSm90<flash::kernel_traits<128, 64, 128, 16, 2, false, 1, cutlass::bfloat16_t>, false, true>(flash::Flash_fwd_params)"  # noqa: E501
    if prefill:
        return "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(Flash_fwd_params)"  # noqa: E501
    return "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(Flash_fwd_params)"  # noqa: E501


@dataclass
class KernelCost:
    family: str  # see *_FAMILIES
    name: str
    flops: float
    bytes: float
    op: str  # host operator that launches it (eager mode)


def layer_kernels(
    gpu: GPUSpec, model: ModelSpec, tp: int, n_tokens: int, n_prefill: int, attn_pairs: int, ctx_tokens: int
) -> list[tuple[str, list[KernelCost]]]:
    """Kernels of one decoder layer, grouped by NVTX sub-range (``attention``, ``mlp``); all-reduce
    kernels are returned as family ``all_reduce`` with the bytes to reduce (duration from the link).

    ``n_tokens``: tokens in the batch; ``n_prefill``: of them, prompt tokens; ``attn_pairs``: query-key
    pairs of the attention (summed over sequences); ``ctx_tokens``: KV tokens read."""
    h, kv, ffn = model.hidden, model.kv_dim, model.ffn
    t = max(n_tokens, 1)
    b2 = 2.0  # bf16
    qkv_n = (h + 2 * kv) // tp
    attn_out = h // tp
    ffn_tp = ffn // tp
    heads_tp = max(model.heads // tp, 1)
    kvh_tp = max(model.kv_heads // tp, 1)
    hd = model.head_dim

    def gemm(n: int, k: int, op: str) -> KernelCost:
        return KernelCost("gemm", gemm_name(gpu, t, n, k), 2.0 * t * n * k, b2 * (n * k + t * k + t * n), op)

    prefill = n_prefill > 0
    attn_flops = 4.0 * heads_tp * hd * attn_pairs
    attn_bytes = b2 * 2 * kvh_tp * hd * ctx_tokens + b2 * t * heads_tp * hd * 2
    attn = KernelCost(
        "attention_prefill" if prefill else "attention_decode",
        attention_name(gpu, prefill),
        attn_flops,
        attn_bytes,
        "vllm::unified_attention_with_output",
    )
    act = b2 * t * h
    attention = [
        KernelCost(
            "rms_norm", KERNEL_NAMES["fused_add_rms_norm"], 4.0 * t * h, 3 * act, "_C::fused_add_rms_norm"
        ),
        gemm(qkv_n, h, "aten::linear"),
        KernelCost(
            "rotary", KERNEL_NAMES["rotary"], 6.0 * t * qkv_n, b2 * t * qkv_n * 2, "_C::rotary_embedding"
        ),
        KernelCost(
            "reshape_and_cache",
            KERNEL_NAMES["reshape_and_cache"],
            0.0,
            b2 * t * 2 * kvh_tp * hd * 2,
            "_C_cache_ops::reshape_and_cache_flash",
        ),
        attn,
        gemm(h, attn_out, "aten::linear"),
    ]
    mlp = [
        KernelCost(
            "rms_norm", KERNEL_NAMES["fused_add_rms_norm"], 4.0 * t * h, 3 * act, "_C::fused_add_rms_norm"
        ),
        gemm(2 * ffn_tp, h, "aten::linear"),
        KernelCost(
            "silu_and_mul",
            KERNEL_NAMES["silu_and_mul"],
            3.0 * t * ffn_tp,
            b2 * t * ffn_tp * 3,
            "_C::silu_and_mul",
        ),
        gemm(h, ffn_tp, "aten::linear"),
    ]
    if tp > 1:
        ar = KernelCost("all_reduce", all_reduce_name(b2 * t * h), 0.0, b2 * t * h, "vllm::all_reduce")
        attention.append(ar)
        mlp.append(KernelCost(ar.family, ar.name, 0.0, ar.bytes, ar.op))
    return [("attention", attention), ("mlp", mlp)]


def all_reduce_name(nbytes: float) -> str:
    """vLLM uses its custom one-shot all-reduce for small messages and NCCL above 8 MiB."""
    return KERNEL_NAMES["custom_all_reduce"] if nbytes <= 8 * 1024 * 1024 else KERNEL_NAMES["nccl_all_reduce"]


def head_kernels(gpu: GPUSpec, model: ModelSpec, tp: int, n_tokens: int, n_seqs: int) -> list[KernelCost]:
    """Final norm, LM head (vocab-parallel) and sampling."""
    h, v = model.hidden, model.vocab // tp
    s = max(n_seqs, 1)
    return [
        KernelCost("rms_norm", KERNEL_NAMES["rms_norm"], 4.0 * s * h, 2.0 * 2 * s * h, "_C::rms_norm"),
        KernelCost(
            "lm_head", gemm_name(gpu, s, v, h), 2.0 * s * v * h, 2.0 * (v * h + s * h + s * v), "aten::linear"
        ),
        KernelCost(
            "sampling", KERNEL_NAMES["sampling_softmax"], 5.0 * s * v, 4.0 * 2 * s * v, "aten::softmax"
        ),
        KernelCost("sampling", KERNEL_NAMES["sampling_argmax"], 1.0 * s * v, 4.0 * s * v, "aten::argmax"),
    ]


def embedding_kernel(model: ModelSpec, n_tokens: int) -> KernelCost:
    return KernelCost(
        "embedding",
        KERNEL_NAMES["embedding"],
        0.0,
        2.0 * 2 * max(n_tokens, 1) * model.hidden,
        "aten::embedding",
    )


def roofline_ns(
    gpu: GPUSpec,
    k: KernelCost,
    *,
    clock: float = 1.0,
    mem: float = 1.0,
    eff_c: float = 0.62,
    eff_m: float = 0.78,
) -> float:
    """Duration in ns before jitter. ``clock`` scales compute throughput, ``mem`` HBM throughput."""
    t_c = k.flops / (gpu.peak_tflops * 1e12 * eff_c * clock) * 1e9
    t_m = k.bytes / (gpu.hbm_gbps * 1e9 * eff_m * mem) * 1e9
    return gpu.launch_floor_ns + max(t_c, t_m)


def is_compute_bound(gpu: GPUSpec, k: KernelCost) -> bool:
    t_c = k.flops / (gpu.peak_tflops * 0.62)
    t_m = k.bytes / (gpu.hbm_gbps * 0.78) * 1e3
    return t_c > t_m


def all_reduce_ns(gpu: GPUSpec, nbytes: float, tp: int, *, link: float = 1.0) -> float:
    """Ring/one-shot all-reduce transfer time once every rank has arrived."""
    if tp <= 1:
        return 0.0
    alpha = 4_500.0 if nbytes <= 8 * 1024 * 1024 else 12_000.0
    alpha *= 1.0 + 0.6 * (1.0 / link - 1.0)  # a congested link also delays the handshakes
    vol = 2.0 * (tp - 1) / tp * nbytes
    return alpha + vol / (gpu.nvlink_gbps * 1e9 * 0.8 * link) * 1e9


def memcpy_ns(gpu: GPUSpec, nbytes: float, *, pcie: float = 1.0, latency: float = 1.0) -> float:
    """A host<->device copy: a fixed latency (x ``latency``) plus its bytes at the link's bandwidth
    (x ``pcie``). Before generator version 7 a degraded link's latency factor multiplied the whole
    copy: a 64 MiB copy at severity 1 came out 52x slower, not the 13x of the fault's definition."""
    return 1_600.0 * latency + nbytes / (gpu.pcie_gbps * 1e9 * pcie) * 1e9


def jitter(rng: np.random.Generator, sigma: float) -> float:
    return float(np.exp(rng.normal(0.0, sigma)))

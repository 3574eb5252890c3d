//! Display names for what a CUPTI collector records raw, made to match what Kineto writes for the same
//! work, so that a shim capture and a `torch.profiler` capture of one program give the same symbols
//! (checked on an H200: `tests/data/gpu/h200_kernel_names.json`, 65 kernels of a Llama decode).
//!
//! * kernels: CUPTI gives the mangled name (`_ZN2at6native...`); Kineto demangles it in-process with
//!   libstdc++'s `abi::__cxa_demangle`. We demangle at load time with the pure-Rust `cpp_demangle`
//!   (decision: no C++ runtime linked into the core). On the H200 fixture its output gives the same
//!   symbol as Kineto's name for all 65 kernels, and the same display name for 22: the others differ in
//!   two ways that the symbol drops (a `void ` return type before a function named inside a template
//!   argument, and `(unsigned long)3` where libstdc++ writes `3ul`). Names that are not mangled
//!   (`nvjet_sm90_tst_...`, cuBLAS/cuDNN/Triton kernels) or fail to demangle are kept.
//! * runtime/driver calls: `cuptiGetCallbackName` names carry the API version (`cudaLaunchKernel_v7000`,
//!   `cudaGetDevice_v3020`); Kineto writes `cudaLaunchKernel`. A trailing `_v` plus four or more digits
//!   is dropped; shorter suffixes (`cuMemAlloc_v2`, `cuCtxCreate_v4`) are part of the driver function's
//!   name and stay.

//! * torch's own NVTX ranges (`torch.autograd.profiler.emit_nvtx`, `teller collect --torch-nvtx`) are
//!   its operators: `aten::mul, seq = 12, op_id = 345, sizes = [...]`. Kineto records the same
//!   operators as `cpu_op` named `aten::mul`; such a range becomes a host operator of that name.

use cpp_demangle::{DemangleOptions, Symbol};

/// The operator name of a torch `emit_nvtx` range (`aten::mul, seq = 12, op_id = 345` -> `aten::mul`),
/// or `None` for any other range name.
pub fn torch_nvtx_op(name: &str) -> Option<&str> {
    let (op, rest) = name.split_once(", ")?;
    if !(rest.starts_with("seq = ") || rest.starts_with("op_id = ")) {
        return None;
    }
    let (ns, f) = op.split_once("::")?;
    let ident = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    (ident(ns) && ident(f)).then_some(op)
}

/// The demangled kernel name, or `None` when `name` is not an Itanium-mangled symbol.
pub fn demangle_kernel(name: &str) -> Option<String> {
    if !name.starts_with("_Z") {
        return None;
    }
    let sym = Symbol::new(name.as_bytes()).ok()?;
    // (a recursion limit keeps a hostile name from exhausting the stack; real kernels stay far below)
    let opts = DemangleOptions::new().recursion_limit(256);
    let s = sym.demangle_with_options(&opts).ok()?;
    (!s.is_empty()).then_some(s)
}

/// A CUPTI callback name without its API-version suffix: `cudaLaunchKernel_v7000` -> `cudaLaunchKernel`.
pub fn strip_api_version(name: &str) -> &str {
    if let Some(p) = name.rfind("_v") {
        let digits = &name[p + 2..];
        if p > 0 && digits.len() >= 4 && digits.bytes().all(|b| b.is_ascii_digit()) {
            return &name[..p];
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions() {
        assert_eq!(strip_api_version("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
        assert_eq!(strip_api_version("cudaGetDevice_v3020"), "cudaGetDevice");
        assert_eq!(
            strip_api_version("cudaStreamIsCapturing_v10000"),
            "cudaStreamIsCapturing"
        );
        assert_eq!(strip_api_version("cuMemAlloc_v2"), "cuMemAlloc_v2");
        assert_eq!(strip_api_version("cuLaunchKernelEx"), "cuLaunchKernelEx");
        assert_eq!(strip_api_version("_v1234"), "_v1234");
        assert_eq!(strip_api_version("x_v12a4"), "x_v12a4");
    }

    #[test]
    fn torch_ops() {
        assert_eq!(torch_nvtx_op("aten::mul, seq = 12, op_id = 345"), Some("aten::mul"));
        assert_eq!(
            torch_nvtx_op("torchvision::_cuda_version, op_id = 1"),
            Some("torchvision::_cuda_version")
        );
        assert_eq!(
            torch_nvtx_op("aten::linear, op_id = 9, sizes = [[2, 3], [4, 3]], input_op_ids = [1, 2]"),
            Some("aten::linear")
        );
        assert_eq!(torch_nvtx_op("LlamaAttention"), None);
        assert_eq!(torch_nvtx_op("a::b, c = 1"), None);
        assert_eq!(torch_nvtx_op("layers.3, seq = 1"), None);
        assert_eq!(torch_nvtx_op("my op::x, seq = 1"), None);
    }

    #[test]
    fn kernels() {
        assert_eq!(demangle_kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"), None);
        assert_eq!(demangle_kernel("_Zgarbage"), None);
        assert_eq!(demangle_kernel("_Z6kernelPfi").as_deref(), Some("kernel(float*, int)"));
    }
}

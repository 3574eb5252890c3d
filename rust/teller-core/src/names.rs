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
//!   mostly its operators: `aten::mul, seq = 12, op_id = 345, sizes = [...]`. Kineto records the same
//!   operators as `cpu_op` named `aten::mul`; such a range becomes a host operator of that name (see
//!   `torch_nvtx_range`).

use cpp_demangle::{DemangleOptions, Symbol};

/// A torch `emit_nvtx` range name split into (is an operator, name without torch's suffix), or `None`
/// when the name has no such suffix. Torch appends `, seq = N`, `, op_id = N`, then `sizes`/`input_op_ids`
/// lists, to the operator's name. Operators (`aten::mul`, `torch::autograd::AccumulateGrad`, the
/// `MulBackward0` autograd nodes, `autograd::engine::evaluate_function: MulBackward0`) become host
/// operators, as Kineto records them (`cpu_op`); anything else (a `record_function` scope) stays an
/// annotation, under its name without the suffix (Kineto's `user_annotation`).
pub fn torch_nvtx_range(name: &str) -> Option<(bool, &str)> {
    let cut = [", seq = ", ", op_id = "]
        .iter()
        .filter_map(|m| name.find(m).filter(|&p| digits_follow(&name[p + m.len()..])))
        .min()?;
    let head = &name[..cut];
    if head.is_empty() {
        return None;
    }
    let op = head.contains("::") || is_backward_node(head);
    Some((op, head))
}

fn digits_follow(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_digit())
}

/// `MulBackward0`, `AddmmBackward1`: an autograd node name.
fn is_backward_node(s: &str) -> bool {
    let t = s.trim_end_matches(|c: char| c.is_ascii_digit());
    t.len() < s.len() && t.ends_with("Backward") && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The demangled kernel name, or `None` when `name` is not an Itanium-mangled symbol.
pub fn demangle_kernel(name: &str) -> Option<String> {
    if !name.starts_with("_Z") {
        return None;
    }
    // cpp_demangle's default recursion limits guard the stack; a panic inside it (a name it does not
    // expect) must not fail the whole file: the raw name is kept.
    std::panic::catch_unwind(|| {
        let sym = Symbol::new(name.as_bytes()).ok()?;
        let s = sym.demangle_with_options(&DemangleOptions::new()).ok()?;
        (!s.is_empty()).then_some(s)
    })
    .ok()
    .flatten()
}

/// The qualified name at the front of a mangled symbol, for a name `demangle_kernel` cannot read
/// (newer manglings such as clang's `Tn` template-parameter declarations, which cpp_demangle 0.5 and
/// binutils' c++filt of this machine both refuse): `_ZN7sgl_hip10activation18act_and_mul_kernelI...`
/// -> `sgl_hip::activation::act_and_mul_kernel`. Reads `_Z`, an optional `N`, then source names
/// (`<length><identifier>`) up to the first thing that is not one (template arguments `I`, the end
/// `E`, parameter types); `None` when there is no source name.
pub fn mangled_prefix(name: &str) -> Option<String> {
    let rest = name.strip_prefix("_Z")?;
    // (without `N` the name is one source name, and what follows it the parameter types)
    let nested = rest.starts_with('N');
    let mut b = rest.strip_prefix('N').unwrap_or(rest).as_bytes();
    let mut parts: Vec<&str> = Vec::new();
    while let Some(d) = b.iter().position(|c| !c.is_ascii_digit()) {
        if !nested && !parts.is_empty() {
            break;
        }
        if d == 0 || d > 4 {
            break;
        }
        let len: usize = std::str::from_utf8(&b[..d]).ok()?.parse().ok()?;
        if len == 0 || d + len > b.len() {
            break;
        }
        let id = std::str::from_utf8(&b[d..d + len]).ok()?;
        if !id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
            break;
        }
        parts.push(id);
        b = &b[d + len..];
    }
    (!parts.is_empty()).then(|| parts.join("::"))
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
    fn torch_ranges() {
        let f = torch_nvtx_range;
        assert_eq!(f("aten::mul, seq = 12, op_id = 345"), Some((true, "aten::mul")));
        assert_eq!(
            f("torchvision::_cuda_version, op_id = 1"),
            Some((true, "torchvision::_cuda_version"))
        );
        assert_eq!(
            f("aten::linear, op_id = 9, sizes = [[2, 3], [4, 3]], input_op_ids = [1, 2]"),
            Some((true, "aten::linear"))
        );
        assert_eq!(
            f("torch::autograd::AccumulateGrad, op_id = 10"),
            Some((true, "torch::autograd::AccumulateGrad"))
        );
        assert_eq!(f("MulBackward0, seq = 12, op_id = 9"), Some((true, "MulBackward0")));
        assert_eq!(
            f("autograd::engine::evaluate_function: MulBackward0, op_id = 3"),
            Some((true, "autograd::engine::evaluate_function: MulBackward0"))
        );
        assert_eq!(f("my_scope, op_id = 11"), Some((false, "my_scope")));
        assert_eq!(f("LlamaAttention"), None);
        assert_eq!(f("a::b, c = 1"), None);
        assert_eq!(f("a::b, seq = x"), None);
        assert_eq!(f(", seq = 1"), None);
    }

    #[test]
    fn kernels() {
        assert_eq!(demangle_kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"), None);
        assert_eq!(demangle_kernel("_Zgarbage"), None);
        assert_eq!(demangle_kernel("_Z6kernelPfi").as_deref(), Some("kernel(float*, int)"));
        assert_eq!(
            mangled_prefix("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i").as_deref(),
            Some("sgl_hip::activation::act_and_mul_kernel")
        );
        assert_eq!(mangled_prefix("_Z6kernelPfi").as_deref(), Some("kernel"));
        // not nested: the parameter types' names are not more of the name
        assert_eq!(
            mangled_prefix("_Z11some_kernel6ParamsTn").as_deref(),
            Some("some_kernel")
        );
        assert_eq!(mangled_prefix("_Zgarbage"), None);
        assert_eq!(mangled_prefix("_ZN99short"), None); // (a length past the end)
        assert_eq!(mangled_prefix("nvjet_sm90_tst"), None);
    }
}

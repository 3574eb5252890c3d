//! Symbol normalization: turn an event's (layer, name) into a canonical symbol `layer:name` that is
//! stable across runs, so a tokenizer sees one symbol per *kind* of event, not per instance.
//!
//! Rules (each can be switched off in [`NormalizeOptions`]; documented in docs/normalization.md):
//! * kernels: drop a leading return type (`void `), every bracketed part (template arguments `<...>`,
//!   parameter lists `(...)`, `{lambda()#1}`, `(anonymous namespace)`), and namespaces; then collapse
//!   tile-shape numbers (`128x64x32` -> `*`) and Triton's per-graph numeric suffix (`triton_poi_fused_add_3`
//!   -> `triton_poi_fused_add`).
//! * annotations, GPU annotations and markers: digit runs become `N` (`ProfilerStep#12` ->
//!   `ProfilerStep#N`, `layers.3.mlp` -> `layers.N.mlp`).
//! * Python functions: `path/to/file.py(123): fn` -> `file.py:fn`.
//! * runtime/driver calls, host operators, memcpy/memset: kept as they are.
//! * every canonical name is cut to `max_len` bytes (on a char boundary).

/// The version of these rules: raised whenever a name's symbol changes, so a tokenizer trained on
/// older symbols can say so (`teller.tpe`). 1: until 2026-12-06; 2: mangled kernel names are
/// demangled (or cut to their front part) before the kernel rules.
pub const VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct NormalizeOptions {
    pub strip_namespaces: bool,
    pub collapse_tiles: bool,
    pub collapse_digits: bool,
    pub max_len: usize,
}

impl Default for NormalizeOptions {
    fn default() -> Self {
        NormalizeOptions {
            strip_namespaces: true,
            collapse_tiles: true,
            collapse_digits: true,
            max_len: 160,
        }
    }
}

use crate::model::Layer;

/// The canonical name of a kernel.
pub fn canonical_kernel(name: &str, opts: &NormalizeOptions) -> String {
    // A trace may carry a kernel's mangled name: Kineto passes on what the runtime reports, and some
    // kernels arrive mangled (CUTLASS kernels under cuDNN, AMD's aiter and SGLang's HIP kernels:
    // `_ZN5aiter24add_rmsnorm_quant_kernelIDF16b...`). The rules below work on the demangled form,
    // where the template arguments are brackets to drop; on the mangled one they are letters, and
    // every instantiation would be its own symbol. (Demangled once per distinct name.)
    // (what no demangler here reads, newer manglings, is named by its qualified name's front part)
    let t = name.trim();
    // (a front part that is a generic wrapper, `cutlass::Kernel`, would name every instantiation
    // alike, the kernel it wraps being in the template arguments it does not read: kept raw)
    let front = || crate::names::mangled_prefix(t).filter(|p| !is_wrapper(p));
    match crate::names::demangle_kernel(t).or_else(front) {
        Some(d) => canonical_demangled(&d, opts),
        None => canonical_demangled(name, opts),
    }
}

fn canonical_demangled(name: &str, opts: &NormalizeOptions) -> String {
    let s = name.trim();
    // 1. drop bracketed parts at any depth: <...> (...) {...} [...]
    let mut out = String::with_capacity(s.len().min(256));
    let mut depth: i32 = 0;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'<' | b'(' | b'{' | b'[' => depth += 1,
            b'>' | b')' | b'}' | b']' => {
                if depth > 0 {
                    depth -= 1;
                } else if c != b'>' {
                    // stray closer: keep nothing of it
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        if depth == 0 && !matches!(c, b'<' | b'(' | b'{' | b'[') {
            // push the whole UTF-8 char
            let ch_len = utf8_len(c);
            out.push_str(&s[i..(i + ch_len).min(s.len())]);
            i += ch_len;
            continue;
        }
        i += 1;
    }
    // 2. return type and qualifiers: keep the last whitespace-separated token.
    let mut tok = out.split_whitespace().last().unwrap_or("").to_string();
    // 3. tidy namespace separators left by dropped parts ("at::native::::f" -> "at::native::f")
    while tok.contains("::::") {
        tok = tok.replace("::::", "::");
    }
    let tok = tok.trim_matches(':').to_string();
    let mut tok = if opts.strip_namespaces {
        tok.rsplit("::").next().unwrap_or("").to_string()
    } else {
        tok
    };
    if tok.is_empty() {
        tok = name.trim().to_string();
    }
    // Generic wrappers (`cutlass::Kernel<cutlass_tensorop_s1688gemm_...>`, `device_kernel<...>`) carry
    // the kernel's identity in their first template argument (that is not a number): name them by it.
    // (the first argument that names something: composable_kernel's `kentry<256, 1, Kernel>` puts
    // its launch bounds first)
    if is_wrapper(&tok) {
        for arg in template_args(s) {
            let literal = arg.trim_end_matches(|c: char| c.is_ascii_alphabetic()); // (`3ul`)
            if arg.is_empty()
                || matches!(arg, "true" | "false")
                || (!literal.is_empty() && literal.bytes().all(|c| c.is_ascii_digit() || c == b'-'))
            {
                continue;
            }
            let inner = canonical_kernel(arg, opts);
            if !inner.is_empty() && !is_wrapper(&inner) {
                return inner;
            }
            break;
        }
    }
    if opts.collapse_tiles {
        tok = collapse_tiles(&tok);
        if tok.starts_with("triton_") {
            if let Some(p) = tok.rfind('_') {
                if p + 1 < tok.len() && tok[p + 1..].bytes().all(|b| b.is_ascii_digit()) {
                    tok.truncate(p);
                }
            }
        }
    }
    tok
}

/// A generic wrapper's name (its last `::` part): one of `GENERIC_WRAPPERS`, or an architecture guard
/// such as CUTLASS 3's `enable_sm90_or_later<Kernel>` (FlashAttention-3, vLLM's fp8 GEMMs), whose
/// every instantiation would otherwise be one symbol.
fn is_wrapper(tok: &str) -> bool {
    let last = tok.rsplit("::").next().unwrap_or(tok);
    GENERIC_WRAPPERS.contains(&last) || last.starts_with("enable_sm")
}

const GENERIC_WRAPPERS: &[&str] = &[
    // (`ck_tile::kentry<Kernel>`: composable_kernel's tile kernels, aiter's FMHA and GEMMs)
    "kentry",
    "Kernel",
    "Kernel2",
    "kernel",
    "device_kernel",
    "kernel_entry",
    "cutlass_kernel",
];

/// The top-level template arguments of a (possibly `void `-prefixed) kernel name, in order.
fn template_args(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let Some(open) = s.find('<') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = open + 1;
    for (i, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'<' | b'(' | b'{' | b'[' => depth += 1,
            b'>' | b')' | b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    out.push(s[start..i].trim());
                    return out;
                }
            }
            b',' if depth == 1 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

#[inline]
fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// Replaces runs like `128x64`, `64x8x1` (shape tuples) with `*`.
pub fn collapse_tiles(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_alphanumeric() || b[i - 1].is_ascii_alphabetic()) {
            // try to match \d+(x\d+)+
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let mut groups = 1;
            let mut k = j;
            while k + 1 < b.len() && b[k] == b'x' && b[k + 1].is_ascii_digit() {
                k += 1;
                while k < b.len() && b[k].is_ascii_digit() {
                    k += 1;
                }
                groups += 1;
                j = k;
            }
            if groups >= 2 {
                out.push('*');
                i = j;
                continue;
            }
            out.push_str(&s[i..j]);
            i = j;
            continue;
        }
        let l = utf8_len(b[i]);
        out.push_str(&s[i..(i + l).min(s.len())]);
        i += l;
    }
    out
}

/// Replaces every run of ASCII digits with `N`.
pub fn collapse_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                out.push('N');
                in_digits = true;
            }
        } else {
            in_digits = false;
            out.push(ch);
        }
    }
    out
}

/// `/a/b/scheduler.py(2919): _run_batch_inner` -> `scheduler.py:_run_batch_inner`.
pub fn canonical_python(name: &str) -> String {
    if let Some((loc, func)) = name.split_once("): ") {
        if let Some((file, line)) = loc.rsplit_once('(') {
            if line.bytes().all(|b| b.is_ascii_digit()) {
                let base = file.rsplit('/').next().unwrap_or(file);
                return format!("{base}:{}", func.trim());
            }
        }
    }
    name.trim().to_string()
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut k = max;
        while !s.is_char_boundary(k) {
            k -= 1;
        }
        s.truncate(k);
    }
    s
}

/// The canonical name of any event (without the layer prefix).
pub fn canonical_name(layer: Layer, name: &str, opts: &NormalizeOptions) -> String {
    let s = match layer {
        Layer::Kernel => canonical_kernel(name, opts),
        Layer::Annotation | Layer::GpuAnnotation | Layer::Marker | Layer::Other => {
            if opts.collapse_digits {
                collapse_digits(name.trim())
            } else {
                name.trim().to_string()
            }
        }
        Layer::Python => {
            let p = canonical_python(name);
            if opts.collapse_digits {
                collapse_digits(&p)
            } else {
                p
            }
        }
        _ => name.trim().to_string(),
    };
    cut(s, opts.max_len)
}

/// The symbol string `layer:canonical`.
pub fn symbol(layer: Layer, name: &str, opts: &NormalizeOptions) -> String {
    format!("{}:{}", layer.name(), canonical_name(layer, name, opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels() {
        let o = NormalizeOptions::default();
        assert_eq!(
            canonical_kernel("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, cudnnTensorStruct, float const*)", &o),
            "bn_bw_1C11_kernel_new"
        );
        assert_eq!(
            canonical_kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2> >(int)", &o),
            "multi_tensor_apply_kernel"
        );
        assert_eq!(
            canonical_kernel("nvjet_sm103_tst_64x8_64x16_1x4_h_bz_TNT", &o),
            "nvjet_sm103_tst_*_*_*_h_bz_TNT"
        );
        assert_eq!(
            canonical_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", &o),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize*_warpgroupsize*_execute_segment_k_off_kernel__5x_cublas"
        );
        assert_eq!(canonical_kernel("ampere_sgemm_128x64_nn", &o), "ampere_sgemm_*_nn");
        // architecture guards and composable_kernel's entry are wrappers too
        assert_eq!(
            canonical_kernel("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<int, int, int>>>>>(flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<int>>::Params)", &o),
            "FlashAttnFwdSm90"
        );
        assert_eq!(canonical_kernel("void cutlass::Kernel<Foo<3ul>>(int)", &o), "Foo");
        assert_eq!(
            canonical_kernel("void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVS<int>>>(ck_tile::FmhaFwdKernel<int>::Kargs)", &o),
            "FmhaFwdKernel"
        );
        // mangled names (as some Kineto traces carry them): demangled, then the same rules
        for (mangled, want) in [
            (
                "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
                "add_rmsnorm_quant_kernel",
            ),
            (
                "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
                "add_rmsnorm_quant_kernel",
            ),
            (
                "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
                "act_and_mul_kernel",
            ),
            ("_Z6kernelPfi", "kernel"),
            // a wrapper the demangler cannot read (clang's Tn) is kept whole, not named `Kernel`
            (
                "_ZN7cutlass6KernelIN4gemm4GemmEEvTnPFvvEXadL_Z1fvEE",
                "_ZN7cutlass6KernelIN4gemm4GemmEEvTnPFvvEXadL_Z1fvEE",
            ),
            // not a valid mangling: kept as it is
            ("_Zgarbage", "_Zgarbage"),
        ] {
            assert_eq!(canonical_kernel(mangled, &o), want, "{mangled}");
        }
        assert_eq!(
            canonical_kernel("triton_red_fused_add_mean_3", &o),
            "triton_red_fused_add_mean"
        );
        let keep = NormalizeOptions {
            strip_namespaces: false,
            ..o.clone()
        };
        assert_eq!(
            canonical_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, at::native::FillFunctor<float>)", &keep),
            "at::native::vectorized_elementwise_kernel"
        );
    }

    #[test]
    fn others() {
        let o = NormalizeOptions::default();
        assert_eq!(
            symbol(Layer::Annotation, "ProfilerStep#12", &o),
            "annotation:ProfilerStep#N"
        );
        assert_eq!(
            symbol(
                Layer::Python,
                "/sgl/sglang/srt/managers/scheduler.py(2919): _run_batch_inner",
                &o
            ),
            "python:scheduler.py:_run_batch_inner"
        );
        assert_eq!(
            symbol(Layer::Runtime, "cudaLaunchKernel", &o),
            "runtime:cudaLaunchKernel"
        );
        assert_eq!(
            symbol(Layer::Memcpy, "Memcpy HtoD (Pageable -> Device)", &o),
            "memcpy:Memcpy HtoD (Pageable -> Device)"
        );
        let long = "k".repeat(6000);
        assert_eq!(symbol(Layer::Kernel, &long, &o).len(), "kernel:".len() + 160);
    }
}

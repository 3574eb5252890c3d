//! The demangler against Kineto's names for the same kernels, captured on a GPU machine (an H200,
//! CUDA 13.0, torch 2.11: a Llama decode under `teller collect` and under `torch.profiler`, kernels
//! paired by their order in one decode step). `tests/data/gpu/README.md` has the provenance.
use teller_core::model::Layer;
use teller_core::names::demangle_kernel;
use teller_core::normalize::{symbol, NormalizeOptions};

#[test]
fn demangled_names_match_kineto() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/gpu/h200_kernel_names.json"
    );
    let text = std::fs::read_to_string(path).expect("fixture");
    let pairs: Vec<serde_json::Value> = serde_json::from_str(&text).expect("json");
    assert_eq!(pairs.len(), 65);
    let mut mangled = 0;
    let mut bad = vec![];
    for p in &pairs {
        let cupti = p["cupti"].as_str().unwrap();
        let kineto = p["kineto"].as_str().unwrap();
        let got = demangle_kernel(cupti).unwrap_or_else(|| cupti.to_string());
        let o = NormalizeOptions::default();
        if symbol(Layer::Kernel, &got, &o) != symbol(Layer::Kernel, kineto, &o) {
            bad.push(format!(
                "{cupti}\n  ours:   {}\n  kineto: {}",
                symbol(Layer::Kernel, &got, &o),
                symbol(Layer::Kernel, kineto, &o)
            ));
        }
        mangled += cupti.starts_with("_Z") as usize;
    }
    assert!(
        bad.is_empty(),
        "{} of {} differ:\n{}",
        bad.len(),
        pairs.len(),
        bad.join("\n")
    );
    assert_eq!(mangled, 55);
}

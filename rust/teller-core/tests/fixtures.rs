//! The real profiler traces in tests/data/traces all load, link and align.
use teller_core::{load, LoadOptions};

fn fixture(name: &str) -> String {
    format!("{}/../../tests/data/traces/{}", env!("CARGO_MANIFEST_DIR"), name)
}

#[test]
fn all_fixtures_load() {
    for (f, min_events) in [
        ("a100_nccl_2rank.kineto.json.gz", 20000),
        ("b300_cuda13_moe.kineto.json.gz", 200),
        ("mi250_rocm62_tiny.kineto.json.gz", 100),
        ("mi300x_sglang_decode_hipgraph.kineto.json.gz", 1400),
        ("resnet50_2020_barelist.kineto.json.gz", 60000),
    ] {
        let t = load(&[fixture(f)], &LoadOptions::default()).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(t.len() >= min_events, "{f}: {} events", t.len());
        let s = teller_core::summary::summarize(&t, 5);
        assert!(s.gpu_events > 0, "{f}");
        assert!(s.linked_gpu_events > 0, "{f}: no GPU event linked");
        assert!(!t.steps.is_empty());
        // call-chain order
        assert!(t.ts.windows(2).all(|w| w[0] <= w[1]));
        eprintln!(
            "{f}: {} events, {} gpu, {} linked, {} steps, warnings {:?}",
            t.len(),
            s.gpu_events,
            s.linked_gpu_events,
            t.steps.len(),
            t.warnings
        );
    }
}

#[test]
fn graph_replay_links_many_kernels_to_few_launches() {
    let t = load(
        &[fixture("mi300x_sglang_decode_hipgraph.kineto.json.gz")],
        &LoadOptions::default(),
    )
    .unwrap();
    let mut launches = std::collections::HashSet::new();
    let mut linked = 0;
    for i in 0..t.len() {
        if t.layer_of(i) == teller_core::Layer::Kernel && t.link[i] >= 0 {
            linked += 1;
            launches.insert(t.link[i]);
        }
    }
    assert!(linked >= 500, "{linked}");
    assert!(launches.len() <= 20, "{}", launches.len());
}

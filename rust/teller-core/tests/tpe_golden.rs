//! Golden cross-check against the pure-Python reference (`python/teller/_reference/tpe.py`):
//! `tests/data/tpe/golden.json` was produced by `tests/data/tpe/make_golden.py`.

use serde_json::Value;
use teller_core::tpe::{token_features, train, SymbolStats, TrainConfig};

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

#[test]
fn rust_matches_python_reference() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tpe/golden.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let base = c["base_size"].as_u64().unwrap() as u32;
        let segs: Vec<Vec<u32>> = c["segments"].as_array().unwrap().iter().map(u32s).collect();
        let mut ids = Vec::new();
        let mut starts = Vec::new();
        for s in &segs {
            starts.push(ids.len());
            ids.extend_from_slice(s);
        }
        let cfg = TrainConfig {
            num_merges: c["num_merges"].as_u64().unwrap() as usize,
            min_frequency: c["min_frequency"].as_u64().unwrap(),
            max_token_events: c["max_token_events"].as_u64().map(|m| m as u32),
        };
        let out = train(&ids, &starts, base, &cfg, None).unwrap();
        let merges: Vec<(u32, u32)> = c["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m[0].as_u64().unwrap() as u32, m[1].as_u64().unwrap() as u32))
            .collect();
        assert_eq!(out.tpe.merges(), &merges[..], "case {name}: merges");
        let counts: Vec<u64> = c["merge_counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(out.merge_counts, counts, "case {name}: merge counts");
        for e in c["encodings"].as_array().unwrap() {
            let seg = u32s(&e["segment"]);
            let (t, o) = out.tpe.encode_segment(&seg).unwrap();
            assert_eq!(t, u32s(&e["tokens"]), "case {name}: tokens of {seg:?}");
            let o: Vec<u32> = o.iter().map(|&x| x as u32).collect();
            assert_eq!(o, u32s(&e["offsets"]), "case {name}: offsets of {seg:?}");
            assert_eq!(out.tpe.decode(&t).unwrap(), seg);
        }
        if let Some(feats) = c.get("features") {
            let dur: Vec<i64> = c["dur_ns"].as_array().unwrap().iter().flat_map(i64s).collect();
            let st: Vec<i64> = c["start_ns"].as_array().unwrap().iter().flat_map(i64s).collect();
            let stats = SymbolStats::from_corpus(&ids, &dur, base).unwrap();
            let exp_mean: Vec<f64> = c["stats"]["mean"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            let exp_std: Vec<f64> = c["stats"]["std"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            for k in 0..base as usize {
                assert!((stats.mean[k] - exp_mean[k]).abs() < 1e-9, "case {name}: mean[{k}]");
                assert!((stats.std[k] - exp_std[k]).abs() < 1e-7, "case {name}: std[{k}]");
            }
            let enc = out.tpe.encode(&ids, &starts).unwrap();
            let f = token_features(&ids, &dur, &st, &enc.token_offsets, &enc.segment_starts, &stats).unwrap();
            let rows = feats.as_array().unwrap();
            assert_eq!(f.len(), rows.len() * 5, "case {name}: feature rows");
            for (k, row) in rows.iter().enumerate() {
                for j in 0..5 {
                    let want = row[j].as_f64().unwrap();
                    let got = f[k * 5 + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "case {name}: feature [{k}][{j}] {got} vs {want}"
                    );
                }
            }
        }
    }
}

//! Unit tests and property tests of the TPE module.

use proptest::prelude::*;

use super::*;

fn flat(segs: &[Vec<u32>]) -> (Vec<u32>, Vec<usize>) {
    let mut ids = Vec::new();
    let mut starts = Vec::new();
    for s in segs {
        starts.push(ids.len());
        ids.extend_from_slice(s);
    }
    (ids, starts)
}

fn cfg(num_merges: usize, min_frequency: u64, max_token_events: Option<u32>) -> TrainConfig {
    TrainConfig {
        num_merges,
        min_frequency,
        max_token_events,
    }
}

/// Everything we can check about one corpus + config against the naive references.
fn check_all(segs: &[Vec<u32>], base_size: u32, c: &TrainConfig) {
    let (ids, starts) = flat(segs);
    let out = train_checked(&ids, &starts, base_size, c).unwrap();
    let expected = naive::train(segs, base_size, c);
    assert_eq!(out.tpe.merges(), &expected[..], "segments {segs:?} cfg {c:?}");
    let tpe = &out.tpe;
    // min_frequency / max_token_events respected.
    for &n in &out.merge_counts {
        assert!(n >= c.min_frequency.max(1));
    }
    if let Some(m) = c.max_token_events {
        assert!(tpe.token_lens().iter().all(|&l| l <= m.max(1)));
    }
    // Encoder == naive encoder; round trip.
    for s in segs {
        let (t, o) = tpe.encode_segment(s).unwrap();
        let (nt, no) = naive::encode(s, tpe.merges(), base_size);
        assert_eq!((&t, &o), (&nt, &no), "segment {s:?} merges {:?}", tpe.merges());
        assert_eq!(tpe.encode_segment_heap(s).unwrap(), (nt, no));
        assert_eq!(&tpe.decode(&t).unwrap(), s);
        for k in 0..t.len() {
            assert_eq!(tpe.token_lens()[t[k] as usize] as usize, o[k + 1] - o[k]);
        }
    }
    // Batch encoding == per-segment encoding; no token crosses a segment boundary.
    let enc = tpe.encode(&ids, &starts).unwrap();
    for dedupe in [false, true] {
        for algo in [Algo::Bucket, Algo::Backtrack] {
            assert_eq!(
                enc,
                tpe.encode_opts(&ids, &starts, dedupe, algo).unwrap(),
                "dedupe {dedupe} {algo:?}"
            );
        }
    }
    assert_eq!(enc.segment_starts.len(), segs.len());
    assert_eq!(enc.token_offsets.len(), enc.tokens.len() + 1);
    assert_eq!(tpe.decode(&enc.tokens).unwrap(), ids);
    for (i, s) in segs.iter().enumerate() {
        let t0 = enc.segment_starts[i];
        let t1 = enc.segment_starts.get(i + 1).copied().unwrap_or(enc.tokens.len());
        let (t, o) = tpe.encode_segment(s).unwrap();
        assert_eq!(&enc.tokens[t0..t1], &t[..]);
        let rel: Vec<usize> = enc.token_offsets[t0..=t1].iter().map(|&x| x - starts[i]).collect();
        if t1 > t0 {
            assert_eq!(rel, o);
        }
    }
}

#[test]
fn overlapping_runs() {
    for n in 0..9 {
        check_all(&[vec![0; n]], 1, &cfg(5, 1, None));
        check_all(&[vec![0; n], vec![0; n + 1], vec![1, 0, 0, 0, 1]], 2, &cfg(5, 1, None));
    }
    // "a a a a": one merge of (a,a) gives [c, c], the second (c,c) gives one token.
    let out = train(&[0, 0, 0, 0], &[0], 1, &cfg(10, 1, None), None).unwrap();
    assert_eq!(out.tpe.merges(), &[(0, 0), (1, 1)]);
    assert_eq!(out.merge_counts, vec![3, 1]);
    let (t, o) = out.tpe.encode_segment(&[0, 0, 0, 0, 0]).unwrap();
    assert_eq!(t, vec![2, 0]);
    assert_eq!(o, vec![0, 4, 5]);
    check_all(&[vec![0, 1, 0, 1, 0, 1, 0], vec![1, 0, 1, 0]], 2, &cfg(10, 1, None));
}

#[test]
fn unlimited_merges() {
    let out = train(&[0, 1, 0, 1, 2, 2, 2], &[0], 3, &cfg(usize::MAX, 1, None), None).unwrap();
    let naive = naive::train(&[vec![0, 1, 0, 1, 2, 2, 2]], 3, &cfg(100, 1, None));
    assert_eq!(out.tpe.merges(), &naive[..]);
    assert!(matches!(
        train(&[], &[], u32::MAX, &cfg(1, 1, None), None),
        Err(TpeError::VocabTooLarge(_))
    ));
}

#[test]
fn tie_breaking_and_min_frequency() {
    // (0,1) and (2,3) both twice: the smaller pair wins first.
    let segs = vec![vec![2, 3, 0, 1], vec![2, 3, 0, 1]];
    let (ids, starts) = flat(&segs);
    let out = train(&ids, &starts, 4, &cfg(10, 2, None), None).unwrap();
    assert_eq!(out.tpe.merges()[0], (0, 1));
    assert_eq!(out.tpe.merges()[1], (2, 3));
    assert!(out.merge_counts.iter().all(|&c| c >= 2));
    // min_frequency 3: nothing occurs 3 times.
    let out = train(&ids, &starts, 4, &cfg(10, 3, None), None).unwrap();
    assert!(out.tpe.merges().is_empty());
}

#[test]
fn max_token_events_respected() {
    let segs = vec![vec![0; 64]; 3];
    let (ids, starts) = flat(&segs);
    for m in 0..9 {
        let out = train(&ids, &starts, 1, &cfg(20, 1, Some(m)), None).unwrap();
        assert!(out.tpe.token_lens().iter().all(|&l| l <= m.max(1)), "max {m}");
        check_all(&segs, 1, &cfg(20, 1, Some(m)));
    }
}

#[test]
fn merges_do_not_cross_segments() {
    // (0,1) only occurs across the boundary.
    let out = train(&[0, 0, 1, 1], &[0, 2], 2, &cfg(10, 1, None), None).unwrap();
    assert_eq!(out.tpe.merges(), &[(0, 0), (1, 1)]);
    let enc = out.tpe.encode(&[0, 1, 0, 1], &[0, 1, 2, 3]).unwrap();
    assert_eq!(enc.tokens, vec![0, 1, 0, 1]);
}

#[test]
fn empty_and_degenerate_inputs() {
    let out = train(&[], &[], 3, &cfg(10, 1, None), None).unwrap();
    assert!(out.tpe.merges().is_empty());
    let enc = out.tpe.encode(&[], &[]).unwrap();
    assert_eq!(enc.token_offsets, vec![0]);
    let enc = out.tpe.encode(&[1, 2], &[0, 0, 1, 2]).unwrap();
    assert_eq!(enc.segment_starts, vec![0, 0, 1, 2]);
    assert_eq!(enc.token_offsets, vec![0, 1, 2]);
    check_all(&[vec![], vec![1], vec![], vec![2, 2, 2]], 3, &cfg(3, 1, None));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(matches!(
        train(&[0, 5], &[0], 3, &cfg(1, 1, None), None),
        Err(TpeError::IdOutOfRange { index: 1, id: 5, .. })
    ));
    assert!(matches!(
        train(&[0, 1], &[1], 3, &cfg(1, 1, None), None),
        Err(TpeError::BadOffsets { .. })
    ));
    // the messages say the values (Python users read them), not Rust's `Some(2)` / `None`
    let msg = segment_bounds(4, &[2, 4]).unwrap_err().to_string();
    assert!(msg.contains("must start at 0, got 2") && !msg.contains("Some"), "{msg}");
    let msg = segment_bounds(4, &[]).unwrap_err().to_string();
    assert!(
        msg.contains("no segment starts for 4 events") && !msg.contains("None"),
        "{msg}"
    );
    assert!(matches!(
        train(&[0, 1], &[0, 3], 3, &cfg(1, 1, None), None),
        Err(TpeError::BadOffsets { .. })
    ));
    assert!(matches!(
        train(&[0, 1, 2], &[0, 2, 1], 3, &cfg(1, 1, None), None),
        Err(TpeError::BadOffsets { .. })
    ));
    assert!(matches!(
        Tpe::new(2, vec![(0, 2)]),
        Err(TpeError::BadMerge { rank: 0, .. })
    ));
    assert!(matches!(Tpe::new(2, vec![(0, 1), (0, 1)]), Err(TpeError::BadConfig(_))));
    assert!(Tpe::new(2, vec![(0, 1), (2, 2)]).is_ok());
    assert!(matches!(
        Tpe::new(u32::MAX - 2, vec![(0, 1); 3]),
        Err(TpeError::VocabTooLarge(_))
    ));
    let tpe = Tpe::new(2, vec![(0, 1)]).unwrap();
    assert!(matches!(
        tpe.decode(&[0, 3]),
        Err(TpeError::TokenOutOfRange { index: 1, .. })
    ));
    assert!(matches!(tpe.encode(&[0, 2], &[0]), Err(TpeError::IdOutOfRange { .. })));
    assert!(matches!(tpe.encode_segment(&[7]), Err(TpeError::IdOutOfRange { .. })));
    let stats = SymbolStats::from_corpus(&[0, 1], &[10, 20], 2).unwrap();
    assert!(matches!(
        token_features(&[0, 1], &[1], &[0, 0], &[0, 2], &[0], &stats),
        Err(TpeError::LengthMismatch { .. })
    ));
    assert!(matches!(
        token_features(&[0, 1], &[1, 1], &[0, 0], &[0, 1], &[0], &stats),
        Err(TpeError::BadOffsets { .. })
    ));
    assert!(matches!(
        token_features(&[0, 1], &[1, 1], &[0, 0], &[0, 1, 1, 2], &[0], &stats),
        Err(TpeError::BadOffsets { .. })
    ));
    assert!(matches!(map_rare_symbols(&[0], 2, 1, 2), Err(TpeError::BadConfig(_))));
    assert_eq!(starts_from_i64(&[0, 5]).unwrap(), vec![0, 5]);
    assert!(matches!(
        starts_from_i64(&[0, -1]),
        Err(TpeError::BadOffsets { index: 1, .. })
    ));
}

#[test]
fn cancel_from_progress() {
    let segs = vec![vec![0, 1, 2, 3, 0, 1, 2, 3]];
    let (ids, starts) = flat(&segs);
    let mut seen = Vec::new();
    let mut cb = |d: usize, t: usize| {
        seen.push((d, t));
        d < 2
    };
    let r = train(&ids, &starts, 4, &cfg(5, 1, None), Some(&mut cb));
    assert_eq!(r.unwrap_err(), TpeError::Cancelled(2));
    assert_eq!(seen, vec![(1, 5), (2, 5)]);
}

#[test]
fn rare_symbols_to_unk() {
    let r = map_rare_symbols(&[0, 1, 1, 2, 3, 3, 3], 5, 2, 0).unwrap();
    assert_eq!(r.ids, vec![0, 1, 1, 0, 3, 3, 3]);
    assert_eq!(r.symbol_counts, vec![1, 2, 1, 3, 0]);
    assert_eq!(r.rare, vec![2]);
}

#[test]
fn training_is_independent_of_thread_count() {
    let corpus = synth::generate(&synth::SynthConfig {
        n_events: 60_000,
        step_events: 600,
        n_symbols: 300,
        ..Default::default()
    });
    let c = cfg(400, 2, Some(64));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let out = train(&corpus.ids, &corpus.starts, corpus.base_size, &c, None).unwrap();
            let enc = out.tpe.encode(&corpus.ids, &corpus.starts).unwrap();
            let stats = SymbolStats::from_corpus(&corpus.ids, &corpus.dur_ns, corpus.base_size).unwrap();
            let f = enc
                .features(&corpus.ids, &corpus.dur_ns, &corpus.start_ns, &stats)
                .unwrap();
            (
                out.tpe.merges().to_vec(),
                out.merge_counts,
                enc,
                f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            )
        })
    };
    let one = run(1);
    assert_eq!(one.0.len(), 400);
    assert_eq!(one, run(2));
    assert_eq!(one, run(3));
}

#[test]
fn synth_corpus_roundtrip_and_encoder_vs_naive() {
    let corpus = synth::generate(&synth::SynthConfig {
        n_events: 20_000,
        step_events: 300,
        n_symbols: 200,
        ..Default::default()
    });
    assert_eq!(
        corpus,
        synth::generate(&synth::SynthConfig {
            n_events: 20_000,
            step_events: 300,
            n_symbols: 200,
            ..Default::default()
        })
    );
    let out = train_checked(&corpus.ids, &corpus.starts, corpus.base_size, &cfg(60, 2, None)).unwrap();
    let bounds = segment_bounds(corpus.ids.len(), &corpus.starts).unwrap();
    let segs: Vec<Vec<u32>> = bounds.iter().map(|&(s, e)| corpus.ids[s..e].to_vec()).collect();
    assert_eq!(
        out.tpe.merges(),
        &naive::train(&segs, corpus.base_size, &cfg(60, 2, None))[..]
    );
    let enc = out.tpe.encode(&corpus.ids, &corpus.starts).unwrap();
    assert_eq!(out.tpe.decode(&enc.tokens).unwrap(), corpus.ids);
    for (i, s) in segs.iter().enumerate().take(10) {
        let (t, _) = naive::encode(s, out.tpe.merges(), corpus.base_size);
        let t0 = enc.segment_starts[i];
        assert_eq!(&enc.tokens[t0..t0 + t.len()], &t[..]);
    }
}

fn naive_features(
    ids: &[u32],
    dur: &[i64],
    start: &[i64],
    offs: &[usize],
    seg_tok: &[usize],
    st: &SymbolStats,
) -> Vec<f32> {
    let ld = |d: i64| (d.max(0) as f64 / 1000.0).ln_1p();
    let mut out = Vec::new();
    let n_tok = offs.len() - 1;
    for k in 0..n_tok {
        let first = seg_tok.contains(&k);
        let seg_ev_start = offs[*seg_tok.iter().filter(|&&t| t <= k).max().unwrap()];
        let (s, e) = (offs[k], offs[k + 1]);
        let xs: Vec<f64> = (s..e).map(|j| ld(dur[j])).collect();
        let zs: Vec<f64> = (s..e)
            .map(|j| {
                let y = ids[j] as usize;
                if st.count[y] == 0 {
                    0.0
                } else {
                    (ld(dur[j]) - st.mean[y]) / st.std[y].max(features::STD_FLOOR)
                }
            })
            .collect();
        let gap = if first {
            0.0
        } else {
            // the previous event's end if it ended before this token, else its start (it encloses it)
            let p = s - 1;
            assert!(p >= seg_ev_start);
            let pe = start[p] + dur[p].max(0);
            let anchor = if pe <= start[s] { pe } else { start[p] };
            ((start[s] - anchor).max(0) as f64 / 1000.0).ln_1p()
        };
        out.extend_from_slice(&[
            (e - s) as f32,
            xs.iter().sum::<f64>() as f32,
            xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32,
            zs.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32,
            gap as f32,
        ]);
    }
    out
}

#[test]
fn features_hand_computed() {
    // Two symbols; durations 1000 ns = 1 µs -> ln 2.
    let ids = [0, 1, 0, 1, 0];
    let dur = [1000, 3000, 1000, -5, 1000];
    let start = [0, 1000, 10_000, 11_000, 0];
    let stats = SymbolStats::from_corpus(&ids, &dur, 3).unwrap();
    assert_eq!(stats.count, vec![3, 2, 0]);
    assert!((stats.mean[0] - 2f64.ln()).abs() < 1e-12);
    assert!(stats.std[0].abs() < 1e-6);
    // tokens: [0,1] [0,1] | [0]
    let f = token_features(&ids, &dur, &start, &[0, 2, 4, 5], &[0, 2], &stats).unwrap();
    assert_eq!(f.len(), 15);
    let l2 = 2f64.ln();
    let l4 = 4f64.ln();
    assert_eq!(f[0], 2.0);
    assert!((f[1] as f64 - (l2 + l4)).abs() < 1e-6);
    assert!((f[2] as f64 - l4).abs() < 1e-6);
    // symbol 1: x = ln4, 0 -> mean ln2, std ln2; z(ln4) = 1.
    assert!((f[3] as f64 - 1.0).abs() < 1e-6);
    assert_eq!(f[4], 0.0);
    // gap: the previous event ended at 4000: 10_000 - 4000 = 6000 ns = 6 µs.
    assert!((f[9] as f64 - 7f64.ln()).abs() < 1e-6);
    assert_eq!(f[14], 0.0); // first token of the second segment
    let offs = [0, 2, 4, 5];
    assert_eq!(f, naive_features(&ids, &dur, &start, &offs, &[0, 2], &stats));
}

#[test]
fn features_match_naive_on_synth() {
    let corpus = synth::generate(&synth::SynthConfig {
        n_events: 5_000,
        step_events: 200,
        n_symbols: 100,
        ..Default::default()
    });
    let out = train(
        &corpus.ids,
        &corpus.starts,
        corpus.base_size,
        &cfg(50, 2, Some(16)),
        None,
    )
    .unwrap();
    let enc = out.tpe.encode(&corpus.ids, &corpus.starts).unwrap();
    let stats = SymbolStats::from_corpus(&corpus.ids, &corpus.dur_ns, corpus.base_size).unwrap();
    let f = enc
        .features(&corpus.ids, &corpus.dur_ns, &corpus.start_ns, &stats)
        .unwrap();
    let g = naive_features(
        &corpus.ids,
        &corpus.dur_ns,
        &corpus.start_ns,
        &enc.token_offsets,
        &enc.segment_starts,
        &stats,
    );
    assert_eq!(f, g);
}

fn corpus_strategy() -> impl Strategy<Value = (u32, Vec<Vec<u32>>)> {
    (1u32..6).prop_flat_map(|base| {
        (
            Just(base),
            prop::collection::vec(prop::collection::vec(0..base, 0..24), 0..7),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn prop_matches_naive(
        (base, segs) in corpus_strategy(),
        num_merges in 0usize..14,
        min_frequency in 0u64..4,
        max_tok in prop::option::of(0u32..6),
        dup in 0usize..3,
    ) {
        // Duplicate some segments so the dedupe/weights path is exercised.
        let mut segs = segs;
        let k = segs.len().min(dup);
        let extra: Vec<Vec<u32>> = segs[..k].to_vec();
        segs.extend(extra);
        check_all(&segs, base, &cfg(num_merges, min_frequency, max_tok));
    }

    #[test]
    fn prop_encode_decode_any_merges(
        (base, segs) in corpus_strategy(),
        raw in prop::collection::vec((0u32..1000, 0u32..1000), 0..20),
    ) {
        // Arbitrary (valid) merge lists, not only trained ones.
        let mut merges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (a, b) in raw {
            let lim = base + merges.len() as u32;
            let p = (a % lim, b % lim);
            if seen.insert(p) {
                merges.push(p);
            }
        }
        let tpe = Tpe::new(base, merges).unwrap();
        for s in &segs {
            let (t, o) = tpe.encode_segment(s).unwrap();
            prop_assert_eq!((t.clone(), o), naive::encode(s, tpe.merges(), base));
            prop_assert_eq!(tpe.encode_segment_heap(s).unwrap(), naive::encode(s, tpe.merges(), base));
            prop_assert_eq!(&tpe.decode(&t).unwrap(), s);
        }
        let (ids, starts) = flat(&segs);
        let a = tpe.encode_opts(&ids, &starts, false, Algo::Bucket).unwrap();
        let b = tpe.encode_opts(&ids, &starts, false, Algo::Backtrack).unwrap();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn wide_vocabulary_rank_table() {
    // Ids above 2^16 use the wide rank-table layout.
    let base = 70_000u32;
    let segs: Vec<Vec<u32>> = (0..6u32)
        .map(|k| (0..40u32).map(|i| 69_990 + (i * (k + 3) + i / 3) % 10).collect())
        .collect();
    check_all(&segs, base, &cfg(30, 1, None));
    let (ids, starts) = flat(&segs);
    let out = train(&ids, &starts, base, &cfg(30, 1, None), None).unwrap();
    assert_eq!(out.tpe.merges().len(), 30);
    assert!(out.tpe.vocab_size() > 1 << 16);
}

#[test]
fn vocabulary_of_exactly_65536_ids() {
    // Id 65535 exists: the compact rank table would key (65535, 65535) as an empty slot (a wrong
    // rank, then an index panic in the bucket and heap encoders).
    let base = 65_536 - 27;
    let mut merges = vec![(0, 0)];
    merges.extend((0..25).map(|k| (base + k, base + k)));
    merges.push((1, 1)); // id 65535
    let tpe = Tpe::new(base, merges).unwrap();
    assert_eq!(tpe.vocab_size(), 1 << 16);
    assert_eq!(tpe.rank(65_535, 65_535), None);
    assert_eq!(tpe.rank(1, 1), Some(26));
    for algo in [Algo::Bucket, Algo::Backtrack] {
        let out = tpe.encode_opts(&[1, 1, 1, 1], &[0], false, algo).unwrap();
        assert_eq!(out.tokens, [65_535, 65_535], "{algo:?}");
    }
    assert_eq!(tpe.encode_segment_heap(&[1, 1, 1, 1]).unwrap().0, [65_535, 65_535]);
}

#[test]
fn token_length_overflow_is_refused() {
    // 32 doubling merges make a token of 2^32 events: more than its u32 length holds
    let merges: Vec<(u32, u32)> = (0..32u32).map(|k| if k == 0 { (0, 0) } else { (k, k) }).collect();
    let e = Tpe::new(1, merges).unwrap_err().to_string();
    assert!(
        e.contains("merge of rank 31 (31, 31) makes a token of more than"),
        "{e}"
    );
    let ok: Vec<(u32, u32)> = (0..31u32).map(|k| if k == 0 { (0, 0) } else { (k, k) }).collect();
    assert_eq!(Tpe::new(1, ok).unwrap().token_lens()[31], 1 << 31);
}

#[test]
fn backtracking_equals_bucket_on_synth() {
    for (noise, max_tok) in [(0.01, None), (0.05, Some(16)), (0.2, None)] {
        let corpus = synth::generate(&synth::SynthConfig {
            n_events: 80_000,
            step_events: 700,
            n_symbols: 200,
            noise_prob: noise,
            variant_prob: 0.3,
            ..Default::default()
        });
        let out = train(
            &corpus.ids,
            &corpus.starts,
            corpus.base_size,
            &cfg(1500, 2, max_tok),
            None,
        )
        .unwrap();
        let a = out
            .tpe
            .encode_opts(&corpus.ids, &corpus.starts, false, Algo::Bucket)
            .unwrap();
        let b = out
            .tpe
            .encode_opts(&corpus.ids, &corpus.starts, false, Algo::Backtrack)
            .unwrap();
        assert_eq!(a, b);
        // Other inputs than the training corpus.
        let other = synth::generate(&synth::SynthConfig {
            seed: 7,
            n_events: 20_000,
            step_events: 500,
            n_symbols: 200,
            noise_prob: 0.1,
            ..Default::default()
        });
        let a = out
            .tpe
            .encode_opts(&other.ids, &other.starts, false, Algo::Bucket)
            .unwrap();
        let b = out
            .tpe
            .encode_opts(&other.ids, &other.starts, false, Algo::Backtrack)
            .unwrap();
        assert_eq!(a, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Long segments over tiny alphabets with many arbitrary merges: the hardest case for the
    /// backtracking encoder (many invalid tokens, deep backtracking).
    #[test]
    fn prop_backtrack_equals_naive_long(
        base in 1u32..4,
        seg in prop::collection::vec(0u32..4, 0..120),
        raw in prop::collection::vec((0u32..10_000, 0u32..10_000), 0..60),
    ) {
        let seg: Vec<u32> = seg.into_iter().map(|x| x % base).collect();
        let mut merges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (a, b) in raw {
            // Prefer recent tokens so that long tokens exist.
            let lim = base + merges.len() as u32;
            let pick = |x: u32| if x % 3 < 1 { x % lim } else { lim - 1 - (x % lim.min(4)) };
            let p = (pick(a), pick(b));
            if seen.insert(p) {
                merges.push(p);
            }
        }
        let tpe = Tpe::new(base, merges).unwrap();
        let (t, o) = naive::encode(&seg, tpe.merges(), base);
        let enc = tpe.encode_opts(&seg, &[0], false, Algo::Backtrack).unwrap();
        prop_assert_eq!(&enc.tokens, &t);
        prop_assert_eq!(&enc.token_offsets, &o);
    }
}

#[test]
fn huge_tokens_fall_back_to_the_bucket_encoder() {
    // Doubling tokens: lengths 2, 4, ..., 2^26: the trie would be too large.
    let merges: Vec<(u32, u32)> = (0..26u32).map(|r| (r, r)).collect();
    let tpe = Tpe::new(1, merges).unwrap();
    assert!(tpe.backtrack_tables().is_none());
    let seg = vec![0u32; 1000];
    let (t, o) = tpe.encode_segment(&seg).unwrap();
    assert_eq!((t.clone(), o), naive::encode(&seg, tpe.merges(), 1));
    assert_eq!(tpe.decode(&t).unwrap(), seg);
    let enc = tpe.encode(&seg, &[0, 500]).unwrap();
    assert_eq!(enc, tpe.encode_opts(&seg, &[0, 500], false, Algo::Bucket).unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The fast token-validity rule equals brute force (encode the token's expansion).
    #[test]
    fn prop_token_validity(base in 1u32..5, raw in prop::collection::vec((0u32..10_000, 0u32..10_000), 1..50)) {
        let mut merges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (a, b) in raw {
            let lim = base + merges.len() as u32;
            let pick = |x: u32| if x % 2 < 1 { x % lim } else { lim - 1 - (x % lim.min(3)) };
            let p = (pick(a), pick(b));
            if seen.insert(p) {
                merges.push(p);
            }
        }
        let tpe = Tpe::new(base, merges).unwrap();
        let bt = backtrack::Backtrack::build(&tpe);
        prop_assert_eq!(&bt.valid, &backtrack::validity_by_encoding(&tpe));
    }
}

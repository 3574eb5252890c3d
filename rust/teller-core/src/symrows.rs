//! The per-symbol summary rows of `teller.data.summary.symbol_summary` (the "symbol tokens").
//!
//! Python computes the per-event inputs with numpy (step load, step ordinal, cross-rank residuals,
//! the family statistics: vectorized already) and hands them here; this module runs the loop over
//! symbols. The loop was the cost: ~30 numpy calls per symbol and ~100 symbols per `default`
//! trace made it 20-35 ms of every `teller diagnose` call and of every sample `teller tokenize`
//! encodes, almost all of it call overhead. The numpy loop stays in `teller.data.summary`
//! (`symbol_summary_reference`) as the readable definition and the tests' oracle.
//!
//! The two agree to the bit by keeping to what IEEE 754 fixes: each function here mirrors one
//! there in the same order of operations, with only + - * / and sqrt (correctly rounded
//! everywhere), comparisons and sorts; sums are numpy's pairwise sums (`np_sum`); the 3 x 3 solves
//! are one hand-written elimination on both sides. Every transcendental value (the logarithms of
//! durations, gaps and counts, `expm1`, column 6) comes from numpy: its SIMD kernels and libm
//! differ in the last bit on a few percent of values, and the window scans hold exact ties (a
//! window and its mirror over integer counts or near-constant residuals) that the last bit decides.

use std::collections::BTreeMap;

/// Time bins of the window scans (`N_BINS` in Python).
pub const N_BINS: usize = 16;
/// Columns of a row (`N_SUMMARY_FEATURES` in Python).
pub const N_COLS: usize = 25;

/// Per-event inputs, all of one length (the trace's events), except `fam_stats`.
pub struct SymRowsInput<'a> {
    /// TPE base id of the event's symbol: the row it belongs to.
    pub sid: &'a [i64],
    pub ts: &'a [i64],
    /// ts + max(dur, 0), ns.
    pub end: &'a [i64],
    pub pid: &'a [i64],
    /// ln(1 + max(dur, 0) / 1000).
    pub x: &'a [f64],
    /// expm1(x), numpy's.
    pub ex: &'a [f64],
    /// ln(1 + max(0, ts - ts of the previous event of the same symbol and process) / 1000), numpy's,
    /// in (symbol, process, time) order; NaN for the first event of each (symbol, process).
    pub gap: &'a [f64],
    /// In the opening window (ts < t0 + baseline_frac * span).
    pub early: &'a [bool],
    /// The step's load, ln(1 + num_tokens) (0: none).
    pub w: &'a [f64],
    /// Time bin, 0..N_BINS.
    pub tbin: &'a [i64],
    /// The event's step range index (-1: none).
    pub step: &'a [i64],
    /// A collective kernel.
    pub coll: &'a [bool],
    /// Step ordinal (-1: none); None when the trace has no collective (no transfer columns).
    pub sord: Option<&'a [i64]>,
    /// Cross-rank residual (NaN: none).
    pub xrank: &'a [f64],
    pub host: &'a [bool],
    pub gpu: &'a [bool],
    /// Column 24 of a host row and of a GPU row.
    pub host_shift: f64,
    pub gpu_shift: f64,
    /// Residual against the deployment's kernel reference (NaN: none); None leaves 17-22 at 0.
    pub ref_resid: Option<&'a [f64]>,
    /// Per event its family code (>= 0), with `ref_resid`.
    pub fam: Option<&'a [i64]>,
    /// Per family code, columns 20-22 (`[n_fam * 3]`; NaN where the family has no residual).
    pub fam_stats: Option<&'a [f64]>,
    /// `ln(1 + k)` for k = 0..=the largest symbol's event count, as numpy computes it: column 13
    /// scans ln(1 + count) per bin, integer data whose windows tie, and numpy's SIMD log1p and libm's
    /// differ by an ulp on some integers, which decided ties the other way.
    pub log1p_count: &'a [f64],
    pub baseline_frac: f64,
    pub by_position: bool,
}

/// `(ids, rows)`: one row per distinct `sid` (ascending), `rows` row-major `[ids.len() * N_COLS]`.
/// Column 6 (`rate_change`, a difference of logarithms of the event counts) is left 0 for the caller.
pub fn symbol_rows(inp: &SymRowsInput<'_>) -> Result<(Vec<i64>, Vec<f64>), String> {
    let n = inp.sid.len();
    let same_len = |k: usize, what: &str| -> Result<(), String> {
        if k != n {
            Err(format!("{what} has {k} values, sid has {n}"))
        } else {
            Ok(())
        }
    };
    same_len(inp.ts.len(), "ts")?;
    same_len(inp.end.len(), "end")?;
    same_len(inp.pid.len(), "pid")?;
    same_len(inp.x.len(), "x")?;
    same_len(inp.ex.len(), "ex")?;
    same_len(inp.gap.len(), "gap")?;
    same_len(inp.early.len(), "early")?;
    same_len(inp.w.len(), "w")?;
    same_len(inp.tbin.len(), "tbin")?;
    same_len(inp.step.len(), "step")?;
    same_len(inp.coll.len(), "coll")?;
    same_len(inp.xrank.len(), "xrank")?;
    same_len(inp.host.len(), "host")?;
    same_len(inp.gpu.len(), "gpu")?;
    if let Some(s) = inp.sord {
        same_len(s.len(), "sord")?;
    }
    if let Some(r) = inp.ref_resid {
        same_len(r.len(), "ref_resid")?;
        match (inp.fam, inp.fam_stats) {
            (Some(f), Some(fs)) => {
                same_len(f.len(), "fam")?;
                if fs.len() % 3 != 0 {
                    return Err("fam_stats is not [n_families, 3]".into());
                }
                let nf = (fs.len() / 3) as i64;
                if f.iter().any(|&c| c < 0 || c >= nf) {
                    return Err("fam holds a code outside fam_stats".into());
                }
            }
            _ => return Err("ref_resid needs fam and fam_stats".into()),
        }
    }
    if inp.tbin.iter().any(|&b| b < 0 || b >= N_BINS as i64) {
        return Err(format!("tbin holds a bin outside 0..{N_BINS}"));
    }
    // by symbol, then process, then time (np.lexsort((ts, pid, sid)): stable)
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (inp.sid[i], inp.pid[i], inp.ts[i]));
    let mut groups = Vec::new();
    let mut a = 0;
    while a < n {
        let mut b = a + 1;
        while b < n && inp.sid[order[b]] == inp.sid[order[a]] {
            b += 1;
        }
        groups.push((a, b));
        a = b;
    }
    let largest = groups.iter().map(|&(a, b)| b - a).max().unwrap_or(0);
    if inp.log1p_count.len() <= largest {
        return Err(format!(
            "log1p_count has {} values, the largest symbol has {largest} events",
            inp.log1p_count.len()
        ));
    }
    let mut ids = Vec::with_capacity(groups.len());
    let mut rows = Vec::with_capacity(groups.len() * N_COLS);
    for (a, b) in groups {
        let mut row = [0.0f64; N_COLS];
        one_row(inp, &order[a..b], &mut row);
        ids.push(inp.sid[order[a]]);
        rows.extend_from_slice(&row);
    }
    Ok((ids, rows))
}

fn gather<T: Copy>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i]).collect()
}

fn one_row(inp: &SymRowsInput<'_>, idx: &[usize], row: &mut [f64; N_COLS]) {
    let xs = gather(inp.x, idx);
    let early = gather(inp.early, idx);
    let pid = gather(inp.pid, idx);
    let step = gather(inp.step, idx);
    let w = gather(inp.w, idx);
    let tb: Vec<usize> = idx.iter().map(|&i| inp.tbin[i] as usize).collect();
    let med = median(&xs);
    let xe: Vec<f64> = xs.iter().zip(&early).filter(|(_, &e)| e).map(|(&v, _)| v).collect();
    let baseline = if xe.is_empty() { med } else { median(&xe) };
    let d: Vec<f64> = xs.iter().map(|&v| v - baseline).collect();
    row[0] = xs.len() as f64;
    row[1] = med;
    row[2] = d.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    row[3] = quantile(&d, 0.9);
    let late: Vec<usize> = (0..idx.len()).filter(|&k| !early[k]).collect();
    if !late.is_empty() {
        let means = group_means(late.iter().map(|&k| (pid[k], d[k])));
        let (lo, hi) = min_max(&means);
        row[4] = hi;
        row[5] = hi - lo;
    }
    // (row[6], logarithms of the late and early counts, is the caller's: numpy's logarithm)
    // inter-arrival on the same process (idx is sorted by process, then time)
    let gaps: Vec<f64> = (1..idx.len())
        .filter(|&k| pid[k] == pid[k - 1])
        .map(|k| inp.gap[idx[k]])
        .collect();
    if !gaps.is_empty() {
        let g_max = gaps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        row[7] = g_max - median(&gaps);
    }
    let transfer = inp.sord.is_some() && idx.iter().all(|&i| inp.coll[i]);
    let pos_all = if inp.by_position || transfer {
        Some(positions(&pid, &step))
    } else {
        None
    };
    let pos = match &pos_all {
        Some(p) if inp.by_position && positions_recur(p, &step) => Some(p.as_slice()),
        _ => None,
    };
    work_normalized(row, &xs, &w, &tb, &pid, pos, inp.log1p_count);
    if transfer {
        let sord = gather(inp.sord.unwrap_or(&[]), idx);
        let end_us: Vec<f64> = idx.iter().map(|&i| inp.end[i] as f64 / 1000.0).collect();
        transfer_cols(
            row,
            &xs,
            &gather(inp.ex, idx),
            &w,
            &tb,
            &pid,
            &sord,
            pos_all.as_deref().unwrap_or(&[]),
            &end_us,
        );
    }
    row[23] = rank_shift(&gather(inp.xrank, idx), &pid, &tb);
    let first = idx[0];
    row[24] = if inp.host[first] {
        inp.host_shift
    } else if inp.gpu[first] {
        inp.gpu_shift
    } else {
        0.0
    };
    if let (Some(rr), Some(fam), Some(fs)) = (inp.ref_resid, inp.fam, inp.fam_stats) {
        let r = gather(rr, idx);
        reference_cols(row, &r, &pid);
        if row[19] > 0.0 {
            // the family of most of its events with a residual (the smallest code on ties)
            let mut cnt: BTreeMap<i64, usize> = BTreeMap::new();
            for (k, &i) in idx.iter().enumerate() {
                if r[k].is_finite() {
                    *cnt.entry(fam[i]).or_default() += 1;
                }
            }
            let mut best = (0usize, 0i64);
            for (&f, &c) in &cnt {
                if c > best.0 {
                    best = (c, f);
                }
            }
            let f = best.1 as usize;
            row[20..23].copy_from_slice(&fs[3 * f..3 * f + 3]);
        }
    }
}

/// np.median of finite values (the mean of the two middle ones for an even count).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// np.quantile(v, q) with numpy's default (linear) method and its interpolation formula.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let virt = q * (n - 1) as f64;
    let lo = virt.floor();
    let g = virt - lo;
    let i = (lo as usize).min(n - 1);
    let j = (i + 1).min(n - 1);
    let (a, b) = (s[i], s[j]);
    let diff = b - a;
    if g >= 0.5 {
        b - diff * (1.0 - g)
    } else {
        a + diff * g
    }
}

/// np.sum of a contiguous float64 array: numpy's pairwise summation (8 accumulators per block of
/// up to 128, halves above), so that means and spreads, and the window ties that hang on their
/// last ulp, come out as numpy's.
fn np_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut r = 0.0;
        for &v in a {
            r += v;
        }
        r
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        np_sum(&a[..n2]) + np_sum(&a[n2..])
    }
}

/// np.mean.
fn mean(v: &[f64]) -> f64 {
    np_sum(v) / v.len() as f64
}

/// np.var (population): the mean of the squared deviations from np.mean.
fn var(v: &[f64]) -> f64 {
    let m = mean(v);
    let sq: Vec<f64> = v.iter().map(|&a| (a - m) * (a - m)).collect();
    np_sum(&sq) / v.len() as f64
}

/// np.std (population).
fn std(v: &[f64]) -> f64 {
    var(v).sqrt()
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &a| {
        (lo.min(a), hi.max(a))
    })
}

/// Mean of the values per key, in ascending key order (np.unique + bincount).
fn group_means(it: impl Iterator<Item = (i64, f64)>) -> Vec<f64> {
    let mut m: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for (k, v) in it {
        let e = m.entry(k).or_insert((0.0, 0.0));
        e.0 += v;
        e.1 += 1.0;
    }
    m.values().map(|&(s, c)| s / c).collect()
}

/// `load_slope`: least-squares slope of x on w clipped to [0, 1.2]; 0 without load variation.
fn load_slope(x: &[f64], w: &[f64]) -> f64 {
    let vw = var(w);
    if vw <= 1e-9 {
        return 0.0;
    }
    let (mw, mx) = (mean(w), mean(x));
    let prod: Vec<f64> = w.iter().zip(x).map(|(&a, &b)| (a - mw) * (b - mx)).collect();
    (mean(&prod) / vw).clamp(0.0, 1.2)
}

/// `_positions`: the occurrence index within each run of (process, step).
fn positions(pid: &[i64], step: &[i64]) -> Vec<i64> {
    let mut out = Vec::with_capacity(pid.len());
    let mut start = 0usize;
    for k in 0..pid.len() {
        if k == 0 || pid[k] != pid[k - 1] || step[k] != step[k - 1] {
            start = k;
        }
        out.push((k - start) as i64);
    }
    out
}

/// `_positions_recur`: some position > 0 and >= 2 distinct steps (>= 0).
fn positions_recur(pos: &[i64], step: &[i64]) -> bool {
    if !pos.iter().any(|&p| p > 0) {
        return false;
    }
    let mut s: Vec<i64> = step.iter().copied().filter(|&v| v >= 0).collect();
    s.sort_unstable();
    s.dedup();
    s.len() >= 2
}

/// Solves a 3 x 3 system by Gaussian elimination with partial pivoting (the first largest pivot),
/// as `teller.data.summary._solve3` does for a batch in numpy (np.linalg.solve's LAPACK orders its
/// operations otherwise and differs in the last bit).
#[allow(clippy::needless_range_loop)] // (rows r and c of one array: indices are the clear form)
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> [f64; 3] {
    for c in 0..3 {
        let mut p = c;
        for r in c + 1..3 {
            if a[r][c].abs() > a[p][c].abs() {
                p = r;
            }
        }
        a.swap(c, p);
        b.swap(c, p);
        for r in c + 1..3 {
            let f = a[r][c] / a[c][c];
            for k in c..3 {
                a[r][k] -= f * a[c][k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = [0.0; 3];
    for c in (0..3).rev() {
        let mut s = b[c];
        for k in c + 1..3 {
            s -= a[c][k] * x[k];
        }
        x[c] = s / a[c][c];
    }
    x
}

/// `_position_residual`: x minus a per-position least-squares fit on the load (quadratic, line or
/// mean by how many distinct loads and events the position has), and the pooled slope.
fn position_residual(x: &[f64], w: &[f64], pos: &[i64]) -> (Vec<f64>, f64) {
    let n = x.len();
    let mut up: Vec<i64> = pos.to_vec();
    up.sort_unstable();
    up.dedup();
    let k = up.len();
    let inv: Vec<usize> = pos.iter().map(|p| up.binary_search(p).unwrap_or(0)).collect();
    let mut cnt = vec![0.0f64; k];
    let mut wsum = vec![0.0f64; k];
    for i in 0..n {
        cnt[inv[i]] += 1.0;
        wsum[inv[i]] += w[i];
    }
    // distinct loads (w rounded to 0.01, half to even as np.round) per position
    let mut pairs: Vec<(usize, i64)> = (0..n)
        .map(|i| (inv[i], (w[i] * 100.0).round_ties_even() as i64))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut nd = vec![0usize; k];
    for &(g, _) in &pairs {
        nd[g] += 1;
    }
    let u: Vec<f64> = (0..n).map(|i| w[i] - wsum[inv[i]] / cnt[inv[i]]).collect();
    let mut s = vec![[0.0f64; 5]; k];
    let mut t = vec![[0.0f64; 3]; k];
    for i in 0..n {
        let g = inv[i];
        let ui = u[i];
        let u2 = ui * ui;
        let pw = [1.0, ui, u2, u2 * ui, u2 * u2];
        for p in 0..5 {
            s[g][p] += pw[p];
        }
        for p in 0..3 {
            t[g][p] += x[i] * pw[p];
        }
    }
    let mut coef = vec![[0.0f64; 3]; k];
    for g in 0..k {
        let c = cnt[g] as usize;
        let deg = if nd[g] >= 5 && c >= 6 {
            2
        } else if nd[g] >= 2 && c >= 3 {
            1
        } else {
            0
        };
        let mut a = [[0.0f64; 3]; 3];
        let mut b = [0.0f64; 3];
        let reg = 1e-12 * s[g][0].max(1.0);
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] = if i <= deg && j <= deg {
                    s[g][i + j]
                } else if i == j {
                    1.0
                } else {
                    0.0
                };
            }
            a[i][i] += reg;
            b[i] = if i <= deg { t[g][i] } else { 0.0 };
        }
        coef[g] = solve3(a, b);
    }
    let r = (0..n)
        .map(|i| {
            let c = coef[inv[i]];
            x[i] - (c[0] + c[1] * u[i] + c[2] * u[i] * u[i])
        })
        .collect();
    (r, load_slope(x, w))
}

/// Indices (i, j) of the windows of `_windows(n)`: j - i >= 2, j - i <= n - 2, i >= 1, in the
/// order of np.triu_indices (i, then j, ascending).
fn window_scan(v: &[f64]) -> (f64, usize, usize) {
    let n = v.len();
    if n < 4 {
        return (0.0, 0, 0);
    }
    let mut c = Vec::with_capacity(n + 1);
    c.push(0.0f64);
    let mut acc = 0.0;
    for &a in v {
        acc += a;
        c.push(acc);
    }
    let total = c[n];
    let mut best = (0.0f64, 0usize, 0usize);
    let mut best_abs = -1.0f64;
    for i in 1..=n {
        for j in i + 2..=n {
            if j - i > n - 2 {
                break;
            }
            let s_in = c[j] - c[i];
            let d = s_in / (j - i) as f64 - (total - s_in) / (n - (j - i)) as f64;
            // strictly greater: the first window on ties, as np.argmax (a NaN wins, as there)
            if d.abs() > best_abs || (d.is_nan() && !best_abs.is_nan()) {
                best_abs = d.abs();
                best = (d, i, j);
            }
        }
    }
    best
}

/// Per-bin count, and the per-bin sum of `v`, over N_BINS bins.
fn bin_sums(b: &[usize], v: &[f64]) -> ([f64; N_BINS], [f64; N_BINS]) {
    let mut cnt = [0.0; N_BINS];
    let mut sum = [0.0; N_BINS];
    for (k, &bb) in b.iter().enumerate() {
        cnt[bb] += 1.0;
        sum[bb] += v[k];
    }
    (cnt, sum)
}

/// The mean of `v` per occupied bin, in bin order.
fn occupied_means(cnt: &[f64; N_BINS], sum: &[f64; N_BINS]) -> Vec<f64> {
    (0..N_BINS).filter(|&q| cnt[q] > 0.0).map(|q| sum[q] / cnt[q]).collect()
}

/// `_work_normalized`: columns 8-13.
fn work_normalized(
    row: &mut [f64; N_COLS],
    x: &[f64],
    w: &[f64],
    b: &[usize],
    pid: &[i64],
    pos: Option<&[i64]>,
    log1p_count: &[f64],
) {
    let (r, slope) = match pos {
        Some(p) => position_residual(x, w, p),
        None => {
            let s = load_slope(x, w);
            (x.iter().zip(w).map(|(&a, &ww)| a - s * ww).collect(), s)
        }
    };
    let (cnt, rsum) = bin_sums(b, &r);
    let per_bin = occupied_means(&cnt, &rsum);
    let (shift, i, j) = window_scan(&per_bin);
    row[8] = slope;
    row[9] = shift;
    row[10] = shift / (std(&r) + 0.02);
    if j > i {
        let bins: Vec<usize> = (0..N_BINS).filter(|&q| cnt[q] > 0.0).collect();
        let (lo, hi) = (bins[i], bins[j - 1]);
        // per process: (sum, count) inside the window and outside
        let mut m: BTreeMap<i64, [f64; 4]> = BTreeMap::new();
        for k in 0..x.len() {
            let e = m.entry(pid[k]).or_insert([0.0; 4]);
            if b[k] >= lo && b[k] <= hi {
                e[0] += r[k];
                e[1] += 1.0;
            } else {
                e[2] += r[k];
                e[3] += 1.0;
            }
        }
        if m.len() > 1 {
            let d: Vec<f64> = m
                .values()
                .filter(|e| e[1] > 0.0 && e[3] > 0.0)
                .map(|e| e[0] / e[1] - e[2] / e[3])
                .collect();
            if d.len() > 1 {
                let (dl, dh) = min_max(&d);
                row[11] = dh - dl;
            }
        }
    }
    let (_, wsum) = bin_sums(b, w);
    row[12] = window_scan(&occupied_means(&cnt, &wsum)).0;
    let lc: Vec<f64> = cnt.iter().map(|&c| log1p_count[c as usize]).collect();
    row[13] = window_scan(&lc).0;
}

/// `_transfer`: columns 14-16 of a collective symbol (instances matched across ranks).
#[allow(clippy::too_many_arguments)]
fn transfer_cols(
    row: &mut [f64; N_COLS],
    x: &[f64],
    ex: &[f64],
    w: &[f64],
    b: &[usize],
    pid: &[i64],
    sord: &[i64],
    pos: &[i64],
    end_us: &[f64],
) {
    const MIN_INSTANCES: usize = 3;
    let mut procs: Vec<i64> = pid.to_vec();
    procs.sort_unstable();
    procs.dedup();
    let n_proc = procs.len();
    let ok: Vec<usize> = (0..x.len()).filter(|&k| sord[k] >= 0).collect();
    if n_proc < 2 || ok.len() < n_proc * MIN_INSTANCES {
        return;
    }
    let pmax = pos.iter().copied().max().unwrap_or(0);
    let key = |k: usize| sord[k] * (pmax + 1) + pos[k];
    let mut o = ok.clone();
    o.sort_by_key(|&k| (key(k), pid[k])); // stable: np.lexsort((p, key))
    let (mut xm, mut wm, mut bm, mut pm, mut sm) = (vec![], vec![], vec![], vec![], vec![]);
    let mut a = 0;
    while a < o.len() {
        let mut z = a + 1;
        while z < o.len() && key(o[z]) == key(o[a]) {
            z += 1;
        }
        let g = &o[a..z];
        let distinct = 1 + (1..g.len()).filter(|&q| pid[g[q]] != pid[g[q - 1]]).count();
        // the fastest rank's x, and numpy's expm1 of it (of equal ones the first: the same value)
        let k_min = g.iter().copied().fold(g[0], |m, k| if x[k] < x[m] { k } else { m });
        let x_min = x[k_min];
        let (e_lo, e_hi) = min_max(&g.iter().map(|&k| end_us[k]).collect::<Vec<_>>());
        if g.len() == n_proc && distinct == n_proc && e_hi - e_lo <= 0.5 * ex[k_min] + 20.0 {
            xm.push(x_min);
            wm.push(g.iter().map(|&k| w[k]).fold(f64::NEG_INFINITY, f64::max));
            bm.push(g.iter().map(|&k| b[k]).min().unwrap_or(0));
            pm.push(pos[g[0]]);
            sm.push(sord[g[0]]);
        }
        a = z;
    }
    if xm.len() < MIN_INSTANCES {
        return;
    }
    row[14] = median(&xm);
    let mut us = sm.clone();
    us.sort_unstable();
    us.dedup();
    if us.len() < 3 {
        return;
    }
    let per_pos_ok = positions_recur(&pm, &sm) && {
        let mut c: BTreeMap<i64, f64> = BTreeMap::new();
        for &p in &pm {
            *c.entry(p).or_default() += 1.0;
        }
        median(&c.values().copied().collect::<Vec<_>>()) >= 3.0
    };
    let r: Vec<f64> = if per_pos_ok {
        position_residual(&xm, &wm, &pm).0
    } else {
        let s = load_slope(&xm, &wm);
        xm.iter().zip(&wm).map(|(&a, &ww)| a - s * ww).collect()
    };
    let (cnt, rsum) = bin_sums(&bm, &r);
    let shift = window_scan(&occupied_means(&cnt, &rsum)).0;
    row[15] = shift;
    row[16] = shift / (std(&r) + 0.02);
}

/// `_rank_shift`: per process, the window scan over the median cross-rank residual per time bin
/// (>= 4 bins); the largest over the processes (0: none).
fn rank_shift(r: &[f64], pid: &[i64], b: &[usize]) -> f64 {
    let mut per: BTreeMap<(i64, usize), Vec<f64>> = BTreeMap::new();
    for k in 0..r.len() {
        if r[k].is_finite() {
            per.entry((pid[k], b[k])).or_default().push(r[k]);
        }
    }
    let mut best: Option<f64> = None;
    let mut cur: Option<i64> = None;
    let mut v: Vec<f64> = Vec::new();
    let flush = |v: &mut Vec<f64>, best: &mut Option<f64>| {
        if v.len() >= 4 {
            let d = window_scan(v).0;
            *best = Some(best.map_or(d, |bb| bb.max(d)));
        }
        v.clear();
    };
    for ((p, _), vals) in &per {
        if cur != Some(*p) {
            flush(&mut v, &mut best);
            cur = Some(*p);
        }
        // _group_medians: 0.5 * (lo + hi) of the sorted values
        let mut s = vals.clone();
        s.sort_by(f64::total_cmp);
        let c = s.len();
        v.push(0.5 * (s[(c - 1) / 2] + s[c / 2]));
    }
    flush(&mut v, &mut best);
    best.unwrap_or(0.0)
}

/// `_reference_columns`: columns 17-19 from the events' reference residuals (NaN: none).
fn reference_cols(row: &mut [f64; N_COLS], r: &[f64], pid: &[i64]) {
    let ok: Vec<usize> = (0..r.len()).filter(|&k| r[k].is_finite()).collect();
    if ok.is_empty() {
        return;
    }
    let rk: Vec<f64> = ok.iter().map(|&k| r[k]).collect();
    row[17] = median(&rk);
    let mut per: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for &k in &ok {
        per.entry(pid[k]).or_default().push(r[k]);
    }
    row[18] = per.values().map(|v| median(v)).fold(f64::NEG_INFINITY, f64::max);
    row[19] = ok.len() as f64 / r.len() as f64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quantile_match_numpy() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        // np.quantile([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 0.9) = 8.1
        let v: Vec<f64> = (0..10).map(f64::from).collect();
        assert!((quantile(&v, 0.9) - 8.1).abs() < 1e-12);
        assert_eq!(quantile(&[5.0], 0.9), 5.0);
    }

    #[test]
    fn window_scan_finds_the_step() {
        // bins 4..8 hold +1: the window (4, 8) has inside mean 1, outside 0
        let mut v = vec![0.0; 12];
        for q in v.iter_mut().take(8).skip(4) {
            *q = 1.0;
        }
        let (d, i, j) = window_scan(&v);
        assert!((d - 1.0).abs() < 1e-12, "{d}");
        assert_eq!((i, j), (4, 8));
        assert_eq!(window_scan(&[1.0, 2.0, 3.0]), (0.0, 0, 0));
    }

    #[test]
    fn np_sum_is_pairwise() {
        // 1e16 + 15 ones: in-order summation loses every 1.0 (the spacing at 1e16 is 2); numpy's
        // 8 accumulators keep 14 of them (np.sum gives 1e16 + 14)
        let mut v = vec![1.0f64; 16];
        v[0] = 1e16;
        let in_order = v.iter().fold(0.0, |a, &b| a + b);
        assert_eq!(in_order, 1e16);
        assert_eq!(np_sum(&v), 1e16 + 14.0);
        let long: Vec<f64> = (0..1000).map(|k| f64::from(k) * 0.1).collect();
        assert!((np_sum(&long) - 49950.0).abs() < 1e-9);
    }

    #[test]
    fn solve3_solves() {
        let a = [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]];
        let x = solve3(a, [3.0, 5.0, 5.0]);
        for (k, v) in x.iter().enumerate() {
            assert!((v - 1.0).abs() < 1e-12, "x[{k}] = {v}");
        }
    }

    #[test]
    fn positions_restart_per_process_and_step() {
        assert_eq!(positions(&[1, 1, 1, 2, 2], &[0, 0, 1, 1, 1]), vec![0, 1, 0, 0, 1]);
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let inp = SymRowsInput {
            sid: &[0, 0],
            ts: &[0],
            end: &[0, 0],
            pid: &[0, 0],
            x: &[0.0, 0.0],
            ex: &[0.0, 0.0],
            gap: &[f64::NAN, 0.0],
            early: &[true, false],
            w: &[0.0, 0.0],
            tbin: &[0, 1],
            step: &[0, 0],
            coll: &[false, false],
            sord: None,
            xrank: &[f64::NAN, f64::NAN],
            host: &[true, true],
            gpu: &[false, false],
            host_shift: 0.0,
            gpu_shift: 0.0,
            ref_resid: None,
            fam: None,
            fam_stats: None,
            log1p_count: &[0.0, 2f64.ln(), 3f64.ln()],
            baseline_frac: 0.1,
            by_position: true,
        };
        assert!(symbol_rows(&inp).unwrap_err().contains("ts has 1"));
    }
}

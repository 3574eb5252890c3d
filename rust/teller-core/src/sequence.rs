//! From an aligned trace to symbol sequences, one per step, in call-chain order: what TPE trains on
//! and encodes.
//!
//! Order: a depth-first pre-order walk of each step's call-chain tree (roots by start time; children
//! by start time; a GPU activity right after the runtime call that launched it). A range of a
//! "structural" layer (annotation, python by default) that has children is followed by a close
//! symbol after its subtree, so the tree shape survives flattening (`nvtx:attention ... <close>`).

use crate::model::{flags, Layer, Trace};

pub const CLOSE_SYMBOL: &str = "<close>";

#[derive(Debug, Clone)]
pub struct SequenceOptions {
    /// Layers whose ranges get a close symbol after their children.
    pub close_layers: Vec<Layer>,
    /// Leave out instant events (markers).
    pub skip_instants: bool,
}

impl Default for SequenceOptions {
    fn default() -> Self {
        SequenceOptions {
            close_layers: vec![Layer::Annotation, Layer::Python, Layer::GpuAnnotation],
            skip_instants: false,
        }
    }
}

/// Flat sequences. Position p holds symbol `names[ids[p]]`; segment s is `offsets[s]..offsets[s+1]`
/// and is step `steps[s]`; `event[p]` is the trace event (or -1 for a close symbol).
#[derive(Debug, Clone, Default)]
pub struct Sequences {
    pub names: Vec<String>,
    pub ids: Vec<u32>,
    pub offsets: Vec<usize>,
    pub steps: Vec<u32>,
    pub event: Vec<i64>,
    pub start_ns: Vec<i64>,
    pub dur_ns: Vec<i64>,
}

pub fn sequences(t: &Trace, opts: &SequenceOptions) -> Sequences {
    let n = t.len();
    let mut names: Vec<String> = t.symbols.iter().map(|s| s.to_string()).collect();
    let close_id = names.len() as u32;
    names.push(CLOSE_SYMBOL.to_string());
    let mut out = Sequences {
        names,
        offsets: vec![0],
        ..Default::default()
    };
    if n == 0 || t.step.is_empty() {
        return out;
    }
    // Children in CSR form; indices are in start order, so each child list is already sorted.
    let mut count = vec![0u32; n + 1];
    for i in 0..n {
        if t.parent[i] >= 0 {
            count[t.parent[i] as usize + 1] += 1;
        }
    }
    for i in 0..n {
        count[i + 1] += count[i];
    }
    let mut fill = count.clone();
    let mut child = vec![0u32; count[n] as usize];
    for i in 0..n {
        if t.parent[i] >= 0 {
            let p = t.parent[i] as usize;
            child[fill[p] as usize] = i as u32;
            fill[p] += 1;
        }
    }
    let close_layer = {
        let mut m = [false; crate::model::NUM_LAYERS];
        for l in &opts.close_layers {
            m[*l as usize] = true;
        }
        m
    };
    // Roots of each step, in start order.
    let nsteps = t.steps.len();
    let mut roots: Vec<Vec<u32>> = vec![Vec::new(); nsteps];
    for i in 0..n {
        let s = t.step[i];
        if s < 0 {
            continue;
        }
        let p = t.parent[i];
        if p < 0 || t.step[p as usize] != s {
            roots[s as usize].push(i as u32);
        }
    }
    let mut stack: Vec<(u32, bool)> = Vec::new();
    for (s, rs) in roots.iter().enumerate() {
        if rs.is_empty() {
            continue;
        }
        for &r in rs.iter().rev() {
            stack.push((r, false));
        }
        while let Some((i, closing)) = stack.pop() {
            let iu = i as usize;
            if closing {
                out.ids.push(close_id);
                out.event.push(-1);
                out.start_ns.push(t.end(iu));
                out.dur_ns.push(0);
                continue;
            }
            if opts.skip_instants && t.flags[iu] & flags::INSTANT != 0 {
                continue;
            }
            out.ids.push(t.symbol[iu]);
            out.event.push(iu as i64);
            out.start_ns.push(t.ts[iu]);
            out.dur_ns.push(t.dur[iu]);
            let kids = &child[count[iu] as usize..count[iu + 1] as usize];
            let kids_in_step: Vec<u32> = kids
                .iter()
                .copied()
                .filter(|&c| t.step[c as usize] == s as i32)
                .collect();
            if !kids_in_step.is_empty() {
                if close_layer[t.layer[iu] as usize] {
                    stack.push((i, true));
                }
                for &c in kids_in_step.iter().rev() {
                    stack.push((c, false));
                }
            }
        }
        out.offsets.push(out.ids.len());
        out.steps.push(s as u32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::encode::{header, write, V};

    #[test]
    fn preorder_with_close_symbols() {
        let mut b = Vec::new();
        header(&mut b, 1, 0, 0);
        let ev = |b: &mut Vec<u8>, l: i64, n: &str, s: i64, e: i64, corr: i64| {
            write(
                b,
                &V::A(vec![V::I(3), V::I(l), V::S(n), V::I(1), V::I(s), V::I(e), V::I(corr)]),
            );
        };
        ev(&mut b, 1, "step", 0, 100, 0);
        ev(&mut b, 1, "attn", 10, 40, 0);
        ev(&mut b, 4, "cudaLaunchKernel", 12, 14, 5);
        ev(&mut b, 2, "aten::mm", 50, 60, 0);
        write(
            &mut b,
            &V::A(vec![
                V::I(4),
                V::I(6),
                V::S("k"),
                V::I(0),
                V::I(7),
                V::I(20),
                V::I(30),
                V::I(5),
            ]),
        );
        let (mut t, _) = crate::raw::read_raw("x", &b, 0).unwrap();
        crate::align::finish(&mut t, &[0], &crate::align::AlignOptions::default());
        let s = sequences(&t, &SequenceOptions::default());
        let got: Vec<&str> = s.ids.iter().map(|&i| s.names[i as usize].as_str()).collect();
        assert_eq!(
            got,
            vec![
                "annotation:step",
                "annotation:attn",
                "runtime:cudaLaunchKernel",
                "kernel:k",
                "<close>",
                "host_op:aten::mm",
                "<close>"
            ]
        );
        assert_eq!(s.offsets, vec![0, 7]);
        assert_eq!(s.event.iter().filter(|&&e| e < 0).count(), 2);
    }
}

//! Alignment: after every source is read onto the common time base, put events in call-chain order,
//! link runtime/driver calls to their GPU work, build the call-chain tree, find steps and assign
//! normalized symbols.

use crate::model::*;
use crate::normalize::{symbol, NormalizeOptions};
use hashbrown::HashMap;

#[derive(Debug, Clone)]
pub struct AlignOptions {
    /// Step range names; `*` matches any run of characters. The first pattern with any match wins,
    /// so list outer ranges first.
    pub step_patterns: Vec<String>,
    pub normalize: NormalizeOptions,
}

pub const DEFAULT_STEP_PATTERNS: &[&str] = &[
    "ProfilerStep#*",
    "engine_step*",
    "LLMEngine.step*",
    "execute_model*",
    "gpu_model_runner: forward*",
    "step",
    "step#*",
    "train_step*",
    "decode_step*",
];

impl Default for AlignOptions {
    fn default() -> Self {
        AlignOptions {
            step_patterns: DEFAULT_STEP_PATTERNS.iter().map(|s| s.to_string()).collect(),
            normalize: NormalizeOptions::default(),
        }
    }
}

/// Glob match with `*` only.
pub fn glob_match(pat: &str, s: &str) -> bool {
    let p = pat.as_bytes();
    let t = s.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    let (mut star, mut mark) = (usize::MAX, 0usize);
    while ti < t.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = pi;
            mark = ti;
            pi += 1;
        } else if star != usize::MAX {
            pi = star + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// Nesting rank at equal (start, duration): outer layers first.
fn nest_rank(l: u8) -> u8 {
    match Layer::from_u8(l).unwrap_or(Layer::Other) {
        Layer::Annotation => 0,
        Layer::Python => 1,
        Layer::HostOp => 2,
        Layer::Other => 3,
        Layer::Runtime => 4,
        Layer::Driver => 5,
        Layer::Sync => 6,
        Layer::Marker => 7,
        Layer::GpuAnnotation => 8,
        Layer::Kernel | Layer::Memcpy | Layer::Memset => 9,
    }
}

/// Reorders every column by `perm` (new index k holds old event perm[k]).
fn permute(t: &mut Trace, perm: &[u32]) {
    fn ap<T: Copy>(v: &mut Vec<T>, perm: &[u32]) {
        let n: Vec<T> = perm.iter().map(|&i| v[i as usize]).collect();
        *v = n;
    }
    ap(&mut t.layer, perm);
    ap(&mut t.name, perm);
    ap(&mut t.cat, perm);
    ap(&mut t.ts, perm);
    ap(&mut t.dur, perm);
    ap(&mut t.pid, perm);
    ap(&mut t.tid, perm);
    ap(&mut t.device, perm);
    ap(&mut t.corr, perm);
    ap(&mut t.ext, perm);
    ap(&mut t.flags, perm);
    ap(&mut t.source, perm);
    let mut off = Vec::with_capacity(t.args_off.len());
    let mut args = Vec::with_capacity(t.args.len());
    off.push(0u32);
    for &i in perm {
        let (a, b) = (t.args_off[i as usize] as usize, t.args_off[i as usize + 1] as usize);
        args.extend_from_slice(&t.args[a..b]);
        off.push(args.len() as u32);
    }
    t.args_off = off;
    t.args = args;
}

/// Runs every alignment pass. `proc_of_source[s]` is the process (correlation scope) of source s.
pub fn finish(t: &mut Trace, proc_of_source: &[u32], opts: &AlignOptions) {
    let n = t.len();
    // 1. Call-chain order: by start, longer first, outer layers first; stable on input order.
    // Sort packed keys rather than indices with a comparator that chases four columns.
    let mut keys: Vec<(i64, i64, u8, u32)> = (0..n)
        .map(|i| (t.ts[i], -t.dur[i], nest_rank(t.layer[i]), i as u32))
        .collect();
    keys.sort_unstable();
    let perm: Vec<u32> = keys.into_iter().map(|k| k.3).collect();
    if perm.iter().enumerate().any(|(k, &i)| k as u32 != i) {
        permute(t, &perm);
    }

    // 2. Correlation: GPU activity -> the runtime/driver call with the same correlation id in the
    //    same process. Runtime calls win over driver calls; graph launches link many-to-one.
    //    A source is one correlation scope, except a Chrome trace merged from several processes
    //    (teller's own trace.json): their counters overlap, and a GPU track's pid is a device, not a
    //    process. There the `ac2g` flow into a GPU activity names its launching process. Without a
    //    usable flow (raw files: one process per source; Kineto: flow id = correlation id) the
    //    scope's call with that id is taken, but only if one process has a call with it: an id that
    //    several processes used is left unlinked rather than linked to the wrong process.
    let (launch_pid, ambiguous_flows) = flow_launch_pids(t);
    if ambiguous_flows > 0 {
        t.warnings.push(format!("{ambiguous_flows} ac2g flow id(s) start in more than one process (a file merged from several traces?); their GPU work is linked by correlation id only where one process used the id"));
    }
    // Decision: a sorted join, not hash maps. Keyed by (scope, correlation id, pid), the calls sort
    // into runs that hold everything a lookup needs (which call a key keeps; whether one process
    // used the id), and a kernel's lookup is a binary search in a table it reads in nearly the
    // order of its ids. Two hash maps of 250 000 calls missed the cache on every access: 105-110 ms
    // of a million-record raw file's load, now about 40.
    let mut calls: Vec<(u32, u64, i64, u32)> = (0..n)
        .filter(|&i| t.layer_of(i).is_api() && t.corr[i] != 0)
        .map(|i| (proc_of_source[t.source[i] as usize], t.corr[i], t.pid[i], i as u32))
        .collect();
    calls.sort_unstable();
    // per (scope, id, pid): the call a launch links to, the first runtime call (in event order:
    // the runtime API call wins over the driver call it makes), else the last call
    let mut api: Vec<(u32, u64, i64, u32)> = Vec::with_capacity(calls.len());
    // per (scope, id): the pid of its calls, or SHARED when several processes used it
    const SHARED: i64 = i64::MIN;
    let mut id_pid: Vec<(u32, u64, i64)> = Vec::with_capacity(calls.len());
    for run in calls.chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
        let (scope, corr, pid, _) = run[0];
        let keep = run
            .iter()
            .find(|c| t.layer_of(c.3 as usize) == Layer::Runtime)
            .unwrap_or(&run[run.len() - 1])
            .3;
        api.push((scope, corr, pid, keep));
        match id_pid.last_mut() {
            Some(last) if (last.0, last.1) == (scope, corr) => last.2 = SHARED,
            _ => id_pid.push((scope, corr, pid)),
        }
    }
    drop(calls);
    let call_of = |scope: u32, corr: u64, pid: i64| -> Option<u32> {
        api.binary_search_by(|c| (c.0, c.1, c.2).cmp(&(scope, corr, pid)))
            .ok()
            .map(|k| api[k].3)
    };
    t.link = vec![-1; n];
    for i in 0..n {
        if t.layer_of(i).is_gpu_activity() && t.corr[i] != 0 {
            let (scope, corr) = (proc_of_source[t.source[i] as usize], t.corr[i]);
            let by_flow = launch_pid_of(&launch_pid, (t.source[i], t.pid[i], t.tid[i], t.ts[i]))
                .and_then(|p| call_of(scope, corr, p));
            let hit = by_flow.or_else(|| match id_pid.binary_search_by(|c| (c.0, c.1).cmp(&(scope, corr))) {
                Ok(k) if id_pid[k].2 != SHARED => call_of(scope, corr, id_pid[k].2),
                _ => None,
            });
            if let Some(j) = hit {
                t.link[i] = j as i64;
            }
        }
    }

    // 3. Call-chain tree: interval nesting per CPU thread and per GPU track (one pass, a stack per
    //    track); a linked GPU activity hangs under its launch instead.
    t.parent = vec![-1; n];
    let mut stacks: HashMap<(u32, i64, i64, i64, bool), Vec<u32>> = HashMap::new();
    let mut improper = 0u64;
    for i in 0..n {
        let gpu = t.layer_of(i).on_gpu();
        // (a GPU track is its pid as well as its device: in a merged trace read back, two ranks'
        // GPU 0 are told apart by the pids load::separate_pids gave them, in one scope)
        let key = (
            proc_of_source[t.source[i] as usize],
            t.pid[i],
            if gpu { t.device[i] as i64 } else { -1 },
            t.tid[i],
            gpu,
        );
        let st = stacks.entry(key).or_default();
        let start = t.ts[i];
        let end = t.end(i);
        while let Some(&top) = st.last() {
            let te = t.end(top as usize);
            if te <= start {
                st.pop();
            } else {
                break;
            }
        }
        if let Some(&top) = st.last() {
            t.parent[i] = top as i64;
            if end > t.ts[top as usize] + t.dur[top as usize] {
                improper += 1;
            }
        }
        if t.flags[i] & flags::INSTANT == 0 {
            st.push(i as u32);
        }
    }
    for i in 0..n {
        if t.link[i] >= 0 {
            t.parent[i] = t.link[i];
        }
    }
    if improper > 0 {
        t.warnings.push(format!("{improper} event(s) overlap the end of their enclosing range (improper nesting); they were attached to the range they start in"));
    }

    // 4. Steps.
    find_steps(t, proc_of_source, &opts.step_patterns);

    // 5. Symbols (normalized once per distinct (layer, name)).
    t.symbols = Interner::new();
    let mut cache: HashMap<(u8, u32), u32> = HashMap::new();
    t.symbol = Vec::with_capacity(n);
    for i in 0..n {
        let key = (t.layer[i], t.name[i]);
        let s = match cache.get(&key) {
            Some(&s) => s,
            None => {
                let sym = symbol(t.layer_of(i), t.strings.get(t.name[i]), &opts.normalize);
                let s = t.symbols.intern(&sym);
                cache.insert(key, s);
                s
            }
        };
        t.symbol.push(s);
    }
}

/// A flow end's (source, pid, tid, start).
type FlowEnd = (u16, i64, i64, i64);

/// For each `ac2g` flow end (`f`: a GPU activity's source, pid, tid and start), the pid of the
/// process its flow starts in (`s`: the launching call), sorted by flow end for a binary search
/// (`launch_pid_of`), and how many flow ids start in more than one process (those are left out).
/// Kineto and teller write one pair per launch with the `f` at the activity's own start.
///
/// Decision: sorted vectors, not hash maps (as the correlation join above). A Kineto trace holds
/// one flow pair per launch, and two hash maps of them missed the cache on nearly every access. On
/// the 1M-event synthetic Kineto trace (250 000 flow pairs) building the table took 50-100 ms, now
/// 20-26; with the linking of the 250 000 kernels, 113-188 ms, now 74-93 (of a 2.1-2.6 s load).
fn flow_launch_pids(t: &Trace) -> (Vec<(FlowEnd, i64)>, usize) {
    if t.flows.is_empty() {
        return (Vec::new(), 0);
    }
    let Some(ac2g) = t.strings.lookup("ac2g") else {
        return (Vec::new(), 0);
    };
    // (source, flow id) -> the pid its start is in, or None where it starts in several
    let mut start: Vec<(u16, u64, i64)> = t
        .flows
        .iter()
        .filter(|f| f.phase == b's' && f.cat == ac2g)
        .map(|f| (f.source, f.id, f.pid))
        .collect();
    start.sort_unstable();
    start.dedup();
    let mut ambiguous = 0;
    let mut by_id: Vec<(u16, u64, Option<i64>)> = Vec::with_capacity(start.len());
    for run in start.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let one = run.len() == 1; // (after the dedup: one process)
        ambiguous += usize::from(!one);
        by_id.push((run[0].0, run[0].1, one.then_some(run[0].2)));
    }
    drop(start);
    let mut out: Vec<(FlowEnd, i64)> = t
        .flows
        .iter()
        .filter(|f| f.phase == b'f' && f.cat == ac2g)
        .filter_map(|f| {
            let k = by_id.binary_search_by(|c| (c.0, c.1).cmp(&(f.source, f.id))).ok()?;
            Some(((f.source, f.pid, f.tid, f.ts), by_id[k].2?))
        })
        .collect();
    // two flow ends at one activity's start (a file merged twice): the later one in the file wins,
    // as an insert into a map did (a stable sort keeps file order within a key; dedup keeps the
    // first, so the run is reversed first)
    out.reverse();
    out.sort_by_key(|e| e.0);
    out.dedup_by_key(|e| e.0);
    (out, ambiguous)
}

/// The launching pid of the flow that ends at this (source, pid, tid, start), if any.
fn launch_pid_of(ends: &[(FlowEnd, i64)], key: FlowEnd) -> Option<i64> {
    ends.binary_search_by(|e| e.0.cmp(&key)).ok().map(|k| ends[k].1)
}

fn find_steps(t: &mut Trace, proc_of_source: &[u32], patterns: &[String]) {
    let n = t.len();
    t.step = vec![-1; n];
    t.steps.clear();
    let candidate = |l: u8| {
        matches!(
            Layer::from_u8(l),
            Some(Layer::Annotation | Layer::Python | Layer::HostOp | Layer::Other)
        )
    };
    // name id -> matches, computed once per distinct name
    let mut chosen: Vec<u32> = Vec::new();
    for pat in patterns {
        let mut memo: HashMap<u32, bool> = HashMap::new();
        for i in 0..n {
            if !candidate(t.layer[i]) || t.flags[i] & flags::INSTANT != 0 {
                continue;
            }
            let nm = t.name[i];
            let m = *memo.entry(nm).or_insert_with(|| glob_match(pat, t.strings.get(nm)));
            if m {
                chosen.push(i as u32);
            }
        }
        if !chosen.is_empty() {
            break;
        }
    }
    // Drop matches nested inside another match (of the same pattern: the first that matched): those
    // that a match up their parent chain encloses in time. (Not merely any match up the chain: a
    // range that overruns its step, improper nesting, makes the next step its child.) A host range's
    // parent comes before it in index order (events are sorted by start, the parent from a stack),
    // so one pass carries the latest end of the matches above each range: linear, where walking
    // each match's whole chain was quadratic in how deeply matches nest (100k nested
    // `ProfilerStep#i` ranges took 15 s to load). GPU activities are never matches nor parents of
    // host ranges.
    if !chosen.is_empty() {
        let mut is_chosen = vec![false; n];
        for &i in &chosen {
            is_chosen[i as usize] = true;
        }
        let mut up = vec![i64::MIN; n]; // the latest end of a match above the range
        for x in 0..n {
            let p = t.parent[x];
            if p < 0 || t.layer_of(x).on_gpu() {
                continue;
            }
            let p = p as usize;
            debug_assert!(p < x, "a host range's parent comes first");
            up[x] = up[p].max(if is_chosen[p] { t.end(p) } else { i64::MIN });
        }
        // (an enclosing match started no later: the sort; so ending no earlier is enclosing)
        chosen.retain(|&i| up[i as usize] < t.end(i as usize));
    }
    if chosen.is_empty() && !patterns.is_empty() && !patterns.iter().eq(DEFAULT_STEP_PATTERNS.iter()) {
        // patterns someone chose that match nothing: said, not silently replaced by the fallback
        t.warnings.push(format!(
            "no range matches the step patterns {patterns:?}: steps are the root ranges of the busiest \
             thread, else the whole trace"
        ));
    }
    if chosen.is_empty() {
        // Fallback 1: root-level annotation/python ranges of the busiest thread, if there are several.
        let mut per_thread: HashMap<(u16, i64, i64), u64> = HashMap::new();
        for i in 0..n {
            if !t.layer_of(i).on_gpu() {
                *per_thread.entry((t.source[i], t.pid[i], t.tid[i])).or_insert(0) += 1;
            }
        }
        let busiest = per_thread
            .iter()
            .max_by_key(|(k, v)| (**v, std::cmp::Reverse(**k)))
            .map(|(k, _)| *k);
        if let Some((s, p, th)) = busiest {
            let roots: Vec<u32> = (0..n as u32)
                .filter(|&i| {
                    let i = i as usize;
                    t.source[i] == s
                        && t.pid[i] == p
                        && t.tid[i] == th
                        && t.parent[i] < 0
                        && t.dur[i] > 0
                        && matches!(t.layer_of(i), Layer::Annotation | Layer::Python)
                })
                .collect();
            if roots.len() >= 2 {
                chosen = roots;
            }
        }
    }
    if chosen.is_empty() {
        // Fallback 2: the whole trace is one step.
        if n == 0 {
            return;
        }
        let start = *t.ts.iter().min().unwrap();
        let end = (0..n).map(|i| t.end(i)).max().unwrap();
        let name = t.strings.intern("<whole trace>");
        t.steps.push(Step {
            event: -1,
            name,
            start,
            end,
            pid: -1,
            tid: -1,
            source: 0,
        });
        t.step.iter_mut().for_each(|s| *s = 0);
        return;
    }
    chosen.sort_by_key(|&i| (t.ts[i as usize], i));
    for &i in &chosen {
        let i = i as usize;
        t.steps.push(Step {
            event: i as i64,
            name: t.name[i],
            start: t.ts[i],
            end: t.end(i),
            pid: t.pid[i],
            tid: t.tid[i],
            source: t.source[i],
        });
    }
    // CPU events: the step of their process whose window contains their start (steps of one process
    // do not overlap once nested matches are dropped). GPU activities: the step of their launch, or
    // by time within the same correlation scope when unlinked.
    let mut by_proc: HashMap<(u32, i64), Vec<u32>> = HashMap::new();
    let mut by_scope: HashMap<u32, Vec<u32>> = HashMap::new();
    for (k, s) in t.steps.iter().enumerate() {
        let scope = proc_of_source[s.source as usize];
        by_proc.entry((scope, s.pid)).or_default().push(k as u32);
        by_scope.entry(scope).or_default().push(k as u32);
    }
    let steps = &t.steps;
    let find = |list: &Vec<u32>, ts: i64| -> i32 {
        // last step starting at or before ts
        let k = list.partition_point(|&s| steps[s as usize].start <= ts);
        if k == 0 {
            return -1;
        }
        let s = list[k - 1];
        if ts < steps[s as usize].end || (ts == steps[s as usize].start) {
            s as i32
        } else {
            -1
        }
    };
    let mut out = vec![-1i32; n];
    for i in 0..n {
        let scope = proc_of_source[t.source[i] as usize];
        if t.layer_of(i).on_gpu() {
            continue;
        }
        if let Some(list) = by_proc.get(&(scope, t.pid[i])) {
            out[i] = find(list, t.ts[i]);
        }
    }
    // An unlinked GPU activity takes the steps of the process that launched the linked work on its
    // GPU track's pid (several ranks' GPUs in one merged file each follow their own rank), or the
    // whole scope's where no single process did.
    const SHARED: i64 = i64::MIN;
    let mut owner: HashMap<(u32, i64), i64> = HashMap::new();
    for i in 0..n {
        if t.layer_of(i).on_gpu() && t.link[i] >= 0 {
            let cpu = t.pid[t.link[i] as usize];
            let o = owner
                .entry((proc_of_source[t.source[i] as usize], t.pid[i]))
                .or_insert(cpu);
            if *o != cpu {
                *o = SHARED;
            }
        }
    }
    for i in 0..n {
        if !t.layer_of(i).on_gpu() {
            continue;
        }
        let scope = proc_of_source[t.source[i] as usize];
        if t.link[i] >= 0 {
            out[i] = out[t.link[i] as usize];
        } else if let Some(list) = owner
            .get(&(scope, t.pid[i]))
            .filter(|&&o| o != SHARED)
            .and_then(|&o| by_proc.get(&(scope, o)))
            .or_else(|| by_scope.get(&scope))
        {
            out[i] = find(list, t.ts[i]);
        }
    }
    t.step = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn globs() {
        assert!(glob_match("ProfilerStep#*", "ProfilerStep#12"));
        assert!(glob_match("step", "step"));
        assert!(!glob_match("step", "steps"));
        assert!(glob_match("*forward*", "gpu_model_runner: forward"));
        assert!(!glob_match("execute_model*", "xexecute_model"));
    }

    #[test]
    fn gpu_work_links_to_the_call_of_its_correlation_id() {
        // one scope (source 0), two processes: which call a kernel links to
        let mut t = Trace::new();
        let (rt, drv, k) = (Layer::Runtime, Layer::Driver, Layer::Kernel);
        let nm = t.strings.intern("x");
        let mut ts = 0;
        let mut ev = |t: &mut Trace, layer: Layer, pid: i64, corr: u64| -> usize {
            ts += 10;
            let dev = if layer == k { 0 } else { -1 };
            t.push_event(layer, nm, 0, ts, 5, pid, 1, dev, corr, 0, 0, 0);
            t.len() - 1
        };
        ev(&mut t, drv, 1, 5);
        let runtime5 = ev(&mut t, rt, 1, 5); // (the runtime call wins over the driver calls around it)
        ev(&mut t, drv, 1, 5);
        ev(&mut t, drv, 1, 6);
        let last6 = ev(&mut t, drv, 1, 6); // (no runtime call: the last one)
        ev(&mut t, rt, 1, 7);
        ev(&mut t, rt, 2, 7); // (id 7 used by two processes: not linked)
        let first9 = ev(&mut t, rt, 2, 9);
        ev(&mut t, rt, 2, 9); // (two runtime calls: the first)
        let kernels: Vec<usize> = [5, 6, 7, 8, 9, 0].iter().map(|&c| ev(&mut t, k, 0, c)).collect();
        finish(&mut t, &[0], &AlignOptions::default());
        let link: Vec<i64> = kernels.iter().map(|&i| t.link[i]).collect();
        assert_eq!(link, vec![runtime5 as i64, last6 as i64, -1, -1, first9 as i64, -1]);
    }

    #[test]
    fn flow_ends_name_the_process_their_flow_starts_in() {
        let mut t = Trace::new();
        let ac2g = t.strings.intern("ac2g");
        let other = t.strings.intern("fwdbwd");
        let flow_in = |source: u16, id: u64, phase: u8, cat: u32, pid: i64, ts: i64| Flow {
            id,
            phase,
            cat,
            name: cat,
            ts,
            pid,
            tid: 7,
            binding_enclosing: phase == b'f',
            source,
        };
        let flow = |id: u64, phase: u8, cat: u32, pid: i64, ts: i64| flow_in(0, id, phase, cat, pid, ts);
        t.flows = vec![
            flow(1, b's', ac2g, 100, 10),
            flow(1, b'f', ac2g, 0, 50),
            flow(2, b's', ac2g, 200, 11),
            flow(2, b'f', ac2g, 1, 51),
            flow(3, b's', ac2g, 100, 12), // (id 3 starts in two processes: ambiguous, left out)
            flow(3, b's', ac2g, 200, 13),
            flow(3, b'f', ac2g, 1, 60),
            flow(4, b's', other, 300, 14), // (not ac2g: left out)
            flow(4, b'f', other, 1, 70),
            flow(5, b's', ac2g, 300, 15), // (a second flow ending at id 2's activity: the later wins)
            flow(5, b'f', ac2g, 1, 51),
            flow(6, b'f', ac2g, 1, 80),   // (an end without a start)
            flow(7, b's', ac2g, 100, 16), // (two starts in one process: not ambiguous)
            flow(7, b's', ac2g, 100, 17),
            flow(7, b'f', ac2g, 0, 90),
            flow_in(1, 1, b's', ac2g, 400, 18), // (another source's id 1: its own flow)
            flow_in(1, 1, b'f', ac2g, 0, 50),
        ];
        let (ends, ambiguous) = flow_launch_pids(&t);
        assert_eq!(ambiguous, 1);
        assert_eq!(
            ends,
            vec![
                ((0, 0, 7, 50), 100),
                ((0, 0, 7, 90), 100),
                ((0, 1, 7, 51), 300),
                ((1, 0, 7, 50), 400)
            ]
        );
        assert_eq!(launch_pid_of(&ends, (0, 0, 7, 50)), Some(100));
        assert_eq!(launch_pid_of(&ends, (0, 1, 7, 60)), None);
    }
}

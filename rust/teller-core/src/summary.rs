//! Trace summary: what `teller trace summary` prints.

use crate::model::*;
use hashbrown::HashMap;

#[derive(Debug, Clone, Default)]
pub struct KernelStat {
    pub name: String,
    pub symbol: String,
    pub count: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    /// Distinct raw names aggregated under this symbol.
    pub variants: u64,
}

#[derive(Debug, Clone, Default)]
pub struct DeviceStat {
    pub device: i32,
    pub busy_ns: i64,
    pub span_ns: i64,
    /// Launch delay: from the end of a launching call to the start of the first GPU activity it
    /// launched (0 when the work starts before the call returns), over every linked launch on the
    /// device. Microseconds when the GPU is free; a GPU shared with another process (time slicing) or a
    /// deep queue makes it grow (an H200 beside an HBM-copying process: p50 2 us -> 1.3 ms).
    pub launch_delay_p50_ns: i64,
    pub launch_delay_p99_ns: i64,
    pub launches: u64,
    /// Time host threads waited on the device in synchronization records (their union within the
    /// device's span: threads waiting at once count once).
    pub sync_ns: i64,
    /// The input file (`Trace::sources` index) of the device's activities, the first of its process
    /// where a process wrote several (raw files of one pid and host): a GPU is (process, device).
    pub source: u16,
    /// The pid its activities are on (the smallest, where they are on several) and the part of the
    /// input it is ([`Gpu`]: 0 except in a merged file read back, where two processes' GPUs that
    /// share an input and a device number differ by it).
    pub pid: i64,
    pub part: i64,
    /// Where the device's time went (HTA's temporal breakdown): the union of its compute kernels,
    /// of its communication kernels (NCCL/RCCL, vLLM's custom all-reduce: [`is_collective`]), of
    /// its copies and memsets, and the time communication overlapped compute.
    pub compute_ns: i64,
    pub comm_ns: i64,
    pub memory_ns: i64,
    pub comm_compute_overlap_ns: i64,
    /// The idle time (`span_ns - busy_ns`) by what the GPU waited for, from the launching call of
    /// the work that ended each gap: `idle_host_ns`, the part of the gap before the call (the host
    /// had not asked yet: CPU-side work, Python, data loading, a blocking sync); `idle_launch_ns`,
    /// the part during the call (the launch's own cost); `idle_queued_ns`, the part after the call
    /// returned (the launch latency, microseconds on a free GPU; more when the stream waits on an
    /// event or another device, or another process holds the GPU); `idle_unlinked_ns`, gaps ended
    /// by work without a launching call in the trace. They sum to the idle time.
    pub idle_host_ns: i64,
    pub idle_launch_ns: i64,
    pub idle_queued_ns: i64,
    pub idle_unlinked_ns: i64,
    /// Kernels on the device, and those that ran shorter than the call that launched them, of the
    /// calls that launched one kernel (a stream of such kernels is launch-bound: the GPU finishes
    /// each before the host issues the next; a graph launch's kernels share one call).
    pub kernels: u64,
    pub kernels_shorter_than_launch: u64,
    /// Launches whose GPU work starts before the launching call does, and by how much at most: host
    /// and GPU clocks that disagree (the idle split by cause is then approximate).
    pub starts_before_launch: u64,
    pub max_start_before_launch_ns: i64,
}

/// What a GPU activity is, for the time breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Compute,
    Comm,
    Memory,
}

/// A GPU: (the loader's process of its input, device, part). The part tells apart the processes of
/// one input file that name the same device: a trace teller merged from per-rank files, read back,
/// holds every rank's GPU 0, the later ranks' on pids moved by `k * PID_SHIFT` (load.rs); the part
/// is that `k`, 0 for the first and for a file of one process.
type Gpu = (u16, i32, i64);

/// The part of [`Gpu`] of a pid (numbers only: a label's hash is not a moved number).
fn pid_part(pid: i64) -> i64 {
    if (0..1 << 52).contains(&pid) {
        pid / crate::load::PID_SHIFT
    } else {
        0
    }
}

#[derive(Debug, Clone, Copy)]
struct Act {
    start: i64,
    end: i64,
    work: Work,
    /// Index of the launching call, -1 when unlinked.
    link: i64,
}

/// A kernel shorter than its launch call counts toward "launch-bound" only where it started within
/// this long of the call's end (the GPU was waiting for it): an idle GPU starts a kernel some 2 us
/// after its launch returns (H200, `docs/faults.md`); 10 us leaves room for clock skew.
pub const SHORT_KERNEL_DELAY_NS: i64 = 10_000;

/// A collective (communication) kernel by name: NCCL's and RCCL's, vLLM's custom all-reduce
/// (`cross_device_reduce_*`) and names spelling a collective (`all_reduce`, `AllGather`,
/// `reduce_scatter`, `all_to_all`); case and underscores ignored; and expert-parallel all-to-all
/// kernels named by what they do (DeepEP's `deep_ep::intranode::dispatch<...>`,
/// `internode_ll::combine`, their `notify_dispatch` / `cached_notify_*` steps: [`is_ep_exchange`]).
/// The set of `teller.data.summary`'s `_COLLECTIVE`, plus RCCL and the expert-parallel kernels,
/// with the collective's word at the start of a part of the name (the model's features keep the
/// older set, which also takes `small_reduce_kernel`: shipped checkpoints were trained on it).
pub fn is_collective(name: &str) -> bool {
    if is_ep_exchange(name) {
        return true;
    }
    // The name lower-cased without its underscores, each byte with its place in the name.
    let orig = name.as_bytes();
    let (mut k, mut at) = (Vec::with_capacity(orig.len()), Vec::with_capacity(orig.len()));
    for (i, &b) in orig.iter().enumerate().filter(|(_, &b)| b != b'_') {
        k.push(b.to_ascii_lowercase());
        at.push(i);
    }
    // A collective's word starts a part of the name: at its start, after a separator (`_`, `:`,
    // `<`, a space) or as a camel-case word (`ncclAllReduce`). Decision: `small_reduce_kernel`
    // (a split-KV attention combine, MAGMA's `zherk_small_reduce_kernel`) is `smallreduce...` once
    // its underscores are gone, and read as an all-reduce a compute kernel was called communication.
    let starts_part = |i: usize| {
        i == 0 || {
            let (p, c) = (orig[i - 1], orig[i]);
            let next_lower = orig.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            !p.is_ascii_alphanumeric()
                || (c.is_ascii_uppercase() && (p.is_ascii_lowercase() || p.is_ascii_digit()))
                // (after an acronym: `MNNVLAllReduce`, `NVLSAllGather`)
                || (c.is_ascii_uppercase() && p.is_ascii_uppercase() && next_lower)
        }
    };
    let found = |pat: &[u8], word: bool| {
        k.windows(pat.len())
            .enumerate()
            .any(|(j, w)| w == pat && (!word || starts_part(at[j])))
    };
    [b"nccl".as_slice(), b"rccl", b"crossdevicereduce"]
        .iter()
        .any(|p| found(p, false))
        || [b"allreduce".as_slice(), b"allgather", b"reducescatter", b"alltoall"]
            .iter()
            .any(|p| found(p, true))
}

/// An expert-parallel token exchange: the kernel's own name (the last `::` part, template
/// arguments and parameters aside) is `dispatch`, `combine` or one of DeepEP's notify steps
/// around them, and its namespaces, where it has any, are DeepEP's (`deep_ep`, `intranode`,
/// `internode`, `internode_ll`): a `dispatch` of another library is not taken for one. (DeepEP's
/// `get_dispatch_layout` computes the routing locally: not an exchange.)
pub fn is_ep_exchange(name: &str) -> bool {
    let sig = name.split('(').next().unwrap_or(name);
    // drop template arguments (balanced), so `tuple<int> ns::dispatch<8>` reads as `ns::dispatch`
    let mut plain = String::with_capacity(sig.len());
    let mut depth = 0usize;
    for ch in sig.chars() {
        match ch {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(ch),
            _ => {}
        }
    }
    let qualified = plain.split_whitespace().last().unwrap_or("");
    let mut parts: Vec<&str> = qualified.split("::").collect();
    let own = parts.pop().unwrap_or("");
    let exchange = matches!(
        own,
        "dispatch"
            | "combine"
            | "notify_dispatch"
            | "cached_notify"
            | "cached_notify_dispatch"
            | "cached_notify_combine"
    );
    exchange
        && parts
            .iter()
            .all(|p| p.is_empty() || matches!(*p, "deep_ep" | "intranode" | "internode" | "internode_ll"))
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub events: u64,
    /// Events per original category (Kineto `cat`; the layer's default category when absent).
    pub by_category: Vec<(String, u64)>,
    pub by_layer: Vec<(String, u64)>,
    pub steps: u64,
    pub gpu_events: u64,
    pub linked_gpu_events: u64,
    pub span_ns: i64,
    pub top_kernels: Vec<KernelStat>,
    pub devices: Vec<DeviceStat>,
    pub processes: u64,
    pub threads: u64,
    pub sources: u64,
    pub warnings: Vec<String>,
}

/// Total length of the union of intervals (sorted by start in place).
fn union_len(iv: &mut [(i64, i64)]) -> i64 {
    iv.sort_unstable();
    let mut total: i64 = 0;
    let mut cur: Option<(i64, i64)> = None;
    for &(s, e) in iv.iter() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total = total.saturating_add(ce.saturating_sub(cs));
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total = total.saturating_add(ce.saturating_sub(cs));
    }
    total
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

pub fn summarize(t: &Trace, top: usize) -> Summary {
    let n = t.len();
    let mut s = Summary {
        events: n as u64,
        steps: t.steps.len() as u64,
        sources: t.sources.len() as u64,
        warnings: t.warnings.clone(),
        ..Default::default()
    };
    let mut cats: HashMap<&str, u64> = HashMap::new();
    let mut layers = [0u64; NUM_LAYERS];
    let mut kern: HashMap<u32, KernelStat> = HashMap::new();
    let mut variant_ns: HashMap<(u32, u32), i64> = HashMap::new();
    // A GPU is (process, device): per-rank files of one job each name their GPU 0 (a process sees its
    // own device as 0 under CUDA_VISIBLE_DEVICES), and two such GPUs are not one. The process of a
    // source is the loader's (raw files of one host, pid and start time: the collector reopens its
    // file; a Chrome file is its own), named by its first source.
    let group: Vec<u16> = {
        let mut first: HashMap<u32, u16> = HashMap::new();
        t.sources
            .iter()
            .enumerate()
            .map(|(k, src)| *first.entry(src.process).or_insert(k as u16))
            .collect()
    };
    let group_of = |src: u16| group.get(src as usize).copied().unwrap_or(src);
    // per GPU: its activities and the smallest pid they are on
    let mut dev: HashMap<Gpu, (Vec<Act>, i64)> = HashMap::new();
    // per name id: is it a collective kernel (names repeat: each is classified once)
    let mut coll: HashMap<u32, bool> = HashMap::new();
    // the kernels of each GPU: (launching call, duration); a call's GPU activities (a graph launch has many)
    // per GPU, each kernel's (launch call, duration, start)
    let mut kernels: HashMap<Gpu, Vec<(i64, i64, i64)>> = HashMap::new();
    // (indexed by the call's event index: a hash map per linked activity cost ~25 % of the summary)
    let mut per_call: Vec<u32> = vec![0; if t.link.is_empty() { 0 } else { n }];
    // launching call -> (GPU, earliest start of the GPU work it launched)
    let mut first_work: HashMap<i64, (Gpu, i64)> = HashMap::new();
    let mut early: HashMap<Gpu, (u64, i64)> = HashMap::new();
    let mut sync: HashMap<Gpu, Vec<(i64, i64)>> = HashMap::new();
    // the host's waits (sync records) go to the GPU of their process: the part of the GPU work that
    // process's calls launched (its host pid is not moved with its GPU's in a merged Kineto file), else
    // its own pid's
    let mut waits_of: Vec<usize> = Vec::new();
    // (only where it differs from the host pid's own part: a lookup per linked activity cost ~10 %)
    let mut host_part: HashMap<(u16, i64, i32), i64> = HashMap::new();
    let mut last_host: Option<(u16, i64, i32)> = None;
    let mut threads: HashMap<(u16, i64, i64), ()> = HashMap::new();
    let mut procs: HashMap<(u16, i64), ()> = HashMap::new();
    for i in 0..n {
        let l = t.layer_of(i);
        layers[l as usize] += 1;
        let cat = if t.cat[i] != 0 {
            t.strings.get(t.cat[i])
        } else {
            LAYER_DEFAULT_CATS[l as usize]
        };
        *cats.entry(cat).or_insert(0) += 1;
        if l.is_gpu_activity() {
            s.gpu_events += 1;
            let gpu = (group_of(t.source[i]), t.device[i], pid_part(t.pid[i]));
            if !t.link.is_empty() && t.link[i] >= 0 {
                let c = t.link[i] as usize;
                let hk = (group_of(t.source[c]), t.pid[c], gpu.1);
                if gpu.2 != pid_part(t.pid[c]) && last_host != Some(hk) {
                    // (a merged per-rank file: every linked activity of a later rank lands here; the
                    // last key is remembered, as one host's launches come in runs)
                    host_part.entry(hk).or_insert(gpu.2);
                    last_host = Some(hk);
                }
                s.linked_gpu_events += 1;
                per_call[t.link[i] as usize] += 1;
                let e = first_work.entry(t.link[i]).or_insert((gpu, t.ts[i]));
                if t.ts[i] < e.1 {
                    *e = (gpu, t.ts[i]);
                }
            }
            let link = if t.link.is_empty() { -1 } else { t.link[i] };
            let work = match l {
                Layer::Kernel => {
                    let c = *coll
                        .entry(t.name[i])
                        .or_insert_with(|| is_collective(t.strings.get(t.name[i])));
                    kernels.entry(gpu).or_default().push((link, t.dur[i], t.ts[i]));
                    if c {
                        Work::Comm
                    } else {
                        Work::Compute
                    }
                }
                _ => Work::Memory,
            };
            let d = dev.entry(gpu).or_insert_with(|| (Vec::new(), t.pid[i]));
            d.1 = d.1.min(t.pid[i]);
            d.0.push(Act {
                start: t.ts[i],
                end: t.end(i),
                work,
                link,
            });
        } else if !l.on_gpu() {
            if l == Layer::Sync && t.device[i] >= 0 {
                waits_of.push(i);
            }
            threads.insert((t.source[i], t.pid[i], t.tid[i]), ());
            procs.insert((t.source[i], t.pid[i]), ());
        }
        if l == Layer::Kernel {
            // Aggregate by normalized symbol (template/tile variants of one kernel together); keep the
            // raw name of the variant with the most GPU time as an example.
            let key = if t.symbol.is_empty() { t.name[i] } else { t.symbol[i] };
            let k = kern.entry(key).or_insert_with(|| KernelStat {
                symbol: if t.symbol.is_empty() {
                    String::new()
                } else {
                    t.symbols.get(t.symbol[i]).to_string()
                },
                ..Default::default()
            });
            k.count += 1;
            k.total_ns += t.dur[i];
            *variant_ns.entry((key, t.name[i])).or_insert(0) += t.dur[i];
            k.max_ns = k.max_ns.max(t.dur[i]);
        }
    }
    // a wait whose host launched nothing linked on that GPU: the GPU's part where (process, device)
    // has one, else its own pid's (-1 in the map: several)
    let mut only_part: HashMap<(u16, i32), i64> = HashMap::new();
    if !waits_of.is_empty() {
        for &(g, d, p) in dev.keys() {
            let e = only_part.entry((g, d)).or_insert(p);
            if *e != p {
                *e = -1;
            }
        }
    }
    for &i in &waits_of {
        let g = group_of(t.source[i]);
        let part = host_part
            .get(&(g, t.pid[i], t.device[i]))
            .copied()
            .or_else(|| only_part.get(&(g, t.device[i])).copied().filter(|&p| p >= 0))
            .unwrap_or_else(|| pid_part(t.pid[i]));
        sync.entry((g, t.device[i], part))
            .or_default()
            .push((t.ts[i], t.end(i)));
    }
    let mut best: HashMap<u32, (i64, u32)> = HashMap::new();
    for (&(key, name), &ns) in &variant_ns {
        let e = best.entry(key).or_insert((ns, name));
        if ns > e.0 || (ns == e.0 && name < e.1) {
            *e = (ns, name);
        }
    }
    for (key, k) in kern.iter_mut() {
        k.name = t.strings.get(best[key].1).to_string();
        k.variants = variant_ns.keys().filter(|(kk, _)| kk == key).count() as u64;
    }
    if n > 0 {
        let start = *t.ts.iter().min().unwrap();
        let end = (0..n).map(|i| t.end(i)).max().unwrap();
        s.span_ns = end.saturating_sub(start);
    }
    let mut c: Vec<(String, u64)> = cats.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    c.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    s.by_category = c;
    s.by_layer = layers
        .iter()
        .enumerate()
        .filter(|(_, &v)| v > 0)
        .map(|(i, &v)| (LAYER_NAMES[i].to_string(), v))
        .collect();
    let mut k: Vec<KernelStat> = kern.into_values().collect();
    k.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
    k.truncate(top);
    s.top_kernels = k;
    let mut delays: HashMap<Gpu, Vec<i64>> = HashMap::new();
    for (&call, &(gpu, start)) in &first_work {
        // work that starts before its call does: host and GPU clocks disagree (per launch)
        let before = t.ts[call as usize].saturating_sub(start);
        if before > 0 {
            let e = early.entry(gpu).or_insert((0, 0));
            e.0 += 1;
            e.1 = e.1.max(before);
        }
        delays
            .entry(gpu)
            .or_default()
            .push(start.saturating_sub(t.end(call as usize)).max(0));
    }
    let mut d: Vec<DeviceStat> = dev
        .into_iter()
        .map(|((source, device, part), (mut acts, pid))| {
            let gpu = (source, device, part);
            let st = acts.iter().map(|x| x.start).min().unwrap_or(0);
            let en = acts.iter().map(|x| x.end).max().unwrap_or(0);
            let mut dl = delays.remove(&gpu).unwrap_or_default();
            dl.sort_unstable();
            let of = |w: &[Work]| -> Vec<(i64, i64)> {
                acts.iter()
                    .filter(|a| w.contains(&a.work))
                    .map(|a| (a.start, a.end))
                    .collect()
            };
            let compute_ns = union_len(&mut of(&[Work::Compute]));
            let comm_ns = union_len(&mut of(&[Work::Comm]));
            let both = union_len(&mut of(&[Work::Compute, Work::Comm]));
            let ks = kernels.get(&gpu).map(Vec::as_slice).unwrap_or_default();
            // (only a call that launched this one kernel: a graph launch's kernels are not each
            // shorter than "their" launch, they share one)
            // and only a kernel the GPU started at once (within SHORT_KERNEL_DELAY_NS of its call's
            // end): one that sat queued behind earlier work ran while the host was ahead, whatever
            // its length (a review found ResNet's "launch-bound" kernels queued for 5 ms)
            let k_short = ks
                .iter()
                .filter(|&&(c, dur, start)| {
                    c >= 0
                        && per_call[c as usize] == 1
                        && dur < t.dur[c as usize]
                        && start.saturating_sub(t.end(c as usize)) <= SHORT_KERNEL_DELAY_NS
                })
                .count();
            // the host's wait on the GPU: the union of its sync records (threads waiting at once
            // count once), within the GPU's span
            let mut waits: Vec<(i64, i64)> = sync
                .get(&gpu)
                .map(|v| {
                    v.iter()
                        .map(|&(a, b)| (a.max(st), b.min(en)))
                        .filter(|(a, b)| a < b)
                        .collect()
                })
                .unwrap_or_default();
            let sync_ns = union_len(&mut waits);
            let mut x = DeviceStat {
                device,
                source,
                pid,
                part,
                busy_ns: 0,
                span_ns: en.saturating_sub(st),
                launch_delay_p50_ns: percentile(&dl, 0.50),
                launch_delay_p99_ns: percentile(&dl, 0.99),
                launches: dl.len() as u64,
                sync_ns,
                compute_ns,
                comm_ns,
                memory_ns: union_len(&mut of(&[Work::Memory])),
                comm_compute_overlap_ns: compute_ns.saturating_add(comm_ns).saturating_sub(both),
                kernels: ks.len() as u64,
                kernels_shorter_than_launch: k_short as u64,
                starts_before_launch: early.get(&gpu).map_or(0, |e| e.0),
                max_start_before_launch_ns: early.get(&gpu).map_or(0, |e| e.1),
                ..Default::default()
            };
            idle_breakdown(t, &mut acts, &mut x);
            x
        })
        .collect();
    d.sort_by_key(|x| (x.device, x.source, x.part));
    s.devices = d;
    s.threads = threads.len() as u64;
    s.processes = procs.len() as u64;
    s
}

/// Sets `busy_ns` and the `idle_*` parts of `x` from the device's activities (sorted in place).
/// Each gap between the merged busy blocks is charged by the launching call of the work that ends
/// it (the first to start; of several starting together, the first with a launching call).
fn idle_breakdown(t: &Trace, acts: &mut [Act], x: &mut DeviceStat) {
    acts.sort_unstable_by_key(|a| (a.start, a.link < 0, a.end, a.link));
    let Some(first) = acts.first() else {
        return;
    };
    let (mut block_start, mut block_end) = (first.start, first.end);
    for a in acts.iter().skip(1) {
        if a.start <= block_end {
            block_end = block_end.max(a.end);
            continue;
        }
        x.busy_ns = x.busy_ns.saturating_add(block_end.saturating_sub(block_start));
        let (g0, g1) = (block_end, a.start);
        let gap = g1.saturating_sub(g0);
        if a.link < 0 {
            x.idle_unlinked_ns += gap;
        } else {
            // the gap cut by the launching call [c0, c1], clamped to it: before the call (the host
            // had not asked), during it, after its return (host and GPU clocks may disagree by a
            // little: the clamp keeps the three parts within the gap, summing to it)
            let c = a.link as usize;
            let c0 = t.ts[c].clamp(g0, g1);
            let c1 = t.end(c).clamp(c0, g1);
            x.idle_host_ns += c0 - g0;
            x.idle_launch_ns += c1 - c0;
            x.idle_queued_ns += g1 - c1;
        }
        block_start = a.start;
        block_end = a.end;
    }
    x.busy_ns = x.busy_ns.saturating_add(block_end.saturating_sub(block_start));
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(super::percentile(&v, 0.5), 50);
        assert_eq!(super::percentile(&v, 0.99), 99);
        assert_eq!(super::percentile(&[7], 0.99), 7);
        assert_eq!(super::percentile(&[], 0.5), 0);
    }

    #[test]
    fn collectives() {
        for n in [
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "rcclKernel_Broadcast",
            "void vllm::cross_device_reduce_2stage<float, 4>",
            "AllGather_kernel",
            "reduce_scatter",
            "all_to_all_combine",
            "ncclAllReduce",
            "custom_all_reduce",
            "MNNVLAllReduceKernel",
            "NVLSAllGather",
            "void vllm::all_reduce<float>(float*)",
            "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)",
            "void deep_ep::internode_ll::combine<7168, 8>(void*, int)",
            "void deep_ep::intranode::cached_notify_combine<8>(void**, int*)",
            "deep_ep::internode::notify_dispatch",
            "void deep_ep::internode::cached_notify<8, 4>(int, int*)",
            "combine",
        ] {
            assert!(super::is_collective(n), "{n}");
        }
        for n in [
            "gemm",
            "reduce_kernel",
            "all_gemm",
            "scatter_kernel",
            "void deep_ep::layout::get_dispatch_layout(long const*, int*)",
            "moe_combine_kernel",
            "void combine_fp8<float>(float*)",
            "void thrust::cuda_cub::core::_kernel_agent<ns::dispatch>(int)",
            "void other_lib::dispatch<int>(int)",
            "small_reduce_kernel",
            "zherk_small_reduce_kernel",
            "void smallReduceKernel<float>(float*)",
            "overall_gather_kernel",
        ] {
            assert!(!super::is_collective(n), "{n}");
        }
    }

    #[test]
    fn union() {
        let mut v = vec![(5, 10), (0, 3), (2, 4), (10, 11)];
        assert_eq!(super::union_len(&mut v), 4 + 6);
    }
}

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
    /// Time in CUPTI synchronization records on the device (host threads waiting for its work).
    pub sync_ns: i64,
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
    let mut total = 0;
    let mut cur: Option<(i64, i64)> = None;
    for &(s, e) in iv.iter() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
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
    let mut dev: HashMap<i32, Vec<(i64, i64)>> = HashMap::new();
    // launching call -> (device, earliest start of the GPU work it launched)
    let mut first_work: HashMap<i64, (i32, i64)> = HashMap::new();
    let mut sync: HashMap<i32, i64> = HashMap::new();
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
            if !t.link.is_empty() && t.link[i] >= 0 {
                s.linked_gpu_events += 1;
                let e = first_work.entry(t.link[i]).or_insert((t.device[i], t.ts[i]));
                if t.ts[i] < e.1 {
                    *e = (t.device[i], t.ts[i]);
                }
            }
            dev.entry(t.device[i]).or_default().push((t.ts[i], t.end(i)));
        } else if !l.on_gpu() {
            if l == Layer::Sync && t.device[i] >= 0 {
                *sync.entry(t.device[i]).or_insert(0) += t.dur[i];
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
        s.span_ns = end - start;
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
    let mut delays: HashMap<i32, Vec<i64>> = HashMap::new();
    for (&call, &(device, start)) in &first_work {
        delays
            .entry(device)
            .or_default()
            .push((start - t.end(call as usize)).max(0));
    }
    let mut d: Vec<DeviceStat> = dev
        .into_iter()
        .map(|(device, mut iv)| {
            let st = iv.iter().map(|x| x.0).min().unwrap_or(0);
            let en = iv.iter().map(|x| x.1).max().unwrap_or(0);
            let mut dl = delays.remove(&device).unwrap_or_default();
            dl.sort_unstable();
            DeviceStat {
                device,
                busy_ns: union_len(&mut iv),
                span_ns: en - st,
                launch_delay_p50_ns: percentile(&dl, 0.50),
                launch_delay_p99_ns: percentile(&dl, 0.99),
                launches: dl.len() as u64,
                sync_ns: sync.get(&device).copied().unwrap_or(0),
            }
        })
        .collect();
    d.sort_by_key(|x| x.device);
    s.devices = d;
    s.threads = threads.len() as u64;
    s.processes = procs.len() as u64;
    s
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
    fn union() {
        let mut v = vec![(5, 10), (0, 3), (2, 4), (10, 11)];
        assert_eq!(super::union_len(&mut v), 4 + 6);
    }
}

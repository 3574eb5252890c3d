//! `cargo run --release --example read_raw -- FILE.tmsgpack [N]`: `raw::read_raw` alone (decoding,
//! pairing, clocks; not the alignment of `load`), N reads (default 10): the mean time, and the
//! process's peak resident memory after one read (`VmHWM`; the file itself is in memory too).
//! The before/after table of docs/benchmarks.md ("Raw traces") was measured with it.
fn vm_hwm_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: read_raw FILE.tmsgpack [N]");
        std::process::exit(2);
    };
    let n: usize = args.next().and_then(|x| x.parse().ok()).unwrap_or(10).max(1);
    let b = std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(1);
    });
    let t0 = std::time::Instant::now();
    let events = match teller_core::raw::read_raw(&path, &b, 0) {
        Ok((t, _)) => t.len(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let first = t0.elapsed();
    let hwm = vm_hwm_kb();
    let t1 = std::time::Instant::now();
    for _ in 1..n {
        let r = teller_core::raw::read_raw(&path, &b, 0);
        std::hint::black_box(r.is_ok());
    }
    let mean = if n > 1 { t1.elapsed() / (n as u32 - 1) } else { first };
    println!(
        "{path}: {} MB, {events} events; read_raw first {:.1} ms, mean of the next {} {:.1} ms; peak RSS {} MB",
        b.len() as f64 / 1e6,
        first.as_secs_f64() * 1e3,
        n - 1,
        mean.as_secs_f64() * 1e3,
        hwm.map_or("?".to_string(), |k| format!("{:.0}", k as f64 / 1024.0)),
    );
}

//! `cargo run --release --example load_trace -- FILE...`: load traces and print counts and timings
//! (handy for profiling the parser with callgrind or perf).
fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: load_trace FILE...");
        std::process::exit(2);
    }
    let t0 = std::time::Instant::now();
    match teller_core::load(&paths, &teller_core::LoadOptions::default()) {
        Ok(t) => {
            let s = teller_core::summary::summarize(&t, 3);
            println!(
                "{} events, {} gpu ({} linked), {} steps in {:?}",
                t.len(),
                s.gpu_events,
                s.linked_gpu_events,
                t.steps.len(),
                t0.elapsed()
            );
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

"""Small, real workloads that teller collects on a CPU (demos, real fault runs, benchmarks)."""

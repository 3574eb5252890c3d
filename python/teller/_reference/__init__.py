"""Pure-Python reference implementations (test oracles). Slow on purpose: simple and obviously correct."""

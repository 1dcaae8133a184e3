"""Proof suites: benchmarks (`python -m bench.run`) and chaos runs (`python -m bench.chaos`) that
start the real processes on loopback against fake LLM and platform servers speaking real HTTP."""

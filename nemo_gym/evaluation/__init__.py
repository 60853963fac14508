"""Evaluation of finished rollouts: benchmarks prepared, per-agent metrics, re-verification and reward profiles."""

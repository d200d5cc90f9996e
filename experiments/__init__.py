"""Experiment launchers (absl flags) that reproduce the paper's ablations."""

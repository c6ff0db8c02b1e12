"""Learned gates: mismatch traces, the features a gate reads, the classifiers, their thresholds."""

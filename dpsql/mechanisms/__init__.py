"""Noise and selection mechanisms: samplers, calibration, partition selection, quantiles."""

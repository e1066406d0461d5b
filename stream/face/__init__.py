"""Face analysis: detection, dense landmarks, tracking and smoothing."""

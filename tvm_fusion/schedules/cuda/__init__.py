"""CUDA schedules."""

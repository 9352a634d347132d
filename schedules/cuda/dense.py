"""CUDA schedule for dense + epilogue (placeholder replaced below)."""

"""CUDA schedule for the conv2d epilogue compute (placeholder replaced below)."""

"""CPU (llvm) schedules."""

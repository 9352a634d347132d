/* Linked into every library tvm_fusion exports (tvm_fusion/deploy/export.py): when the library is loaded
 * (dlopen, also by a plain tvm.runtime.load_module without tvm_fusion), size TVM's CPU thread pool to the
 * cores this process may run on. TVM's pool reads TVM_NUM_THREADS, then OMP_NUM_THREADS, once, when it
 * starts (the first parallel kernel); with neither it takes the machine's core count, halved on x86
 * (std::thread::hardware_concurrency() / 2, not the process's affinity): one thread on a 2-core machine.
 * A variable the user set wins; a pool already started keeps its size. */
#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((constructor)) static void tvm_fusion_size_thread_pool(void) {
  cpu_set_t allowed;
  char count[16];
  if (getenv("TVM_NUM_THREADS") || getenv("OMP_NUM_THREADS") ||
      sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return;
  }
  snprintf(count, sizeof(count), "%d", CPU_COUNT(&allowed));
  setenv("TVM_NUM_THREADS", count, 0);
}
#endif

/* A stand-in CUDA driver (libcuda.so.1) and runtime (libcudart.so.13) for machines without a GPU.
 *
 * Built twice by tests/cuda_stub/__init__.py with the system C compiler:
 *   cc -shared -fPIC -DSTUB_DRIVER  -Wl,-soname,libcuda.so.1                           -> libcuda.so.1
 *   cc -shared -fPIC -DSTUB_RUNTIME -Wl,-soname,libcudart.so.13 -Wl,--version-script=  -> libcudart.so.13
 * It implements the calls TVM 0.27's CUDA runtime (libtvm_runtime_cuda.so) makes: one device with sm_90
 * attributes, memory in host memory (malloc/memcpy), streams and events as no-ops, module load that keeps
 * the image, function lookup that fails unless the kernel's name is in the image, and launches that run
 * nothing. Every call is appended as one line to the file named by $STUB_CUDA_LOG:
 *   launch <kernel> grid=X,Y,Z block=X,Y,Z shmem=N
 * CUDA graphs (the runtime's stream capture, as TVM's vm.builtin.cuda_graph.run_or_capture uses it): between
 * cudaStreamBeginCapture and cudaStreamEndCapture a launch is recorded into the graph, not run, and logged
 *   capture <kernel> grid=... (the driver asks the runtime library through cudaStubCaptureLaunch)
 * and each cudaGraphLaunch logs `graph_launch nodes=N` and then, per recorded kernel, `replay <kernel> ...`.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

static void stub_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void stub_log(const char *fmt, ...) {
  const char *path = getenv("STUB_CUDA_LOG");
  if (!path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

#define NOT_SUPPORTED 801

#ifdef STUB_DRIVER
#include <dlfcn.h>
typedef struct { const unsigned char *image; size_t size; } Module;
typedef struct { char name[256]; Module *module; } Function;
typedef struct {
  unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void *hStream;
  void *attrs;
  unsigned int numAttrs;
} LaunchConfig;

static size_t image_size(const unsigned char *p) {
  if (!memcmp(p, "\x50\xed\x55\xba", 4)) { /* fatbin: u16 header size at 6, u64 body size at 8 */
    uint16_t header; uint64_t body;
    memcpy(&header, p + 6, 2); memcpy(&body, p + 8, 8);
    return header + body;
  }
  if (!memcmp(p, "\x7f" "ELF", 4)) { /* ELF64: section headers are last */
    uint64_t shoff; uint16_t shentsize, shnum;
    memcpy(&shoff, p + 0x28, 8); memcpy(&shentsize, p + 0x3a, 2); memcpy(&shnum, p + 0x3c, 2);
    return shoff + (uint64_t)shentsize * shnum;
  }
  return strlen((const char *)p); /* PTX text */
}

int cuModuleLoadData(void **module, const void *image) {
  Module *m = calloc(1, sizeof(Module));
  m->image = image;
  m->size = image_size(image);
  *module = m;
  stub_log("cuModuleLoadData bytes=%zu magic=%02x%02x%02x%02x", m->size, m->image[0], m->image[1],
           m->image[2], m->image[3]);
  return 0;
}

int cuModuleUnload(void *module) { stub_log("cuModuleUnload"); free(module); return 0; }

int cuModuleGetFunction(void **func, void *module, const char *name) {
  Module *m = module;
  if (!memmem(m->image, m->size, name, strlen(name))) {
    stub_log("cuModuleGetFunction %s missing", name);
    return 500; /* CUDA_ERROR_NOT_FOUND */
  }
  Function *f = calloc(1, sizeof(Function));
  snprintf(f->name, sizeof f->name, "%s", name);
  f->module = m;
  *func = f;
  stub_log("cuModuleGetFunction %s", name);
  return 0;
}

/* the runtime stub's hook: records `line` into the graph being captured and returns 1, or returns 0 */
typedef int (*CaptureLaunch)(const char *line);
static CaptureLaunch capture_hook(void) {
  static CaptureLaunch hook;
  if (!hook) {
    void *runtime = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    if (runtime) hook = (CaptureLaunch)dlsym(runtime, "cudaStubCaptureLaunch");
  }
  return hook;
}

int cuLaunchKernelEx(const LaunchConfig *c, void *func, void **params, void **extra) {
  (void)params; (void)extra;
  char line[512];
  snprintf(line, sizeof line, "%s grid=%u,%u,%u block=%u,%u,%u shmem=%u", ((Function *)func)->name, c->gridDimX,
           c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->sharedMemBytes);
  CaptureLaunch hook = capture_hook();
  if (hook && hook(line)) return 0;
  stub_log("launch %s", line);
  return 0;
}

int cuFuncSetAttribute(void *func, int attr, int value) {
  stub_log("cuFuncSetAttribute %s attr=%d value=%d", ((Function *)func)->name, attr, value);
  return 0;
}

int cuGetErrorName(int error, const char **s) { *s = error ? "CUDA_ERROR_STUB" : "CUDA_SUCCESS"; return 0; }
int cuGetErrorString(int error, const char **s) { *s = error ? "error from the stub driver" : "no error"; return 0; }
int cuDeviceGetName(char *name, int len, int dev) { (void)dev; snprintf(name, len, "stub GPU"); return 0; }
int cuTensorMapEncodeTiled(void) { stub_log("cuTensorMapEncodeTiled"); return NOT_SUPPORTED; }
#endif

#ifdef STUB_RUNTIME
/* cudaDeviceAttr values (driver_types.h) and what an H100 / H200 (sm_90, 132 SMs) answers */
static int attribute(int attr) {
  switch (attr) {
    case 1: return 1024;       /* MaxThreadsPerBlock */
    case 2: case 3: return 1024; /* MaxBlockDimX, Y */
    case 4: return 64;         /* MaxBlockDimZ */
    case 5: return 2147483647; /* MaxGridDimX */
    case 6: case 7: return 65535;
    case 8: return 49152;      /* MaxSharedMemoryPerBlock */
    case 10: return 32;        /* WarpSize */
    case 12: return 65536;     /* MaxRegistersPerBlock */
    case 13: return 1980000;   /* ClockRate (kHz) */
    case 16: return 132;       /* MultiProcessorCount */
    case 38: return 52428800;  /* L2CacheSize */
    case 75: return 9;         /* ComputeCapabilityMajor */
    case 76: return 0;         /* ComputeCapabilityMinor */
    case 97: return 232448;    /* MaxSharedMemoryPerBlockOptin */
    default: return 1;
  }
}

int cudaGetDeviceCount(int *n) { stub_log("cudaGetDeviceCount"); *n = 1; return 0; }
int cudaGetDevice(int *d) { *d = 0; return 0; }
int cudaSetDevice(int d) { return d == 0 ? 0 : 101; /* cudaErrorInvalidDevice */ }
int cudaDeviceGetAttribute(int *value, int attr, int dev) {
  if (dev != 0) return 101;
  *value = attribute(attr);
  return 0;
}
int cudaGetDeviceProperties(void *prop, int dev) {
  (void)dev;
  snprintf((char *)prop, 256, "stub GPU"); /* `name` is the first field; leave the rest alone */
  return 0;
}
int cudaMemGetInfo(size_t *free_bytes, size_t *total) { *free_bytes = *total = (size_t)80 << 30; return 0; }

int cudaMalloc(void **p, size_t n) {
  if (posix_memalign(p, 256, n ? n : 1)) return 2; /* cudaErrorMemoryAllocation */
  memset(*p, 0, n);
  stub_log("cudaMalloc %zu", n);
  return 0;
}
int cudaFree(void *p) { free(p); return 0; }
int cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
int cudaFreeHost(void *p) { free(p); return 0; }
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
  (void)stream;
  memmove(dst, src, n);
  stub_log("cudaMemcpyAsync %zu kind=%d", n, kind);
  return 0;
}
int cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n, void *stream) {
  (void)dd; (void)sd; (void)stream;
  memmove(dst, src, n);
  return 0;
}

static int stream_token, event_token;
int cudaStreamCreate(void **s) { *s = &stream_token; return 0; }
int cudaStreamCreateWithFlags(void **s, unsigned flags) { (void)flags; *s = &stream_token; return 0; }
int cudaStreamDestroy(void *s) { (void)s; return 0; }
int cudaStreamSynchronize(void *s) { (void)s; stub_log("cudaStreamSynchronize"); return 0; }
int cudaStreamWaitEvent(void *s, void *e, unsigned flags) { (void)s; (void)e; (void)flags; return 0; }
/* a CUDA graph: the launches recorded between cudaStreamBeginCapture and cudaStreamEndCapture */
typedef struct { int n, cap; char **lines; } Graph;
static Graph *capturing;

static Graph *graph_copy(const Graph *g) {
  Graph *c = calloc(1, sizeof(Graph));
  c->n = c->cap = g->n;
  c->lines = calloc(g->n ? g->n : 1, sizeof(char *));
  for (int i = 0; i < g->n; i++) c->lines[i] = strdup(g->lines[i]);
  return c;
}
static void graph_free(Graph *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) free(g->lines[i]);
  free(g->lines);
  free(g);
}

int cudaStubCaptureLaunch(const char *line) {
  if (!capturing) return 0;
  if (capturing->n == capturing->cap) {
    capturing->cap = capturing->cap ? 2 * capturing->cap : 64;
    capturing->lines = realloc(capturing->lines, capturing->cap * sizeof(char *));
  }
  capturing->lines[capturing->n++] = strdup(line);
  stub_log("capture %s", line);
  return 1;
}
int cudaStreamBeginCapture(void *s, int mode) {
  (void)s;
  if (capturing) return 900; /* cudaErrorStreamCaptureUnsupported: one capture at a time */
  capturing = calloc(1, sizeof(Graph));
  stub_log("cudaStreamBeginCapture mode=%d", mode);
  return 0;
}
int cudaStreamEndCapture(void *s, void **g) {
  (void)s;
  if (!capturing) return 901; /* cudaErrorStreamCaptureInvalidated */
  *g = capturing;
  stub_log("cudaStreamEndCapture nodes=%d", capturing->n);
  capturing = NULL;
  return 0;
}
int cudaEventCreate(void **e) { *e = &event_token; return 0; }
int cudaEventDestroy(void *e) { (void)e; return 0; }
int cudaEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
int cudaEventSynchronize(void *e) { (void)e; return 0; }
int cudaEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 0.0f; return 0; }
int cudaGraphInstantiate(void **x, void *g, unsigned long long flags) {
  (void)flags;
  *x = graph_copy(g);
  stub_log("cudaGraphInstantiate nodes=%d", ((Graph *)g)->n);
  return 0;
}
int cudaGraphLaunch(void *x, void *s) {
  (void)s;
  Graph *g = x;
  stub_log("graph_launch nodes=%d", g->n);
  for (int i = 0; i < g->n; i++) stub_log("replay %s", g->lines[i]);
  return 0;
}
int cudaGraphDestroy(void *g) { graph_free(g); return 0; }
int cudaGraphExecDestroy(void *x) { graph_free(x); return 0; }
int cudaGetLastError(void) { return 0; }
int cudaPeekAtLastError(void) { return 0; }
const char *cudaGetErrorName(int e) { return e ? "cudaErrorStub" : "cudaSuccess"; }
const char *cudaGetErrorString(int e) { return e ? "error from the stub runtime" : "no error"; }
#endif

/* A stand-in for libcuda.so.1 with the driver calls tiny's CUDA runtime makes, for testing the runtime's plumbing
 * (ctypes signatures, argument arrays, copies in pieces, peer copies, events, module errors, CUDA graphs) on a
 * machine without a GPU. Device memory is host memory. It cannot run GPU code, so it knows one "kernel" by name:
 * fake_add1(float* out, const float* in, int n) sets out[i] = in[i] + 1 for the i < n its grid covers.
 * Three GPUs: 0 is sm_90, 1 sm_80 and 2 sm_61 (to test the refusal of old GPUs). Error 218 is CUDA_ERROR_INVALID_PTX. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef struct { char name[128]; } fake_function;
typedef struct {
  fake_function* func;
  unsigned grid[3], block[3], shared;
  void** params;
  void** extra;
  void* kern;
  void* ctx;
} fake_node_params;
typedef struct { fake_node_params nodes[64]; int n; } fake_graph;

int fake_launches = 0;         /* kernels run, by launch or by graph */
int fake_graph_launches = 0;   /* cuGraphLaunch calls */
int fake_peer_copies = 0;
int fake_current_device = -1;  /* from cuCtxSetCurrent */
int fake_dynamic_allowed = 0;  /* the last cuFuncSetAttribute of MAX_DYNAMIC_SHARED_SIZE_BYTES */
int fake_launch_shared = -1;   /* the dynamic shared memory of the last kernel run, by launch or by graph */

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 3; return 0; }
CUresult cuDeviceGet(int* d, int i) { *d = i; return i < 3 ? 0 : 101; }
CUresult cuDeviceGetName(char* name, int len, int d) { strncpy(name, d == 2 ? "Fake P100" : d == 1 ? "Fake A100" : "Fake H100", len); return 0; }
CUresult cuDeviceGetAttribute(int* v, int attr, int d) {
  switch (attr) {
    case 1: *v = 1024; break;
    case 2: case 3: *v = 1024; break;
    case 4: *v = 64; break;
    case 8: *v = 49152; break;
    case 97: *v = d == 2 ? 49152 : d == 1 ? 166912 : 232448; break;
    case 75: *v = d == 2 ? 6 : d == 1 ? 8 : 9; break;
    case 76: *v = d == 2 ? 1 : 0; break;
    default: return 1;
  }
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, int d) { *bytes = (size_t)80 << 30; return 0; }
CUresult cuDeviceCanAccessPeer(int* can, int d, int peer) { *can = 1; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int d) { *ctx = (void*)(uintptr_t)(0x1000 + d); return 0; }
CUresult cuCtxSetCurrent(void* ctx) { fake_current_device = (int)((uintptr_t)ctx - 0x1000); return 0; }
CUresult cuCtxEnablePeerAccess(void* peer, unsigned flags) { return 0; }
CUresult cuStreamCreate(void** s, unsigned flags) { *s = (void*)0x2000; return 0; }
CUresult cuStreamSynchronize(void* s) { return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  if (n > ((size_t)1 << 40)) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *p = (CUdeviceptr)(uintptr_t)malloc(n);
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void*)(uintptr_t)p); return 0; }
CUresult cuMemHostAlloc(void** p, size_t n, unsigned flags) { *p = malloc(n); return 0; }
CUresult cuMemFreeHost(void* p) { free(p); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
  memcpy((void*)(uintptr_t)dst, src, n); return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
  memcpy(dst, (void*)(uintptr_t)src, n); return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  memcpy((void*)(uintptr_t)dst, (void*)(uintptr_t)src, n); return 0;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void* dctx, CUdeviceptr src, void* sctx, size_t n, void* s) {
  fake_peer_copies++;
  memcpy((void*)(uintptr_t)dst, (void*)(uintptr_t)src, n);
  return 0;
}
CUresult cuModuleLoadDataEx(void** mod, const void* image, unsigned n, int* opts, void** vals) {
  if (memcmp(image, "BAD", 3) == 0) {
    for (unsigned i = 0; i < n; i++)
      if (opts[i] == 5) strcpy((char*)vals[i], "ptxas fatal: fake error in the PTX");
    return 218;
  }
  *mod = (void*)0x3000;
  return 0;
}
CUresult cuModuleGetFunction(void** f, void* mod, const char* name) {
  fake_function* fn = calloc(1, sizeof(fake_function));
  strncpy(fn->name, name, 127);
  *f = fn;
  return 0;
}
CUresult cuModuleUnload(void* mod) { return 0; }
CUresult cuFuncSetAttribute(void* f, int attr, int v) {
  if (attr == 8) fake_dynamic_allowed = v;
  return 0;
}

static CUresult run(fake_function* f, const unsigned* grid, const unsigned* block, unsigned shared, void** params) {
  fake_launches++;
  fake_launch_shared = (int)shared;
  if (strcmp(f->name, "fake_add1") != 0) return 0;
  float* out = (float*)(uintptr_t)*(CUdeviceptr*)params[0];
  const float* in = (const float*)(uintptr_t)*(CUdeviceptr*)params[1];
  int n = *(int*)params[2];
  long threads = (long)grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2];
  for (long i = 0; i < threads && i < n; i++) out[i] = in[i] + 1.0f;
  return 0;
}

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* s, void** params, void** extra) {
  unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return run((fake_function*)f, grid, block, shared, params);
}
CUresult cuEventCreate(void** e, unsigned flags) { *e = malloc(1); return 0; }
CUresult cuEventRecord(void* e, void* s) { return 0; }
CUresult cuEventSynchronize(void* e) { return 0; }
CUresult cuEventElapsedTime_v2(float* ms, void* a, void* b) { *ms = 0.5f; return 0; }
CUresult cuEventDestroy_v2(void* e) { free(e); return 0; }
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == 218 ? "CUDA_ERROR_INVALID_PTX" : r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "fake error";
  return 0;
}
CUresult cuGraphCreate(void** g, unsigned flags) { *g = calloc(1, sizeof(fake_graph)); return 0; }
CUresult cuGraphAddKernelNode_v2(void** node, void* g, void** deps, size_t n, const fake_node_params* p) {
  fake_graph* graph = g;
  if (n != (graph->n ? 1u : 0u)) return 1; /* tiny chains its nodes: each depends on the one before */
  graph->nodes[graph->n] = *p;
  *node = (void*)(uintptr_t)(graph->n++ + 1);
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* g, unsigned long long flags) {
  fake_graph* copy = malloc(sizeof(fake_graph));
  memcpy(copy, g, sizeof(fake_graph));
  *exec = copy;
  return 0;
}
CUresult cuGraphExecKernelNodeSetParams_v2(void* exec, void* node, const fake_node_params* p) {
  ((fake_graph*)exec)->nodes[(uintptr_t)node - 1] = *p;
  return 0;
}
CUresult cuGraphLaunch(void* exec, void* s) {
  fake_graph* g = exec;
  fake_graph_launches++;
  for (int i = 0; i < g->n; i++) run(g->nodes[i].func, g->nodes[i].grid, g->nodes[i].block, g->nodes[i].shared, g->nodes[i].params);
  return 0;
}
CUresult cuGraphExecDestroy(void* exec) { free(exec); return 0; }
CUresult cuGraphDestroy(void* g) { free(g); return 0; }

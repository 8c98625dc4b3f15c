/*
 * Probe (bench/NOTES.md, session 40): does a kernel that reads and writes a peer process's
 * memory fault when that process dies? Two processes made by fork before CUDA starts, on one
 * GPU: the exporter shares 64 MiB (legacy IPC as fused/comm/peer_mem.c does, or a cuMem
 * allocation as a POSIX file descriptor), the importer maps it and runs a 2 s kernel on it,
 * and the exporter exits or is SIGKILLed 0.3 s in (busy: with a kernel of its own running on
 * its memory; busyw: on the importer's memory, mapped back). Prints RESULT ... ok or FAULT.
 *
 * build: nvcc -O2 -arch=sm_90a -o ipc_peer_death bench/probes/ipc_peer_death.cu -lcuda
 * usage: ipc_peer_death legacy|cumem exit|kill [busy|busyw]   (under scripts/mps.sh for MPS)
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#define BYTES (64ull << 20)
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2);} } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_) { const char* s_; cuGetErrorString(r_, &s_); printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(2);} } while (0)

__global__ void touch(volatile unsigned* p, size_t n, unsigned long long ns, unsigned long long* out) {
  unsigned long long t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long s = 0; size_t i = threadIdx.x;
  do {
    s += p[i]; p[i] = (unsigned)s; i = (i + 4099 * blockDim.x) % n;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  atomicAdd(out, s);
}

static void send_fd(int sock, int fd, const void* data, size_t len) {
  struct msghdr m = {0}; struct iovec io = {(void*)data, len}; m.msg_iov = &io; m.msg_iovlen = 1;
  char cbuf[CMSG_SPACE(sizeof(int))]; memset(cbuf, 0, sizeof cbuf);
  if (fd >= 0) { m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
    struct cmsghdr* c = CMSG_FIRSTHDR(&m); c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int)); memcpy(CMSG_DATA(c), &fd, sizeof(int)); }
  if (sendmsg(sock, &m, 0) < 0) { perror("sendmsg"); exit(2); }
}
static int recv_fd(int sock, void* data, size_t len) {
  struct msghdr m = {0}; struct iovec io = {data, len}; m.msg_iov = &io; m.msg_iovlen = 1;
  char cbuf[CMSG_SPACE(sizeof(int))]; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
  if (recvmsg(sock, &m, 0) < 0) { perror("recvmsg"); exit(2); }
  struct cmsghdr* c = CMSG_FIRSTHDR(&m); int fd = -1;
  if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

static void exporter(int sock, int cumem, int kill_self, int busy) {
  CK(cudaSetDevice(0)); CK(cudaFree(0));
  void* p; char buf[128] = {0};
  if (!cumem) {
    CK(cudaMalloc(&p, BYTES)); cudaIpcMemHandle_t h; CK(cudaIpcGetMemHandle(&h, p));
    memcpy(buf, &h, sizeof h); CK(cudaMemset(p, 1, BYTES)); CK(cudaDeviceSynchronize());
    send_fd(sock, -1, buf, sizeof buf);
  } else {
    CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h; CU(cuMemCreate(&h, BYTES, &prop, 0));
    CUdeviceptr va; CU(cuMemAddressReserve(&va, BYTES, 0, 0, 0)); CU(cuMemMap(va, BYTES, 0, h, 0));
    CUmemAccessDesc a = {}; a.location = prop.location; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, BYTES, &a, 1)); p = (void*)va;
    int fd = -1; CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CK(cudaMemset(p, 1, BYTES)); CK(cudaDeviceSynchronize());
    send_fd(sock, fd, buf, sizeof buf); close(fd);
  }
  char go[128]; recv_fd(sock, go, sizeof go); /* go; with busy == 2 the survivor's handle */
  if (busy == 2) {
    cudaIpcMemHandle_t ph; memcpy(&ph, go, sizeof ph);
    CK(cudaIpcOpenMemHandle(&p, ph, cudaIpcMemLazyEnablePeerAccess));
  }
  if (busy) { /* its own kernel in flight on its workspace when it dies, as a rank mid-call */
    unsigned long long* o; CK(cudaMalloc(&o, 8));
    touch<<<8, 256>>>((volatile unsigned*)p, BYTES / 4, 5000000000ull, o); CK(cudaGetLastError());
  }
  usleep(300000);
  printf("exporter %d: %s\n", getpid(), kill_self ? "SIGKILL" : "exit"); fflush(stdout);
  if (kill_self) raise(SIGKILL);
  _exit(0);
}

int main(int argc, char** argv) {
  int cumem = argc > 1 && !strcmp(argv[1], "cumem"), kill_self = argc > 2 && !strcmp(argv[2], "kill");
  int busy = argc > 3 ? (!strcmp(argv[3], "busy") ? 1 : !strcmp(argv[3], "busyw") ? 2 : 0) : 0;
  int sv[2]; socketpair(AF_UNIX, SOCK_DGRAM, 0, sv);
  pid_t pid = fork();
  if (pid == 0) { close(sv[0]); exporter(sv[1], cumem, kill_self, busy); }
  close(sv[1]);
  char buf[128]; int fd = recv_fd(sv[0], buf, sizeof buf);
  CK(cudaSetDevice(0)); CK(cudaFree(0));
  void* p;
  if (!cumem) { cudaIpcMemHandle_t h; memcpy(&h, buf, sizeof h); CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess)); }
  else {
    CUmemGenericAllocationHandle h;
    CU(cuMemImportFromShareableHandle(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr va; CU(cuMemAddressReserve(&va, BYTES, 0, 0, 0)); CU(cuMemMap(va, BYTES, 0, h, 0));
    CUmemAccessDesc a = {}; a.location.type = CU_MEM_LOCATION_TYPE_DEVICE; a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CU(cuMemSetAccess(va, BYTES, &a, 1));
    CU(cuMemRelease(h)); /* the mapping keeps it */
    p = (void*)va;
  }
  unsigned long long* out; CK(cudaMalloc(&out, 8)); CK(cudaMemset(out, 0, 8));
  touch<<<8, 256>>>((volatile unsigned*)p, BYTES / 4, 2000000000ull, out);
  CK(cudaGetLastError());
  char go[128] = {0};
  void* mine = NULL;
  if (busy == 2) { /* the dying process's kernel then writes into this one's memory */
    CK(cudaMalloc(&mine, BYTES)); cudaIpcMemHandle_t mh; CK(cudaIpcGetMemHandle(&mh, mine)); memcpy(go, &mh, sizeof mh);
  }
  send_fd(sv[0], -1, go, sizeof go);
  int st; waitpid(pid, &st, 0);
  printf("importer: exporter gone (%s), kernel still running\n", WIFSIGNALED(st) ? "signal" : "exit");
  cudaError_t e = cudaDeviceSynchronize();
  printf("importer: first kernel: %s\n", cudaGetErrorString(e));
  if (!e) {
    touch<<<8, 256>>>((volatile unsigned*)p, BYTES / 4, 200000000ull, out);
    e = cudaDeviceSynchronize();
    printf("importer: kernel after the exporter's death: %s\n", cudaGetErrorString(e));
  }
  printf("RESULT %s %s%s: %s\n", cumem ? "cumem" : "legacy", kill_self ? "kill" : "exit", busy == 2 ? " busyw" : busy ? " busy" : "", e ? "FAULT" : "ok");
  return 0;
}

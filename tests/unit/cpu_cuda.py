"""CUDA kernels run on the CPU for the transformation tests: every thread of a block a ``std::thread``,
``__syncthreads`` a real barrier (a thread that has returned is not waited for, as on Volta and
later), ``__syncwarp`` and warp shuffles (xor, down, up and indexed, within segments of ``width`` lanes) an exchange between the 32 threads of a warp (all of which must
reach it unless they have returned; a value read from a lane that has returned is all bits set), cooperative groups' block and
32-thread tiles with their ranks, sizes and ``reduce``.

``run_on_cpu(source, main, tmp_path, name)`` compiles the kernel with ``main`` (which launches it
through ``kl_launch(grid, block, body)`` and prints its outputs) with g++ and returns what it printed.
Blocks run one after another; a block's threads run at once, so a rewrite whose barriers or shuffles
are not reached by every thread deadlocks (the test's timeout says so) instead of passing by luck.
"""

from __future__ import annotations

import subprocess

CPU_CUDA = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct kl_dim3 { unsigned x, y, z; };
thread_local kl_dim3 threadIdx;
thread_local unsigned kl_flat;
kl_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* kl_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> kl_warps;
static double kl_lanes[1024];
static std::atomic<bool> kl_exited[1024];
static std::atomic<int> kl_vote{0};
static void __syncthreads() { kl_barrier->arrive_and_wait(); }
static void __syncwarp(unsigned = 0xffffffffu) { kl_warps[kl_flat / 32]->arrive_and_wait(); }
// A block-wide vote: whether any thread's v is `want` (or: want 1; and: want 0, answer negated).
static int kl_block_vote(int v, int want) {
  kl_barrier->arrive_and_wait();
  if ((v != 0) == (want != 0)) kl_vote.store(1);
  kl_barrier->arrive_and_wait();
  int r = kl_vote.load();
  kl_barrier->arrive_and_wait();
  if (threadIdx.x == 0 && threadIdx.y == 0) kl_vote.store(0);
  kl_barrier->arrive_and_wait();
  return r;
}
static int __syncthreads_or(int v) { return kl_block_vote(v, 1); }
static int __syncthreads_and(int v) { return !kl_block_vote(v, 0); }
// A warp's lanes exchange values through one slot each, between two barriers of the warp.
template <class T> static T kl_exchange(T v, unsigned from) {
  std::memcpy(&kl_lanes[kl_flat], &v, sizeof(T));
  kl_warps[kl_flat / 32]->arrive_and_wait();
  T r;
  const unsigned source = (kl_flat & ~31u) | (from & 31u);
  // A lane that has returned gives no value (undefined on the GPU): all bits set, a NaN or -1, so a result
  // that depends on it shows.
  if (kl_exited[source].load()) std::memset(&r, 0xff, sizeof(T));
  else std::memcpy(&r, &kl_lanes[source], sizeof(T));
  kl_warps[kl_flat / 32]->arrive_and_wait();
  return r;
}
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) { return kl_exchange(v, (kl_flat & 31u) ^ o); }
template <class T> static T __shfl_down_sync(unsigned, T v, int o) {
  unsigned lane = kl_flat & 31u;
  return kl_exchange(v, lane + o < 32u ? lane + o : lane);
}
template <class T> static T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  const unsigned lane = kl_flat & 31u, first = lane & ~(unsigned)(width - 1);
  return kl_exchange(v, lane - first >= d ? lane - d : lane);
}
// ``src`` is a lane of the caller's segment of ``width`` lanes.
template <class T> static T __shfl_sync(unsigned, T v, int src, int width = 32) {
  return kl_exchange(v, ((kl_flat & 31u) & ~(unsigned)(width - 1)) + ((unsigned)src & (unsigned)(width - 1)));
}
static float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static float atomicAdd(float* p, float v) {
  static std::atomic_flag lock = ATOMIC_FLAG_INIT;
  while (lock.test_and_set()) {}
  float old = *p; *p = old + v;
  lock.clear();
  return old;
}
using std::max;
using std::min;
// Cooperative groups: the block and its tiles of 32 (a tile is a warp), their ranks, sizes and reductions.
namespace cooperative_groups {
struct thread_block {
  unsigned long long thread_rank() const { return kl_flat; }
  unsigned long long size() const { return blockDim.x * blockDim.y * blockDim.z; }
  unsigned long long num_threads() const { return size(); }
  void sync() const { __syncthreads(); }
};
template <unsigned N> struct thread_block_tile {
  static_assert(N == 32, "the emulator's tiles are warps");
  unsigned long long thread_rank() const { return kl_flat % N; }
  unsigned long long size() const { return N; }
  unsigned long long num_threads() const { return N; }
  unsigned long long meta_group_rank() const { return kl_flat / N; }
  unsigned long long meta_group_size() const { return (blockDim.x * blockDim.y * blockDim.z + N - 1) / N; }
};
inline thread_block this_thread_block() { return {}; }
template <unsigned N, class G> thread_block_tile<N> tiled_partition(const G&) { return {}; }
template <class T> struct plus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct greater { T operator()(T a, T b) const { return b < a ? a : b; } };
template <class T> struct less { T operator()(T a, T b) const { return a < b ? a : b; } };
template <unsigned N, class T, class Op> T reduce(const thread_block_tile<N>&, T v, Op op) {
  for (unsigned o = N / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
inline void sync(const thread_block&) { __syncthreads(); }
}  // namespace cooperative_groups
#define __global__
#define __device__
#define __forceinline__
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
template <class F> void kl_launch(kl_dim3 grid, kl_dim3 block, F body) {
  gridDim = grid; blockDim = block;
  unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; bz++) for (unsigned by = 0; by < grid.y; by++) for (unsigned bx = 0; bx < grid.x; bx++) {
    blockIdx = {bx, by, bz};
    std::barrier<> bar(threads);
    kl_barrier = &bar;
    kl_warps.clear();
    for (unsigned t = 0; t < threads; t++) kl_exited[t].store(false);
    for (unsigned w = 0; w * 32 < threads; w++) kl_warps.emplace_back(new std::barrier<>(std::min(32u, threads - w * 32)));
    std::vector<std::thread> workers;
    for (unsigned tz = 0; tz < block.z; tz++) for (unsigned ty = 0; ty < block.y; ty++) for (unsigned tx = 0; tx < block.x; tx++)
      // A thread that returns is no longer waited for at the block's barriers nor its warp's shuffles and
      // __syncwarp (Volta on: "all non-exited threads").
      workers.emplace_back([=] { threadIdx = {tx, ty, tz}; kl_flat = tx + (ty + tz * block.y) * block.x; body();
                                 kl_exited[kl_flat].store(true);
                                 kl_warps[kl_flat / 32]->arrive_and_drop(); kl_barrier->arrive_and_drop(); });
    for (auto& t : workers) t.join();
  }
}
"""


def run_on_cpu(source: str, main: str, tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.cpp"
    kept = "\n".join(line for line in source.replace('extern "C"', "").split("\n")
                     if not line.lstrip().startswith("#include <cooperative_groups"))
    path.write_text(CPU_CUDA + kept + main)
    exe = tmp_path / name
    build = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-o", str(exe), str(path)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout

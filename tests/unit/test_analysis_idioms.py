"""The access analysis on the idioms of real code: cooperative groups, helpers that store through
references and pointers, members of structs and of arrays of structs, ``typedef``/``using`` types,
conditions and the comparisons they prove, const-ness through pointer copies, templates."""

from __future__ import annotations

from kernel_lsp.core.analysis import analyze
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.source import preprocess


def facts_of(src: str, kernel: str = "k"):
    return analyze(preprocess(src))[kernel]


def accesses(facts) -> list[str]:
    return [f"{a.kind} {a.array}{'.' + a.field if a.field else ''}[{a.index}]" for a in facts.accesses]


GX = "bdim.x*bid.x + tid.x"

# --------------------------------------------------------------------------- cooperative groups

CG_REDUCE = """
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void k(const float* in, float* out, int n) {
  cg::thread_block cta = cg::this_thread_block();
  __shared__ float s[256];
  unsigned t = cta.thread_rank();
  s[t] = in[blockIdx.x * blockDim.x + t];
  cg::sync(cta);
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    cta.sync();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}
"""


def test_cooperative_groups_barriers_ranks_and_the_tree():
    f = facts_of(CG_REDUCE)
    assert f.syncs == 2 and [b.scope for b in f.barriers] == ["block", "block"]
    assert [b.text for b in f.barriers] == ["cg::sync(cta)", "cta.sync()"]
    # thread_rank() is the block's linear thread index; nothing is an unknown call.
    read = next(a for a in f.accesses if a.array == "in")
    assert read.index == Poly.sym("bdim.x") * Poly.sym("bid.x") + Poly.sym("tid.x") + Poly.sym("bdim.x") * Poly.sym("tid.y") \
        + Poly.sym("bdim.x") * Poly.sym("bdim.y") * Poly.sym("tid.z")
    assert not any(loop.calls_unknown for loop in f.loops)
    assert [(r.kind, r.target) for r in f.reductions] == [("shared_tree", "s")]
    assert f.implicit_indices == ("cta.thread_rank()",)


def test_cooperative_group_tiles_shuffles_and_reduce():
    f = facts_of("""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
__device__ float tile_sum(cg::thread_block_tile<32> g, float v) {
  for (int o = g.size() / 2; o > 0; o /= 2) v += g.shfl_down(v, o);
  return v;
}
__global__ void k(const float* in, float* out) {
  auto block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  float v = in[block.group_index().x * block.size() + block.thread_rank()];
  v = tile_sum(warp, v);
  float w = cg::reduce(warp, v, cg::plus<float>());
  warp.sync();
  if (warp.thread_rank() == 0) atomicAdd(out, w);
}
""")
    assert [b.scope for b in f.barriers] == ["warp"]
    assert f.shuffles == 2
    assert {(r.kind, r.op) for r in f.reductions} >= {("warp_shuffle", "+"), ("warp_shuffle", "shfl_down")}
    read = next(a for a in f.accesses if a.array == "in")
    assert "bid.x" in read.index.symbols and "tid.x" in read.index.symbols
    atomic = next(a for a in f.accesses if a.kind == "atomic")
    # The lane test is a thread-dependent condition on tid % 32.
    (cid, value), = atomic.guards
    assert value and f.conditions[cid].thread_dependent and f.conditions[cid].splits_warp


# --------------------------------------------------------------------------- helpers

def test_helper_storing_through_a_reference_parameter():
    f = facts_of("""
__device__ void accumulate(float& x, float v) { x += v; }
__device__ void store(float* p, float v) { *p = v; }
__global__ void k(const float* in, float* out, float* last, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) accumulate(out[i], in[i]);
  if (i == 0) store(&last[0], in[0]);
}
""")
    assert accesses(f) == [f"read in[{GX}]", f"update out[{GX}]", "read in[0]", "write last[0]"]
    assert set(f.written) == {"out", "last"} and f.read_only == ("in",)
    assert [a.via for a in f.accesses if a.array == "out"] == [("accumulate",)]


def test_an_atomic_in_a_helper_is_seen_once_with_its_target():
    f = facts_of("""
__device__ void bump(unsigned* h, int b) { atomicAdd(&h[b & 255], 1u); }
__global__ void k(const int* data, unsigned* hist, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) bump(hist, data[i]);
}
""")
    assert [a.kind for a in f.accesses] == ["read", "atomic"]
    assert [(r.kind, r.target) for r in f.reductions] == [("atomic_scatter", "hist")]


# --------------------------------------------------------------------------- structs

AOS = """
struct Body { float3 pos; float3 acc; float mass; };
__global__ void k(Body* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float ax = 0;
  for (int j = 0; j < n; j++) ax += p[j].mass * (p[j].pos.x - p[i].pos.x);
  p[i].acc.x = ax;
  Body* q = &p[i];
  q->acc.y = ax;
  Body& r = p[i];
  r.acc.z = ax;
}
"""


def test_members_of_an_array_of_structs_with_their_paths_and_offsets():
    f = facts_of(AOS)
    got = [(a.kind, a.field, a.field_offset_bytes, a.field_bytes) for a in f.accesses]
    assert got == [("read", "mass", 24, 4), ("read", "pos.x", 0, 4), ("read", "pos.x", 0, 4),
                   ("write", "acc.x", 12, 4), ("write", "acc.y", 16, 4), ("write", "acc.z", 20, 4)]
    # p is written (through a member, a pointer to the element and a reference): never made const.
    assert f.written == ("p",) and f.read_only == () and f.nonconst_copies == ("p",)


def test_a_member_of_a_vector_type_has_its_offset():
    f = facts_of("__global__ void k(float4* v, float* out) { int i = threadIdx.x; out[i] = v[i].z; }")
    read = f.accesses[0]
    assert (read.field, read.field_offset_bytes, read.field_bytes) == ("z", 8, 4)


# --------------------------------------------------------------------------- type aliases

def test_typedef_and_using_pointer_and_scalar_parameters():
    f = facts_of("""
typedef float* Data_ptr;
using real = float;
typedef const real* CPtr;
using index_t = int;
__global__ void k(Data_ptr out, CPtr in, index_t n) {
  index_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2;
}
""")
    assert f.params == (("out", "float", True), ("in", "float", True), ("n", "int", False))
    assert accesses(f) == [f"read in[{GX}]", f"write out[{GX}]"]
    assert f.accesses[0].elem_bytes == 4 and f.read_only == ("in",)


# --------------------------------------------------------------------------- conditions

def test_guards_and_the_comparisons_they_prove():
    f = facts_of("""
__global__ void k(const float* in, float* out, int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  if (r >= rows || c >= cols) return;
  out[c * rows + (rows - 1 - r)] = c > 0 ? in[r * cols + c - 1] : 0.0f;
}
""")
    write = next(a for a in f.accesses if a.kind == "write")
    read = next(a for a in f.accesses if a.kind == "read")
    assert [f.conditions[cid].kind for cid, _ in write.guards] == ["exit"]
    assert sorted(map(str, f.constraints(write))) == ["bdim.x*bid.x + tid.x < cols", "bdim.y*bid.y + tid.y < rows"]
    assert "bdim.x*bid.x + tid.x > 0" in map(str, f.constraints(read))
    # Any integer coefficient: the store runs backwards along threadIdx.y.
    assert write.index.coefficient("tid.y") == Poly.const(-1)
    gx = Poly.sym("bdim.x") * Poly.sym("bid.x") + Poly.sym("tid.x")
    assert any(c.upper_bound(gx) == Poly.sym("cols") for c in f.constraints(write))


def test_branch_kinds_thread_dependence_and_warp_splits():
    f = facts_of("""
__global__ void k(const int* in, int* out, int n) {
  int t = threadIdx.x;
  if (t < 64) out[t] = 1;
  if (t == 5) out[0] = 2;
  if (n > 3) out[1] = 3;
  while (t < n) { out[t] += in[t]; t += blockDim.x; }
  switch (in[t]) { default: out[2] = 0; }
}
""")
    kinds = [(c.kind, c.thread_dependent, c.splits_warp) for c in f.conditions]
    assert kinds == [("if", True, False), ("if", True, True), ("if", False, False), ("while", True, False),
                     ("switch", True, False)]


# --------------------------------------------------------------------------- const-ness

def test_parameters_copied_to_non_const_pointers_or_references():
    f = facts_of("""
__device__ float first(float* q) { return q[0]; }
__global__ void k(float* a, float* b, float* c, float* d, float* e, float* out, int base) {
  float* p = a + base;
  const float* ok = b + base;
  auto deduced = c + base;
  float* later;
  later = d;
  out[0] = p[0] + ok[0] + deduced[0] + later[0] + first(e);
}
""")
    assert f.nonconst_copies == ("a", "d", "e")
    assert set(f.read_only) == {"a", "b", "c", "d", "e"}


def test_accesses_through_volatile_data_however_it_is_reached():
    f = facts_of("""
__device__ void tail(volatile float* c, int t) { c[t] += c[t + 1]; }
__global__ void k(volatile float* g, float* h) {
  __shared__ float s[64];
  __shared__ volatile float v[4];
  float* q = s;
  volatile float* r = s + 1;
  tail(s, 0);
  ((volatile float*)h)[1] = 1;
  volatile float& ref = s[2];
  ref = 3; q[3] = 1; r[4] = 2; v[0] = 1; g[0] = 2; h[5] = 1; s[6] = 1;
}
""")
    seen = {(a.text, a.kind): a.volatile for a in f.accesses}
    assert seen == {("c[t]", "update"): True, ("c[t + 1]", "read"): True, ("((volatile float*)h)[1]", "write"): True,
                    ("s[2]", "write"): True, ("q[3]", "write"): False, ("r[4]", "write"): True, ("v[0]", "write"): True,
                    ("g[0]", "write"): True, ("h[5]", "write"): False, ("s[6]", "write"): False}
    # A volatile pointer reaches the array it was made from: its own accesses stay what they are.
    assert {a.array for a in f.accesses if a.volatile} == {"s", "h", "v", "g"}


# --------------------------------------------------------------------------- templates

def test_a_template_is_analysed_as_its_launch_instantiates_it():
    f = facts_of("""
template <typename T, int B>
__global__ void k(const T* in, T* out, int n) {
  int i = blockIdx.x * B + threadIdx.x;
  if (i < n) out[i] = in[i];
}
void run(const double* a, double* b, int n) { k<double, 128><<<(n + 127) / 128, 128>>>(a, b, n); }
""")
    assert accesses(f) == ["read in[128*bid.x + tid.x]", "write out[128*bid.x + tid.x]"]
    assert f.accesses[0].elem_bytes == 8 and f.value_types == ("double", "int")


SPECIALIZED = """
template <typename Dtype> __device__ Dtype atomic_add(const Dtype val, Dtype* address);
template <> __device__ float atomic_add(const float val, float* address) { return atomicAdd(address, val); }
template <> __device__ double atomic_add(const double val, double* address) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(address);
  unsigned long long old = *p, assumed;
  do {
    assumed = old;
    old = atomicCAS(p, assumed, __double_as_longlong(val + __longlong_as_double(assumed)));
  } while (assumed != old);
  return __longlong_as_double(old);
}
template <typename Dtype>
__global__ void k(const Dtype* in, const Dtype* idx, Dtype* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomic_add(in[i], out + (int)idx[i]);
}
"""


def test_a_call_reaches_the_explicit_specialization_its_argument_types_select():
    """Caffe's ``caffe_gpu_atomic_add``: the float instance calls the float specialization (an atomicAdd),
    the double one the CAS loop; whichever specialization the file defines last."""
    float_facts = facts_of(SPECIALIZED + "template __global__ void k<float>(const float*, const float*, float*, int);\n")
    assert [(a.kind, a.op, a.array, a.via) for a in float_facts.accesses if a.kind == "atomic"] == \
        [("atomic", "atomicAdd", "out", ("atomic_add",))]
    double_facts = facts_of(SPECIALIZED + "template __global__ void k<double>(const double*, const double*, double*, int);\n")
    assert {a.op for a in double_facts.accesses if a.kind == "atomic"} == {"atomicCAS"}
    # A literal's and a cast's types select too.
    overloaded = facts_of("""
__device__ void put(float* p, float v) { p[0] = v; }
__device__ void put(float* p, int v) { atomicAdd((int*)p, v); }
__global__ void k(float* out) { put(out + threadIdx.x, 1.0f); put(out, (int)2); }
""")
    assert [a.kind for a in overloaded.accesses] == ["write", "atomic"]
    # A primary template matches any type; a specialization only its own.
    primary = """
template <typename T> __device__ void put(T* p, T v) { p[0] = v; }
template <> __device__ void put(float* p, float v) { atomicAdd(p, v); }
template <typename T> __global__ void k(T* out) { put(out + threadIdx.x, (T)1); }
"""
    assert [a.kind for a in facts_of(primary + "template __global__ void k<float>(float*);\n").accesses] == ["atomic"]
    assert [a.kind for a in facts_of(primary + "template __global__ void k<double>(double*);\n").accesses] == ["write"]


def test_cuda_intrinsics_are_functions_of_their_arguments():
    f = facts_of("""
__global__ void k(const float* in, float* out, int n) {
  for (int i = 1; i <= n; i++) {
    int p = __powf(2, i) + __log2f(in[i]) + __int_as_float(i) + __uint_as_float(i);
    out[i] = p;
  }
}
""")
    assert not f.loops[0].calls_unknown


# --------------------------------------------------------------------------- members of a local struct, while counters

LOCAL_STRUCT = """
struct acc3 { float x, y, z; };
__global__ void k(const float* a, acc3* out, acc3* p, int n) {
  acc3 f = {0.0f, 0.0f, 0.0f};
  acc3* q = p + threadIdx.x;
  for (int j = 0; j < n; j++) {
    f.x += a[j];
    f . y += a[j] * a[j];
    q->z += a[j];
  }
  out[threadIdx.x] = f;
}
"""


def test_a_member_of_a_local_struct_a_loop_updates_is_an_accumulator():
    facts = facts_of(LOCAL_STRUCT)
    assert sorted((r.kind, r.target, r.op) for r in facts.reductions) == [("accumulator", "f.x", "+"),
                                                                          ("accumulator", "f.y", "+")]
    # A member through a pointer is memory: an update of `p`'s element, not a local.
    assert "update p.z[tid.x]" in accesses(facts)


def test_assigned_names_count_a_local_struct_as_assigned_through_its_members():
    from kernel_lsp.core.analysis import assigned_names, parse_text

    src, root = parse_text("void f() { s.x = 1; t.a.b += 2; u->v = 3; w[0].x = 4; ++y.z; }")
    assert assigned_names(root, src) == {"s", "t", "y"}


WHILE_COUNTERS = """
__global__ void k(const float* a, float* out, int n) {
  float s = 0.0f;
  int i = threadIdx.x;
  while (i < n) { s += a[i]; i += 32; }
  int j = threadIdx.x;
  while (j < n) { s += a[j]; j += 32; j += 1; }
  int m = threadIdx.x;
  while (m < n) { if (a[m] < 0.0f) continue; s += a[m]; m += 32; }
  out[threadIdx.x] = s;
}
"""


def test_a_while_counter_is_one_the_body_steps_once_with_no_continue_skipping_it():
    loops = facts_of(WHILE_COUNTERS).loops
    assert [(lp.var, str(lp.step) if lp.step is not None else None) for lp in loops] == [
        ("i", "32"), (None, None), (None, None)]


def test_a_pointer_cast_in_a_loop_is_not_a_call_of_unseen_code():
    """Parboil cutcp's ``float *p = ((float *) binZeroAddr) + …`` in a loop: what is written through the cast is
    still seen, so the loop calls nothing unseen; handing the pointer to an unknown function does."""
    source = """
__global__ void k(float* bins, float* out, int n) {
  for (int c = 0; c < 4; c++) {
    float* p = (float*) bins;
    out[c * 64 + threadIdx.x] = p[(blockIdx.x * 4 + c) * 32 + threadIdx.x];
  }
}
"""
    assert not analyze(preprocess(source))["k"].loops[0].calls_unknown
    handed = source.replace("    float* p = (float*) bins;\n", "    float* p = (float*) bins;\n    touch(p);\n")
    assert analyze(preprocess("void touch(float*);\n" + handed))["k"].loops[0].calls_unknown


def test_enumerators_are_constants_in_indices():
    """Parboil LBM indexes its cells through an enum of entries: ``src[X1 + NE * i]`` is 3 * i + 1."""
    source = """
typedef enum { X0 = 0, X1, X2, NE } ENTRIES;
enum Extra { BASE = 4 * NE, NEXT };
__global__ void k(const float* src, float* dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[X1 + NE * i] + src[NEXT + i];
}
"""
    facts = analyze(preprocess(source))["k"]
    gid = Poly.sym("bdim.x") * Poly.sym("bid.x") + Poly.sym("tid.x")
    reads = {a.text: a.index for a in facts.accesses if a.reads}
    assert reads["src[X1 + NE * i]"] == gid * Poly.const(3) + Poly.const(1)
    assert reads["src[NEXT + i]"] == gid + Poly.const(13)


def test_a_pointer_set_on_each_path_keeps_its_accesses():
    """Parboil tpacf picks its data pointer in an if/else: what is read and written through it stays recorded, on
    the array when both paths point into it, as escaped where they point into different ones."""
    same = """
__global__ void k(const float* x, float* out, int n, int sets) {
    float* q;
    if (blockIdx.x < sets) q = out; else q = out + n;
    q[threadIdx.x] = x[threadIdx.x];
}
"""
    facts = analyze(preprocess(same))["k"]
    assert "out" in facts.written and "out" not in facts.read_only
    assert any(a.text == "q[threadIdx.x]" and a.array == "out" and a.writes for a in facts.accesses)
    apart = same.replace("const float* x, float* out,", "const float* x, float* out, float* other,").replace(
        "q = out + n;", "q = other;")
    facts = analyze(preprocess(apart))["k"]
    assert {"out", "other"} <= set(facts.escaped) and not {"out", "other"} & set(facts.read_only)


def test_a_vector_cast_is_the_same_arrays_wide_element():
    """``reinterpret_cast<float4*>(&x[i])[0]`` (How_to_optimize_in_GPU's FETCH_FLOAT4, SGEMM's tile loads):
    a load or store of the array itself, one float4 wide. The array is read-only when only read so; a cast to
    a non-const pointer keeps ``const`` off it, and only a pointer that goes further (a call the analysis
    does not see) escapes."""
    f = facts_of("""
#define FETCH_FLOAT4(p) (reinterpret_cast<float4*>(&(p))[0])
__device__ void opaque(float4* p);
__global__ void k(float* a, const float* b, float* c, float* d) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  float4 va = FETCH_FLOAT4(a[i]);
  float4 vb = reinterpret_cast<const float4*>(b)[i / 4];
  FETCH_FLOAT4(c[i]) = make_float4(va.x + vb.x, va.y + vb.y, va.z + vb.z, va.w + vb.w);
  opaque(reinterpret_cast<float4*>(d));
}""")
    assert accesses(f) == ["read a[bdim.x*bid.x + tid.x]", "read b[bdim.x*bid.x + tid.x]",
                           "write c[bdim.x*bid.x + tid.x]"]
    assert {a.elem_bytes for a in f.accesses} == {16}
    assert set(f.read_only) == {"a", "b"} and set(f.escaped) == {"d"}
    assert set(f.nonconst_copies) == {"a", "c", "d"}

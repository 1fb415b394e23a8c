// The row machinery every rownorm op is written on: teams, row views and tier kernels.
//
// An op is a functor with `static constexpr int kIn` (number of row-shaped inputs) and a
// `template <class Row> __device__ void operator()(Row& row) const` body written only in
// terms of
//   V    row.Reduce(op, f)   f(const Acc* x, int64_t col) -> V, reduced over the whole row
//                            and returned to every thread of the team;
//   void row.Store(f)        out[col] = f(x, col) for every element of the row;
//   void row.Store2(f)       the same into the second output (two-output ops);
//   row.Size(), row.Index()  the row length and the row's number;
//   row.Leader()             true in exactly one thread of the team (per-row side outputs);
//   Row::kCached             whether another Reduce is free (row in registers) or re-reads it.
// and, for statistics that need one all-reduce where Reduce would need two (softmax's max and
// Σ exp), on rows with kOneRound (PrefersOneRound):
//   V    row.ReduceLocal(op, f)  the same reduction over this thread's elements only;
//   V    row.AllReduce(v, op)    v combined over the team (Reduce = AllReduce ∘ ReduceLocal).
// (x[i] is input i at column col, in the accumulator type.) The same body then runs in
// every tier, which only differ in where the row lives and who shares it:
//
//   GroupRowKernel     kWidth (4..32) lanes per row, several rows per CTA; row in registers.
//   CtaRowKernel       one CTA per row; row in registers, warp shuffles + one smem round.
//   ClusterRowKernel   a cluster of kCluster CTAs per row (sm_90+); each CTA keeps its slice
//                      in registers, partials exchanged through distributed shared memory, so
//                      a 256 KB fp32 row is read from HBM exactly once.
//   StreamingRowKernel one CTA per row, nothing cached: every Reduce/Store re-reads the row
//                      (from L2 when it fits). Any length, any arch, any vector width.
//   ColumnKernel       reduction over a non-last dim of a contiguous (outer, D, inner) tensor:
//                      lanes walk the contiguous inner dim (coalesced), kTy threads split D.
//
// Row layout: operand i's row r starts at in[i] + r * in_stride[i] and is unit-stride. Rows
// are read with Pack<T, kVec> accesses: the first `head` (< kVec) elements, up to the first
// kVec-aligned address, and the last `tail` (< kVec) elements are scalar; the dispatcher
// guarantees all operands share that alignment in every row (same address mod 16 bytes).
// All offsets are int64.
#pragma once

#include <cooperative_groups.h>

#include <utility>

#include "kernels/common/args.h"
#include "kernels/common/pack.cuh"
#include "kernels/common/reduce.cuh"

namespace rownorm {

#if defined(__CUDACC__)

// ---------------------------------------------------------------------------------------
// Teams: the threads that share one row, and how they all-reduce.

template <int kWidth>
struct GroupTeam {  // kWidth consecutive lanes of a warp
  static constexpr int kThreads = kWidth;
  static constexpr int kSlices = 1;
  int rank;
  ROWNORM_DEVICE int ThreadRank() const { return rank; }
  ROWNORM_DEVICE int SliceRank() const { return 0; }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return WarpAllReduce<kWidth>(v, op);
  }
};

template <int kCtaThreads>
struct CtaTeam {  // a whole 1-D CTA
  static constexpr int kThreads = kCtaThreads;
  static constexpr int kSlices = 1;
  BlockReduceStorage<kCtaThreads>& storage;
  int parity = 0;
  ROWNORM_DEVICE int ThreadRank() const { return threadIdx.x; }
  ROWNORM_DEVICE int SliceRank() const { return 0; }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return BlockAllReduce<kCtaThreads>(v, op, storage, parity);
  }
};

template <int kCtaThreads, int kCluster>
struct ClusterTeam {  // kCluster CTAs of a cluster; CTA rank c owns slice c of the row
  static constexpr int kThreads = kCtaThreads;
  static constexpr int kSlices = kCluster;
  ClusterReduceStorage<kCtaThreads>& storage;
  int block_parity = 0;
  int cluster_parity = 0;
  ROWNORM_DEVICE int ThreadRank() const { return threadIdx.x; }
  ROWNORM_DEVICE int SliceRank() const { return blockIdx.x % kCluster; }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return ClusterAllReduce<kCtaThreads, kCluster>(v, op, storage, block_parity, cluster_parity);
  }
};

// ---------------------------------------------------------------------------------------
// Row geometry: scalar head, kVec-wide body, scalar tail.

template <typename T, int kVec>
struct RowGeometry {
  int64_t head;  // scalar elements before the first kVec-aligned one (< kVec)
  int64_t vecs;  // full packs
  int64_t tail;  // scalar elements after the last pack (< kVec)

  ROWNORM_DEVICE RowGeometry(const T* row, int64_t n) {
    const int64_t misalign = (reinterpret_cast<uintptr_t>(row) / sizeof(T)) % kVec;
    head = misalign == 0 ? 0 : kVec - misalign;
    if (head > n) head = n;
    vecs = (n - head) / kVec;
    tail = n - head - vecs * kVec;
  }
};

// Which packs and scalars of a row one thread of a team owns: packs
// [slice_begin, slice_end) of the team's slice, strided by the team size; the head
// scalars go to the first threads of slice 0, the tail scalars to the last threads of the
// last slice (each thread owns at most one of each since kVec <= team size).
template <class Team, int kVec>
struct Ownership {
  int64_t first_vec;  // this thread's first pack; its k-th is first_vec + k * kThreads
  int64_t vec_end;
  int64_t head_col;  // column of the owned head scalar, or -1
  int64_t tail_col;  // column of the owned tail scalar, or -1

  template <typename T>
  ROWNORM_DEVICE Ownership(const Team& team, const RowGeometry<T, kVec>& g, bool valid) {
    static_assert(kVec <= Team::kThreads, "each thread owns at most one head/tail scalar");
    const int tid = team.ThreadRank();
    const int slice = team.SliceRank();
    const int64_t chunk = (g.vecs + Team::kSlices - 1) / Team::kSlices;
    const int64_t begin = valid ? min(g.vecs, slice * chunk) : 0;
    vec_end = valid ? min(g.vecs, begin + chunk) : 0;
    first_vec = begin + tid;
    head_col = (valid && slice == 0 && tid < g.head) ? tid : -1;
    const int tail_first = Team::kThreads - static_cast<int>(g.tail);
    tail_col = (valid && slice == Team::kSlices - 1 && tid >= tail_first)
                   ? g.head + g.vecs * kVec + (tid - tail_first)
                   : -1;
  }
};

// ---------------------------------------------------------------------------------------
// Row views.

template <typename F, typename Acc>
using ReduceValue = decltype(std::declval<F>()(std::declval<const Acc*>(), int64_t{}));

// What every row view of the row tiers shares: the team, the row's geometry, this thread's
// share of it, the outputs, and the row's identity (Index(), and Leader(): the one thread of
// the team that writes per-row results such as saved statistics).
template <typename T, int kIn, int kVec, class Team>
class RowBase {
 public:
  using Acc = AccType<T>;

  ROWNORM_DEVICE int64_t Size() const { return n_; }
  ROWNORM_DEVICE int64_t Index() const { return row_; }
  ROWNORM_DEVICE bool Leader() const {
    return valid_ && team_.ThreadRank() == 0 && team_.SliceRank() == 0;
  }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return team_.AllReduce(v, op);
  }

 protected:
  ROWNORM_DEVICE RowBase(Team& team, const RowArgs<T, kIn>& args, int64_t row, bool valid)
      : team_(team),
        geo_(args.in[0] + (valid ? row : 0) * args.in_stride[0], args.n),
        own_(team, geo_, valid),
        out_(args.out + (valid ? row : 0) * args.out_stride),
        out2_(args.out2 + (valid ? row : 0) * args.out2_stride),
        n_(args.n),
        row_(row),
        valid_(valid) {}

  ROWNORM_DEVICE static const T* In(const RowArgs<T, kIn>& args, int i, int64_t row, bool valid) {
    return args.in[i] + (valid ? row : 0) * args.in_stride[i];
  }

  Team& team_;
  RowGeometry<T, kVec> geo_;
  Ownership<Team, kVec> own_;
  T* out_;
  T* out2_;
  int64_t n_;
  int64_t row_;
  bool valid_;
};

// Per-thread column accumulators of the fused parameter-gradient path: kK sums for each of the
// thread's kVecs x kVec columns, carried across the rows a CTA processes (the columns a thread
// owns are the same in every row when rows start 16-byte aligned, which that path requires).
template <typename Acc, int kK, int kVecs, int kVec>
struct ColumnSums {
  Acc v[kK][kVecs][kVec];
};

// The row cached in registers as packs of the storage type (converted on use, which keeps
// 16-bit rows at half the registers). Capacity: kVecs packs per thread per slice.
template <typename T, int kIn, int kVec, int kVecs, class Team>
class CachedRow : public RowBase<T, kIn, kVec, Team> {
  using Base = RowBase<T, kIn, kVec, Team>;
  using Base::geo_;
  using Base::own_;

 public:
  using Acc = AccType<T>;
  static constexpr bool kCached = true;                 // another Reduce costs no memory traffic
  static constexpr bool kOneRound = Team::kSlices > 1;  // an all-reduce is a cluster barrier

  ROWNORM_DEVICE CachedRow(Team& team, const RowArgs<T, kIn>& args, int64_t row, bool valid)
      : Base(team, args, row, valid) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) {
      const T* p = Base::In(args, i, row, valid);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = own_.first_vec + k * Team::kThreads;
        if (v < own_.vec_end) packs_[i][k].Load(p + geo_.head + v * kVec);
      }
      if (own_.head_col >= 0) head_[i] = p[own_.head_col];
      if (own_.tail_col >= 0) tail_[i] = p[own_.tail_col];
    }
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> Reduce(Op op, F f) {
    return this->AllReduce(ReduceLocal(op, f), op);
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    V acc = Op::template Identity<V>();
    Acc x[kIn];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = packs_[i][k].Get(e);
          acc = op(acc, f(x, geo_.head + v * kVec + e));
        }
      }
    }
    if (own_.head_col >= 0) acc = op(acc, f(Scalars(head_, x), own_.head_col));
    if (own_.tail_col >= 0) acc = op(acc, f(Scalars(tail_, x), own_.tail_col));
    return acc;
  }

  // out[col] = f(x, col) for every element of the row; Store2 writes the second output.
  template <typename F>
  ROWNORM_DEVICE void Store(F f) {
    StoreTo(this->out_, f);
  }

  // out[col] = f(x, col, p), p[j] = ps.p[j][col] (see StoreWith in reduce.cuh): the parameters
  // of a pack's columns are read with vector loads where they are aligned like the row.
  template <typename F, typename W, int K>
  ROWNORM_DEVICE void StoreWith(F f, const ParamList<W, K>& ps) {
    constexpr int kWVec = kVec * sizeof(W) > 16 ? 16 / static_cast<int>(sizeof(W)) : kVec;
    bool aligned = true;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      aligned =
          aligned && (ps.p[j] == nullptr ||
                      reinterpret_cast<uintptr_t>(ps.p[j] + geo_.head) % (kWVec * sizeof(W)) == 0);
    }
    if (!aligned) {
      StoreWithScalars(f, ps);
      return;
    }
    Acc x[kIn];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) {
        const int64_t col0 = geo_.head + v * kVec;
        Acc pv[K][kVec];
#pragma unroll
        for (int j = 0; j < K; ++j) {
          if (ps.p[j] != nullptr) {
#pragma unroll
            for (int h = 0; h < kVec / kWVec; ++h) {
              Pack<W, kWVec> q;
              q.Load(ps.p[j] + col0 + h * kWVec);
#pragma unroll
              for (int e = 0; e < kWVec; ++e) pv[j][h * kWVec + e] = q.Get(e);
            }
          } else {
#pragma unroll
            for (int e = 0; e < kVec; ++e) pv[j][e] = static_cast<Acc>(ps.absent[j]);
          }
        }
        Pack<T, kVec> o;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = packs_[i][k].Get(e);
          Acc p[K];
#pragma unroll
          for (int j = 0; j < K; ++j) p[j] = pv[j][e];
          o.Set(e, f(x, col0 + e, p));
        }
        o.Store(this->out_ + col0);
      }
    }
    StoreScalarsWith(f, ps);
  }
  template <typename F>
  ROWNORM_DEVICE void Store2(F f) {
    StoreTo(this->out2_, f);
  }

  // sums[k][col] += f(x, col)[k] over this row when the kernel accumulates column sums
  // (CtaRowSumsKernel); a no-op otherwise. The path requires head == tail == 0.
  template <typename F, int kK>
  ROWNORM_DEVICE void AddColumns(F f, ColumnSums<Acc, kK, kVecs, kVec>* sums) {
    if (sums == nullptr) return;
    Acc x[kIn];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = packs_[i][k].Get(e);
          const Array<Acc, kK> a = f(x, v * kVec + e);
#pragma unroll
          for (int j = 0; j < kK; ++j) sums->v[j][k][e] += a[j];
        }
      }
    }
  }

 private:
  template <typename F>
  ROWNORM_DEVICE void StoreTo(T* out, F f) {
    Acc x[kIn];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) {
        Pack<T, kVec> o;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = packs_[i][k].Get(e);
          o.Set(e, f(x, geo_.head + v * kVec + e));
        }
        o.Store(out + geo_.head + v * kVec);
      }
    }
    if (own_.head_col >= 0) out[own_.head_col] = FromAcc<T>(f(Scalars(head_, x), own_.head_col));
    if (own_.tail_col >= 0) out[own_.tail_col] = FromAcc<T>(f(Scalars(tail_, x), own_.tail_col));
  }

  template <typename F, typename W, int K>
  ROWNORM_DEVICE void StoreWithScalars(F f, const ParamList<W, K>& ps) {
    StoreTo(this->out_, [f, ps](const Acc* x, int64_t col) {
      Acc p[K];
#pragma unroll
      for (int j = 0; j < K; ++j) p[j] = Param(ps.p[j], col, static_cast<Acc>(ps.absent[j]));
      return f(x, col, p);
    });
  }

  // The head and tail scalars of StoreWith.
  template <typename F, typename W, int K>
  ROWNORM_DEVICE void StoreScalarsWith(F f, const ParamList<W, K>& ps) {
    Acc x[kIn];
    Acc p[K];
    if (own_.head_col >= 0) {
#pragma unroll
      for (int j = 0; j < K; ++j) {
        p[j] = Param(ps.p[j], own_.head_col, static_cast<Acc>(ps.absent[j]));
      }
      this->out_[own_.head_col] = FromAcc<T>(f(Scalars(head_, x), own_.head_col, p));
    }
    if (own_.tail_col >= 0) {
#pragma unroll
      for (int j = 0; j < K; ++j) {
        p[j] = Param(ps.p[j], own_.tail_col, static_cast<Acc>(ps.absent[j]));
      }
      this->out_[own_.tail_col] = FromAcc<T>(f(Scalars(tail_, x), own_.tail_col, p));
    }
  }

  ROWNORM_DEVICE static const Acc* Scalars(const T (&s)[kIn], Acc (&x)[kIn]) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) x[i] = ToAcc(s[i]);
    return x;
  }

  Pack<T, kVec> packs_[kIn][kVecs];
  T head_[kIn];
  T tail_[kIn];
};

// The row left in global memory: every Reduce and Store streams it again. Used where no
// cached tier fits (very long rows before sm_90, misaligned operands, float64).
template <typename T, int kIn, int kVec, class Team>
class StreamingRow : public RowBase<T, kIn, kVec, Team> {
  using Base = RowBase<T, kIn, kVec, Team>;
  using Base::geo_;
  using Base::own_;

 public:
  using Acc = AccType<T>;
  static constexpr bool kCached = false;  // every Reduce reads the row again

  ROWNORM_DEVICE StreamingRow(Team& team, const RowArgs<T, kIn>& args, int64_t row, bool valid)
      : Base(team, args, row, valid) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) in_[i] = Base::In(args, i, row, valid);
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> Reduce(Op op, F f) {
    return this->AllReduce(ReduceLocal(op, f), op);
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    V acc = Op::template Identity<V>();
    Acc x[kIn];
#pragma unroll 2
    for (int64_t v = own_.first_vec; v < own_.vec_end; v += Team::kThreads) {
      Pack<T, kVec> p[kIn];
#pragma unroll
      for (int i = 0; i < kIn; ++i) p[i].Load(in_[i] + geo_.head + v * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        acc = op(acc, f(x, geo_.head + v * kVec + e));
      }
    }
    if (own_.head_col >= 0) acc = op(acc, f(Scalars(own_.head_col, x), own_.head_col));
    if (own_.tail_col >= 0) acc = op(acc, f(Scalars(own_.tail_col, x), own_.tail_col));
    return acc;
  }

  template <typename F>
  ROWNORM_DEVICE void Store(F f) {
    StoreTo(this->out_, f);
  }
  template <typename F>
  ROWNORM_DEVICE void Store2(F f) {
    StoreTo(this->out2_, f);
  }

 private:
  template <typename F>
  ROWNORM_DEVICE void StoreTo(T* out, F f) {
    Acc x[kIn];
#pragma unroll 2
    for (int64_t v = own_.first_vec; v < own_.vec_end; v += Team::kThreads) {
      Pack<T, kVec> p[kIn];
#pragma unroll
      for (int i = 0; i < kIn; ++i) p[i].Load(in_[i] + geo_.head + v * kVec);
      Pack<T, kVec> o;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        o.Set(e, f(x, geo_.head + v * kVec + e));
      }
      o.Store(out + geo_.head + v * kVec);
    }
    if (own_.head_col >= 0) {
      out[own_.head_col] = FromAcc<T>(f(Scalars(own_.head_col, x), own_.head_col));
    }
    if (own_.tail_col >= 0) {
      out[own_.tail_col] = FromAcc<T>(f(Scalars(own_.tail_col, x), own_.tail_col));
    }
  }

  ROWNORM_DEVICE const Acc* Scalars(int64_t col, Acc (&x)[kIn]) const {
#pragma unroll
    for (int i = 0; i < kIn; ++i) x[i] = ToAcc(in_[i][col]);
    return x;
  }

  const T* in_[kIn];
};

// One "row" of a ColumnArgs problem: fixed (outer o, inner i), running over d. Thread
// (tx, ty) of a kTx x kTy CTA owns column i = tile + tx and rows d = ty, ty + kTy, ...;
// with kCache > 0 it keeps those (at most kCache) values in registers, otherwise it streams.
template <int kTx, int kTy>
struct ColumnReduceStorage {
  alignas(16) unsigned char bytes[2][kTy][kTx][kReduceSlotBytes];
};

template <typename T, int kIn, int kTx, int kTy, int kCache>
class ColumnRow {
 public:
  using Acc = AccType<T>;
  static constexpr bool kCached = kCache > 0;

  // `parity` selects the storage buffer; it lives in the kernel so that it carries over from
  // one row to the next (the double-buffering argument of BlockAllReduce).
  ROWNORM_DEVICE ColumnRow(ColumnReduceStorage<kTx, kTy>& storage, int& parity,
                           const ColumnArgs<T, kIn>& a, int64_t o, int64_t i)
      : storage_(storage),
        parity_(parity),
        d_(a.d),
        inner_(a.inner),
        index_(o * a.inner + i),
        valid_(i < a.inner) {
    const int64_t base = o * a.d * a.inner + (valid_ ? i : 0);
#pragma unroll
    for (int k = 0; k < kIn; ++k) in_[k] = a.in[k] + base;
    out_ = a.out + base;
    out2_ = a.out2 + base;
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t d = threadIdx.y + c * kTy;
        if (valid_ && d < d_) {
#pragma unroll
          for (int k = 0; k < kIn; ++k) cache_[k][c] = in_[k][d * inner_];
        }
      }
    }
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> Reduce(Op op, F f) {
    return AllReduce(ReduceLocal(op, f), op);
  }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    V acc = Op::template Identity<V>();
    ForEach([&](const Acc* x, int64_t d) { acc = op(acc, f(x, d)); });
    return acc;
  }

  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V acc, Op op) {
    static_assert(sizeof(V) <= kReduceSlotBytes, "reduction value must fit a slot");
    *reinterpret_cast<V*>(storage_.bytes[parity_][threadIdx.y][threadIdx.x]) = acc;
    __syncthreads();
    acc = *reinterpret_cast<const V*>(storage_.bytes[parity_][0][threadIdx.x]);
#pragma unroll
    for (int y = 1; y < kTy; ++y) {
      acc = op(acc, *reinterpret_cast<const V*>(storage_.bytes[parity_][y][threadIdx.x]));
    }
    parity_ ^= 1;
    return acc;
  }

  template <typename F>
  ROWNORM_DEVICE void Store(F f) {
    ForEach([&](const Acc* x, int64_t d) { out_[d * inner_] = FromAcc<T>(f(x, d)); });
  }
  template <typename F>
  ROWNORM_DEVICE void Store2(F f) {
    ForEach([&](const Acc* x, int64_t d) { out2_[d * inner_] = FromAcc<T>(f(x, d)); });
  }

  // The row's number among the outer * inner rows, and whether this thread writes its
  // per-row results (each column is one thread's; ty == 0 holds it).
  ROWNORM_DEVICE int64_t Size() const { return d_; }
  ROWNORM_DEVICE int64_t Index() const { return index_; }
  ROWNORM_DEVICE bool Leader() const { return valid_ && threadIdx.y == 0; }

 private:
  template <typename G>
  ROWNORM_DEVICE void ForEach(G g) const {
    if (!valid_) return;
    Acc x[kIn];
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t d = threadIdx.y + c * kTy;
        if (d < d_) {
#pragma unroll
          for (int k = 0; k < kIn; ++k) x[k] = ToAcc(cache_[k][c]);
          g(x, d);
        }
      }
    } else {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < d_; d += kTy) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) x[k] = ToAcc(in_[k][d * inner_]);
        g(x, d);
      }
    }
  }

  ColumnReduceStorage<kTx, kTy>& storage_;
  int& parity_;
  int64_t d_;
  int64_t inner_;
  int64_t index_;
  bool valid_;
  const T* in_[kIn];
  T* out_;
  T* out2_;
  T cache_[kIn][kCache > 0 ? kCache : 1];
};

// The vectorized column path: thread (tx, ty) owns kLanes adjacent columns i..i+kLanes-1 and
// rows d = ty, ty + kTy, ... (at most kCache of them), read and written as Pack<T, kLanes>
// (the host checks that inner is a multiple of kLanes and every operand is aligned to a
// pack). A ColumnTile holds those packs; ColumnLane<Tile, J> is the row interface of its
// lane J (column i + J), and ColumnPackKernel runs the op body once per lane, J a constant
// so that the lane's element of every pack is a register. The outputs are gathered in packs
// and written once all lanes have run.
template <typename T, int kIn, int kTx, int kTy, int kCache, int kLanes>
struct ColumnTile {
  using Acc = AccType<T>;
  using P = Pack<T, kLanes>;
  static constexpr int kTyRows = kTy;
  static constexpr int kCacheRows = kCache;
  static constexpr int kInputs = kIn;

  ROWNORM_DEVICE ColumnTile(ColumnReduceStorage<kTx, kTy>& s, int& par, const ColumnArgs<T, kIn>& a,
                            int64_t o, int64_t i)
      : storage(s),
        parity(par),
        d(a.d),
        inner(a.inner),
        index(o * a.inner + i),
        valid(i < a.inner) {
    const int64_t base = o * a.d * a.inner + (valid ? i : 0);
#pragma unroll
    for (int k = 0; k < kIn; ++k) in[k] = a.in[k] + base;
    out = a.out + base;
    out2 = a.out2 + base;
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t r = threadIdx.y + c * kTy;
      if (valid && r < d) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) cache[k][c].Load(in[k] + r * inner);
      }
    }
  }

  // Writes the gathered outputs (the second one only where the op stored it).
  ROWNORM_DEVICE void Flush() const {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t r = threadIdx.y + c * kTy;
      if (valid && r < d) {
        o1[c].Store(out + r * inner);
        if (stored2) o2[c].Store(out2 + r * inner);
      }
    }
  }

  ColumnReduceStorage<kTx, kTy>& storage;
  int& parity;
  int64_t d;
  int64_t inner;
  int64_t index;  // row number of lane 0
  bool valid;
  bool stored2 = false;
  const T* in[kIn];
  T* out;
  T* out2;
  P cache[kIn][kCache];
  P o1[kCache];
  P o2[kCache];
};

template <class Tile, int J>
class ColumnLane {
 public:
  using Acc = typename Tile::Acc;
  static constexpr bool kCached = true;

  ROWNORM_DEVICE explicit ColumnLane(Tile& t) : t_(t) {}

  ROWNORM_DEVICE int64_t Size() const { return t_.d; }
  ROWNORM_DEVICE int64_t Index() const { return t_.index + J; }
  ROWNORM_DEVICE bool Leader() const { return t_.valid && threadIdx.y == 0; }

  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> Reduce(Op op, F f) {
    return AllReduce(ReduceLocal(op, f), op);
  }
  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    V acc = Op::template Identity<V>();
    ForEach([&](const Acc* x, int64_t r, int) { acc = op(acc, f(x, r)); });
    return acc;
  }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V acc, Op op) {
    static_assert(sizeof(V) <= kReduceSlotBytes, "reduction value must fit a slot");
    auto& slots = t_.storage.bytes[t_.parity];
    *reinterpret_cast<V*>(slots[threadIdx.y][threadIdx.x]) = acc;
    __syncthreads();
    acc = *reinterpret_cast<const V*>(slots[0][threadIdx.x]);
#pragma unroll
    for (int y = 1; y < kTy; ++y) acc = op(acc, *reinterpret_cast<const V*>(slots[y][threadIdx.x]));
    t_.parity ^= 1;
    return acc;
  }

  template <typename F>
  ROWNORM_DEVICE void Store(F f) {
    ForEach([&](const Acc* x, int64_t r, int c) { t_.o1[c].Set(J, f(x, r)); });
  }
  template <typename F>
  ROWNORM_DEVICE void Store2(F f) {
    ForEach([&](const Acc* x, int64_t r, int c) { t_.o2[c].Set(J, f(x, r)); });
    t_.stored2 = true;
  }

 private:
  static constexpr int kTy = Tile::kTyRows;
  static constexpr int kCache = Tile::kCacheRows;
  static constexpr int kIn = Tile::kInputs;

  template <typename G>
  ROWNORM_DEVICE void ForEach(G g) const {
    if (!t_.valid) return;
    Acc x[kIn];
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t r = threadIdx.y + c * kTy;
      if (r < t_.d) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) x[k] = t_.cache[k][c].Get(J);
        g(x, r, c);
      }
    }
  }

  Tile& t_;
};

// ---------------------------------------------------------------------------------------
// Tier kernels. Every row loop is uniform across the threads that reduce together (the warp
// for groups, the CTA, the cluster), as the barriers and full-mask shuffles require.

template <class Op, typename T, int kVec, int kVecs, int kWidth, int kCtaThreads>
__global__ void __launch_bounds__(kCtaThreads)
    GroupRowKernel(const RowArgs<T, Op::kIn> args, const Op op) {
  static_assert(kCtaThreads % kWarpSize == 0 && kWarpSize % kWidth == 0, "bad group shape");
  constexpr int kRowsPerCta = kCtaThreads / kWidth;
  GroupTeam<kWidth> team{static_cast<int>(threadIdx.x % kWidth)};
  const int group = threadIdx.x / kWidth;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerCta; base < args.rows;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerCta) {
    const int64_t row = base + group;
    CachedRow<T, Op::kIn, kVec, kVecs, GroupTeam<kWidth>> r(team, args, row, row < args.rows);
    op(r);
  }
}

template <class Op, typename T, int kVec, int kVecs, int kThreads>
__global__ void __launch_bounds__(kThreads)
    CtaRowKernel(const RowArgs<T, Op::kIn> args, const Op op) {
  __shared__ BlockReduceStorage<kThreads> storage;
  CtaTeam<kThreads> team{storage};
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    CachedRow<T, Op::kIn, kVec, kVecs, CtaTeam<kThreads>> r(team, args, row, true);
    op(r);
  }
}

// Fused parameter gradients: the CTA and group tiers with column sums. A "chunk" is the
// fixed set of rows one team (a CTA, or a group of lanes) runs in order, accumulating
// Op::kColumnSums column sums in registers (the op body's AddColumns); it then writes them as
// its chunk's partials, partial[(j·chunks + chunk)·n + col]. Rows start 16-byte aligned and n
// is a multiple of kVec (checked on the host), so a thread owns the same columns in every row,
// and the chunks do not depend on the number of rows: neither do the results.
template <typename Acc, int kK, int kVecs, int kVec>
ROWNORM_DEVICE void ZeroSums(ColumnSums<Acc, kK, kVecs, kVec>& sums) {
#pragma unroll
  for (int j = 0; j < kK; ++j) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) sums.v[j][k][e] = Acc(0);
    }
  }
}

// Thread `rank` of a team of kThreads writes its columns' sums as chunk `chunk`'s partials.
template <typename Acc, int kK, int kVecs, int kVec, int kThreads>
ROWNORM_DEVICE void WriteSums(const ColumnSums<Acc, kK, kVecs, kVec>& sums, int rank, int64_t chunk,
                              int64_t chunks, int64_t n, Acc* partial) {
  const int64_t vecs = n / kVec;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t v = rank + k * kThreads;
    if (v < vecs) {
#pragma unroll
      for (int j = 0; j < kK; ++j) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          partial[(j * chunks + chunk) * n + v * kVec + e] = sums.v[j][k][e];
        }
      }
    }
  }
}

// CTA tier: CTA c runs rows [c·kRows, (c+1)·kRows); chunks = ceil(rows / kRows).
template <class Op, typename T, int kVec, int kVecs, int kThreads, int kRows>
__global__ void __launch_bounds__(kThreads)
    CtaRowSumsKernel(const RowArgs<T, Op::kIn> args, const Op op, AccType<T>* partial) {
  using Acc = AccType<T>;
  __shared__ BlockReduceStorage<kThreads> storage;
  CtaTeam<kThreads> team{storage};
  ColumnSums<Acc, Op::kColumnSums, kVecs, kVec> sums;
  ZeroSums(sums);
  const int64_t chunks = (args.rows + kRows - 1) / kRows;
  const int64_t c = blockIdx.x;
  const int64_t end = min(args.rows, (c + 1) * kRows);
  for (int64_t row = c * kRows; row < end; ++row) {
    CachedRow<T, Op::kIn, kVec, kVecs, CtaTeam<kThreads>> r(team, args, row, true);
    op(r, &sums);
  }
  WriteSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>(sums, threadIdx.x, c, chunks, args.n,
                                                         partial);
}

// Group tier: CTA b holds G = kCtaThreads / kWidth groups; group g runs rows
// b·kRows·G + g + k·G (k < kRows; neighbouring groups read neighbouring rows) as chunk
// b·G + g, so chunks = ceil(rows / (kRows·G))·G. Every group runs kRows iterations (rows past
// the end as invalid rows) so that the warp's shuffles stay uniform.
template <class Op, typename T, int kVec, int kVecs, int kWidth, int kCtaThreads, int kRows>
__global__ void __launch_bounds__(kCtaThreads)
    GroupRowSumsKernel(const RowArgs<T, Op::kIn> args, const Op op, AccType<T>* partial) {
  using Acc = AccType<T>;
  constexpr int kGroups = kCtaThreads / kWidth;
  GroupTeam<kWidth> team{static_cast<int>(threadIdx.x % kWidth)};
  const int group = threadIdx.x / kWidth;
  ColumnSums<Acc, Op::kColumnSums, kVecs, kVec> sums;
  ZeroSums(sums);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kRows * kGroups + group;
  for (int k = 0; k < kRows; ++k) {
    const int64_t row = base + static_cast<int64_t>(k) * kGroups;
    CachedRow<T, Op::kIn, kVec, kVecs, GroupTeam<kWidth>> r(team, args, row, row < args.rows);
    op(r, &sums);
  }
  const int64_t chunks =
      (args.rows + int64_t{kRows} * kGroups - 1) / (int64_t{kRows} * kGroups) * kGroups;
  WriteSums<Acc, Op::kColumnSums, kVecs, kVec, kWidth>(
      sums, team.rank, static_cast<int64_t>(blockIdx.x) * kGroups + group, chunks, args.n, partial);
}

template <class Op, typename T, int kVec, int kVecs, int kThreads, int kCluster>
__global__ void __launch_bounds__(kThreads)
    ClusterRowKernel(const RowArgs<T, Op::kIn> args, const Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ ClusterReduceStorage<kThreads> storage;
  ClusterTeam<kThreads, kCluster> team{storage};
  const int64_t clusters = gridDim.x / kCluster;
  for (int64_t row = blockIdx.x / kCluster; row < args.rows; row += clusters) {
    CachedRow<T, Op::kIn, kVec, kVecs, ClusterTeam<kThreads, kCluster>> r(team, args, row, true);
    op(r);
  }
  cooperative_groups::this_cluster().sync();  // keep our shared memory alive for the peers
#else
  __trap();
#endif
}

template <class Op, typename T, int kVec, int kThreads>
__global__ void __launch_bounds__(kThreads)
    StreamingRowKernel(const RowArgs<T, Op::kIn> args, const Op op) {
  __shared__ BlockReduceStorage<kThreads> storage;
  CtaTeam<kThreads> team{storage};
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    StreamingRow<T, Op::kIn, kVec, CtaTeam<kThreads>> r(team, args, row, true);
    op(r);
  }
}

template <class Op, typename T, int kTx, int kTy, int kCache>
__global__ void __launch_bounds__(kTx* kTy)
    ColumnKernel(const ColumnArgs<T, Op::kIn> args, const Op op) {
  __shared__ ColumnReduceStorage<kTx, kTy> storage;
  int parity = 0;
  const int64_t tiles = (args.inner + kTx - 1) / kTx;
  for (int64_t t = blockIdx.x; t < args.outer * tiles; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t i = (t % tiles) * kTx + threadIdx.x;
    ColumnRow<T, Op::kIn, kTx, kTy, kCache> r(storage, parity, args, o, i);
    op(r);
  }
}

template <class Op, class Tile, int... J>
ROWNORM_DEVICE void RunLanes(const Op& op, Tile& tile, std::integer_sequence<int, J...>) {
  (
      [&] {
        ColumnLane<Tile, J> lane(tile);
        op(lane);
      }(),
      ...);
}

template <class Op, typename T, int kTx, int kTy, int kCache, int kLanes>
__global__ void __launch_bounds__(kTx* kTy)
    ColumnPackKernel(const ColumnArgs<T, Op::kIn> args, const Op op) {
  __shared__ ColumnReduceStorage<kTx, kTy> storage;
  int parity = 0;
  constexpr int64_t kTileCols = int64_t{kTx} * kLanes;
  const int64_t tiles = (args.inner + kTileCols - 1) / kTileCols;
  for (int64_t t = blockIdx.x; t < args.outer * tiles; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t i = (t % tiles) * kTileCols + int64_t{threadIdx.x} * kLanes;
    ColumnTile<T, Op::kIn, kTx, kTy, kCache, kLanes> tile(storage, parity, args, o, i);
    RunLanes(op, tile, std::make_integer_sequence<int, kLanes>{});
    tile.Flush();
  }
}

#endif  // __CUDACC__

}  // namespace rownorm

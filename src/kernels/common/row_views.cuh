// Row views of the row tiers: the threads that share a row (teams), the row's geometry, and the
// two views op bodies run on, CachedRow (the row in registers) and StreamingRow (the row left in
// global memory).
//
// Row layout: input i's row r starts at in[i] + r * in_stride[i] and is unit-stride (outputs
// likewise). Rows are moved with Pack<·, kVec> accesses: the first `head` (< kVec) elements, up
// to the first kVec-aligned address, and the last `tail` (< kVec) elements are scalar; the
// dispatcher guarantees that every operand has that alignment in every row (the same element
// phase mod kVec). All offsets are int64.
//
// Both views derive the row interface (row_ops.h) through PackedRow from two primitives:
//   ForEachPack(g)           g(k, packs, col0) for each full pack this thread owns: packs[i] is
//                            input i at columns [col0, col0 + kVec), k the pack's slot among
//                            this thread's (the same columns in every row when head == 0);
//   LoadScalar<kTail>(c, x)  x[i] = input i at the head (kTail = false) or tail scalar column c.
// Outputs are written a Pack<TOut, kVec> at a time through Pack::Store (see pack.cuh for why
// that store is spelled out), head and tail scalars one element at a time.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/args.h"
#include "kernels/common/operands.cuh"
#include "kernels/common/pack.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/row_ops.h"

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

// kCluster CTAs of a cluster; CTA rank c owns slice c of the row. Made by every thread of
// every CTA at the kernel's start; Finish() before the kernel ends. kSlotBytes: the reducer's
// slot size (reduce.cuh).
template <int kCtaThreads, int kCluster, int kSlotBytes = kReduceSlotBytes>
struct ClusterTeam {
  static constexpr int kThreads = kCtaThreads;
  static constexpr int kSlices = kCluster;
  using Storage = ClusterReduceStorage<kCtaThreads, kCluster, kSlotBytes>;
  ClusterReducer<kCtaThreads, kCluster, kSlotBytes> reducer;
  ROWNORM_DEVICE explicit ClusterTeam(Storage& storage) : reducer(storage) {}
  ROWNORM_DEVICE int ThreadRank() const { return threadIdx.x; }
  ROWNORM_DEVICE int SliceRank() const { return blockIdx.x % kCluster; }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return reducer.AllReduce(v, op);
  }
  // AllReduce's two levels apart: over this CTA's slice, then the slices' values merged
  // (ClusterReducer::Merge).
  template <typename Op, typename V>
  ROWNORM_DEVICE V SliceAllReduce(V v, Op op) {
    return reducer.BlockReduce(v, op);
  }
  template <typename V, class Combine>
  ROWNORM_DEVICE auto MergeSlices(const V& v, Combine combine) {
    return reducer.Merge(v, combine);
  }
  ROWNORM_DEVICE void Finish() { reducer.Finish(); }
};

// ---------------------------------------------------------------------------------------
// Row geometry: scalar head, kVec-wide body, scalar tail.

template <typename T, int kVec>
struct RowGeometry {
  int64_t head;  // scalar elements before the first kVec-aligned one (< kVec)
  int64_t vecs;  // full packs
  int64_t tail;  // scalar elements after the last pack (< kVec)

  // kAligned: the caller knows that the row starts kVec-aligned and that n is a multiple of kVec
  // (the fused parameter-gradient kernels' rows), so no scalar head or tail: that is known at
  // compile time, and the per-row address arithmetic and the scalar branches go away.
  template <bool kAligned>
  ROWNORM_DEVICE static RowGeometry Of(const T* row, int64_t n) {
    if constexpr (kAligned) {
      return RowGeometry{0, n / kVec, 0};
    } else {
      const int64_t misalign = (reinterpret_cast<uintptr_t>(row) / sizeof(T)) % kVec;
      int64_t head = misalign == 0 ? 0 : kVec - misalign;
      if (head > n) head = n;
      const int64_t vecs = (n - head) / kVec;
      return RowGeometry{head, vecs, n - head - vecs * kVec};
    }
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
  int64_t head_col;  // column of the owned head scalar, or -1 (tested as head_col >= 0)
  int64_t tail_col;  // column of the owned tail scalar, or -1

  // The first pack of slice `slice` of a row of `vecs` packs (the slices are contiguous).
  ROWNORM_DEVICE static int64_t SliceBegin(int64_t vecs, int slice) {
    return min(vecs, slice * ((vecs + Team::kSlices - 1) / Team::kSlices));
  }

  template <typename T>
  ROWNORM_DEVICE Ownership(const Team& team, const RowGeometry<T, kVec>& g, bool valid) {
    static_assert(kVec <= Team::kThreads, "each thread owns at most one head/tail scalar");
    const int tid = team.ThreadRank();
    const int slice = team.SliceRank();
    const int64_t begin = valid ? SliceBegin(g.vecs, slice) : 0;
    vec_end = valid ? SliceBegin(g.vecs, slice + 1) : 0;
    first_vec = begin + tid;
    head_col = (valid && slice == 0 && tid < g.head) ? tid : -1;
    const int tail_first = Team::kThreads - static_cast<int>(g.tail);
    tail_col = (valid && slice == Team::kSlices - 1 && tid >= tail_first)
                   ? g.head + g.vecs * kVec + (tid - tail_first)
                   : -1;
  }
};

// The per-thread shared-memory layouts below (ParamCache, ParamSlices, SharedColumnSums) hold,
// for each of a thread's packs of kVec columns, kVec values of type E in 16-byte pieces:
// thread t's piece h of its pack k at [·][k][h][t], so that a warp's accesses are contiguous.
template <typename E, int kVec>
struct ThreadPieces {
  static constexpr int kPiece =
      kVec * static_cast<int>(sizeof(E)) > 16 ? 16 / static_cast<int>(sizeof(E)) : kVec;
  static constexpr int kPieces = kVec / kPiece;
  struct alignas(kPiece * sizeof(E)) Piece {
    E v[kPiece];
  };
};

// A parameter read a pack at a time (ParamCache::Fill, PackedRow::ParamPack): kParamVec
// elements of W (at most 16 bytes) a vector load, where its packs' columns, `head` in, start
// aligned to those loads.
template <typename W, int kVec>
constexpr int kParamVec = ThreadPieces<W, kVec>::kPiece;
template <typename W, int kVec>
ROWNORM_DEVICE bool ParamPacksAligned(const W* p, int64_t head) {
  return reinterpret_cast<uintptr_t>(p + head) % (kParamVec<W, kVec> * sizeof(W)) == 0;
}
// v[e] = parameter j of `ps` at col0 + e as Acc, its offset applied (ParamList::Of), by vector
// loads (kUnaligned: by 4-byte loads, LoadPackUnaligned). kOrAbsent: where ps.p[j] is null,
// its absent value instead (else the caller checks): the pack is preset to that value's stored
// bits (1 and 0, a weight's and a bias's, are exact in every storage type) and loaded over
// where the parameter is given, so that one conversion an element serves both, where a
// default moved in and a predicated conversion took two (h200/NOTES.md §44).
template <typename Acc, int kVec, bool kUnaligned = false, bool kOrAbsent = false, class PS>
ROWNORM_DEVICE void LoadParamPack(const PS& ps, int j, int64_t col0, Acc (&v)[kVec]) {
  using W = typename PS::Elem;
  constexpr int kWVec = kParamVec<W, kVec>;
  const W* const p = ps.p[j];
#pragma unroll
  for (int h = 0; h < kVec / kWVec; ++h) {
    Pack<W, kWVec> q;
    if constexpr (kOrAbsent) q.Fill(static_cast<AccType<W>>(ps.absent[j]));
    if (!kOrAbsent || p != nullptr) {
      if constexpr (kUnaligned) {
        q = LoadPackUnaligned<W, kWVec>(p + col0 + h * kWVec);
      } else {
        q.Load(p + col0 + h * kWVec);
      }
    }
#pragma unroll
    for (int e = 0; e < kWVec; ++e) v[h * kWVec + e] = ps.template Of<Acc>(q.Get(e));
  }
}

// Per-thread column accumulators of the fused parameter-gradient path: kK sums for each of the
// thread's kVecs x kVec columns, carried across the rows a team processes (the columns a thread
// owns are the same in every row when rows start 16-byte aligned, which that path requires).
template <typename Acc, int kK, int kVecs, int kVec>
struct ColumnSums {
  static constexpr int kCount = kK;
  Acc v[kK][kVecs][kVec];

  // sum j of the thread's pack k += a[j] (CachedRow::AddColumns).
  ROWNORM_DEVICE void Add(int k, int, const Acc (&a)[kK][kVec]) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[j][k][e] += a[j][e];
    }
  }
};

// The same accumulators in shared memory, for the kernels whose threads own more columns than
// registers hold next to the row (SliceRowSumsKernel: 64 columns a thread at 16-bit, 128
// sums for layer_norm). Each thread reads and writes only its own values, so no barrier:
// thread t's sums of its pack k at [j][k][h][t], in 16-byte pieces h (a warp's accesses
// contiguous). Valid for rows of one geometry, the CTA's slice [begin, end) of packs.
template <typename Acc, int kK, int kVecs, int kVec, int kThreads>
struct SharedColumnSums {
  static constexpr int kCount = kK;
  static constexpr int kPiece = ThreadPieces<Acc, kVec>::kPiece;
  static constexpr int kPieces = ThreadPieces<Acc, kVec>::kPieces;
  using Piece = typename ThreadPieces<Acc, kVec>::Piece;
  Piece pieces[kK][kVecs][kPieces][kThreads];

  ROWNORM_DEVICE void Zero(int rank) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          Piece q;
#pragma unroll
          for (int e = 0; e < kPiece; ++e) q.v[e] = Acc(0);
          pieces[j][k][h][rank] = q;
        }
      }
    }
  }

  ROWNORM_DEVICE void Add(int k, int rank, const Acc (&a)[kK][kVec]) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
#pragma unroll
      for (int h = 0; h < kPieces; ++h) {
        Piece q = pieces[j][k][h][rank];
#pragma unroll
        for (int e = 0; e < kPiece; ++e) q.v[e] += a[j][h * kPiece + e];
        pieces[j][k][h][rank] = q;
      }
    }
  }

  // Writes thread `rank`'s sums of its packs begin + rank + k * kThreads (< end), whose
  // columns start `head` in, as chunk `chunk`'s partials, partial[(j·chunks + chunk)·n + col],
  // and zeroes them: with kAligned (whole rows: head 0, n a multiple of kVec) 16 bytes at a
  // time, else (rows in phase) an element at a time, whatever the class's head: chunk·n puts
  // a partial's row anywhere. (Chosen by the head alone, the 16-byte stores of the head-0 class
  // were misaligned; the compiler had merged both branches into scalar stores, until another
  // build merged them into the 16-byte ones: benchmarks/results/h200/NOTES.md §43.)
  template <bool kAligned>
  ROWNORM_DEVICE void WriteAndZero(int rank, int64_t begin, int64_t end, int64_t chunk,
                                   int64_t chunks, int64_t n, Acc* partial, int64_t head = 0) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = begin + rank + int64_t{k} * kThreads;
      if (v >= end) continue;
#pragma unroll
      for (int j = 0; j < kK; ++j) {
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          Piece q = pieces[j][k][h][rank];
          Acc* to = partial + (j * chunks + chunk) * n + head + v * kVec + h * kPiece;
          if constexpr (kAligned) {
            *reinterpret_cast<Piece*>(to) = q;
          } else {
#pragma unroll
            for (int e = 0; e < kPiece; ++e) to[e] = q.v[e];
          }
#pragma unroll
          for (int e = 0; e < kPiece; ++e) q.v[e] = Acc(0);
          pieces[j][k][h][rank] = q;
        }
      }
    }
  }
};

// ColumnSums for the slice sums of aligned rows (SliceRowSumsKernel where plan.h's
// SliceSumsInRegisters holds): SharedColumnSums' Zero and WriteAndZero, the sums in registers.
// The same additions in the same order, so the same partials.
template <typename Acc, int kK, int kVecs, int kVec, int kThreads>
struct RegisterColumnSums : ColumnSums<Acc, kK, kVecs, kVec> {
  using Piece = typename ThreadPieces<Acc, kVec>::Piece;
  static constexpr int kPiece = ThreadPieces<Acc, kVec>::kPiece;
  static constexpr int kPieces = ThreadPieces<Acc, kVec>::kPieces;

  ROWNORM_DEVICE void Zero(int) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) this->v[j][k][e] = Acc(0);
      }
    }
  }

  template <bool kAligned>
  ROWNORM_DEVICE void WriteAndZero(int rank, int64_t begin, int64_t end, int64_t chunk,
                                   int64_t chunks, int64_t n, Acc* partial) {
    static_assert(kAligned, "whole rows: 16-byte stores");
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t c = begin + rank + int64_t{k} * kThreads;
      if (c >= end) continue;
#pragma unroll
      for (int j = 0; j < kK; ++j) {
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          Piece q;
#pragma unroll
          for (int e = 0; e < kPiece; ++e) q.v[e] = this->v[j][k][h * kPiece + e];
          *reinterpret_cast<Piece*>(partial + (j * chunks + chunk) * n + c * kVec + h * kPiece) = q;
        }
      }
    }
    Zero(rank);
  }
};

// The per-column parameters of a fused kernel's rows (an op's ColumnParams(), a ParamList),
// read from global memory once per CTA (Fill) into shared memory in the accumulator type with
// their offset applied, so that a row's ReduceWith and StoreWith read a pack's parameters with
// one or two 16-byte shared loads and no conversions, where per row they took scalar loads, a
// conversion and the offset per element (with the aligned rows of RowGeometry::Of, the fused
// backward went from ~48 to ~28 instructions per element: benchmarks/results/h100/NOTES.md §25).
// Team thread t's values for its pack k at [j][k][h][t], in 16-byte pieces h (a warp's
// loads contiguous). Valid for rows whose thread t owns packs t + k * kThreads, of the
// geometry it was filled for (Fill's head: aligned rows, or one class of rows in phase).
struct NoParamCache {};

template <class PS, typename Acc, int kVecs, int kVec, int kThreads>
struct ParamCache {
  using List = PS;
  static constexpr int K = PS::kCount;
  static constexpr int kPiece = ThreadPieces<Acc, kVec>::kPiece;
  static constexpr int kPieces = ThreadPieces<Acc, kVec>::kPieces;
  using Piece = typename ThreadPieces<Acc, kVec>::Piece;
  Piece pieces[K][kVecs][kPieces][kThreads];

  // Thread `rank` of the team writes the values of its columns (0 past n), its packs those of
  // rows whose packs start `head` columns in (rows in phase; 0: aligned rows). A parameter
  // whose packs' columns start aligned to vector loads of at most 16 bytes is read so, a pack
  // below n at a time; else an element at a time (2-byte loads of a 16-bit weight took 8x the
  // L2 sectors: ncu, h200/NOTES.md §40).
  ROWNORM_DEVICE void Fill(const PS& ps, int rank, int64_t n, int64_t head = 0) {
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const auto* const p = ps.p[j];
      const bool packed = p != nullptr && ParamPacksAligned<typename PS::Elem, kVec>(p, head);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t col0 = head + (rank + int64_t{k} * kThreads) * kVec;
        Acc v[kVec];
        if (packed && col0 + kVec <= n) {
          LoadParamPack<Acc, kVec>(ps, j, col0, v);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            v[e] = col0 + e < n ? ps.template At<Acc>(j, col0 + e) : Acc(0);
          }
        }
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          Piece q;
#pragma unroll
          for (int e = 0; e < kPiece; ++e) q.v[e] = v[h * kPiece + e];
          pieces[j][k][h][rank] = q;
        }
      }
    }
  }

  ROWNORM_DEVICE void Get(const PS&, int k, int rank, Acc (&pv)[K][kVec]) const {
#pragma unroll
    for (int j = 0; j < K; ++j) {
#pragma unroll
      for (int h = 0; h < kPieces; ++h) {
        const Piece q = pieces[j][k][h][rank];
#pragma unroll
        for (int e = 0; e < kPiece; ++e) pv[j][h * kPiece + e] = q.v[e];
      }
    }
  }
};

// The per-column parameters (an op's ColumnParams()) of the columns one thread of a persistent
// cluster kernel owns in every row (ClusterParamRowKernel), as stored (W: a 16-bit weight
// slice of a 256 x 8-pack CTA is 32 KB, half of ParamCache's float32), copied once per CTA by
// each thread for its own packs and read back by that thread only (no barrier). Read per row
// from global memory, a 16-bit weight is as many bytes from L2 as x itself: rms_norm's
// forward ran at 84% of copy on the H200 with its weight, 95% without
// (benchmarks/results/h100/NOTES.md §27). Thread t's pack k of parameter j at [j][k][h][t],
// in 16-byte pieces h. Valid for rows of the geometry it was filled for (Fill's head) and
// of the CTA's slice [begin, end) of packs.
template <class PS, typename Acc, int kVecs, int kVec, int kThreads>
struct ParamSlices {
  using List = PS;
  using W = typename PS::Elem;
  static constexpr int K = PS::kCount;
  static constexpr int kPiece = ThreadPieces<W, kVec>::kPiece;
  static constexpr int kPieces = ThreadPieces<W, kVec>::kPieces;
  Pack<W, kPiece> pieces[K][kVecs][kPieces][kThreads];

  // Thread `rank` copies its packs begin + rank + k * kThreads (< end) of every given
  // parameter, an element at a time: once per CTA (or per class of rows that do not start
  // aligned, whose packs start `head` columns in), and a parameter need not be aligned.
  ROWNORM_DEVICE void Fill(const PS& ps, int rank, int64_t begin, int64_t end, int64_t head = 0) {
    ForEachOwnedPiece(ps, rank, begin, end, head, [&](int j, int k, int h, const W* src) {
      Pack<W, kPiece> q;
#pragma unroll
      for (int e = 0; e < kPiece; ++e) q.Set(e, ToAcc(src[e]));
      pieces[j][k][h][rank] = q;
    });
  }

  // f(j, k, h, src) for piece h of thread `rank`'s pack k (begin + rank + k * kThreads < end) of
  // every given parameter j, src its first element (packs `head` columns in).
  template <class F>
  ROWNORM_DEVICE static void ForEachOwnedPiece(const PS& ps, int rank, int64_t begin, int64_t end,
                                               int64_t head, F f) {
#pragma unroll
    for (int j = 0; j < K; ++j) {
      if (ps.p[j] == nullptr) continue;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = begin + rank + int64_t{k} * kThreads;
        if (v >= end) continue;
#pragma unroll
        for (int h = 0; h < kPieces; ++h) f(j, k, h, ps.p[j] + head + v * kVec + h * kPiece);
      }
    }
  }

  ROWNORM_DEVICE void Get(const PS& ps, int k, int rank, Acc (&pv)[K][kVec]) const {
#pragma unroll
    for (int j = 0; j < K; ++j) {
      if (ps.p[j] != nullptr) {
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          const Pack<W, kPiece> q = pieces[j][k][h][rank];
#pragma unroll
          for (int e = 0; e < kPiece; ++e) {
            pv[j][h * kPiece + e] = ps.template Of<Acc>(static_cast<Acc>(q.Get(e)));
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) pv[j][e] = ps.template Absent<Acc>(j);
      }
    }
  }
};

// ParamSlices refilled for every row by the cluster tier's register rows (ClusterRows given a
// Slices that StagesPerRow): the thread's copies are issued (IssueAsync) right after the row's
// loads, as cp.async through L1 (the SM's next CTAs of the same slice rank read the same columns),
// so that they arrive while the row is reduced, and waited for before the row's stores read them.
// Read per row from global memory between one pack's store and the next, the parameters waited a
// round trip from L2 per pack: 28% of the stall samples of rms_norm's register rows, bf16 131072,
// where without a weight they ran as fast as l2_normalize's and with one 1.06-1.18x the time
// (benchmarks/results/h200/NOTES.md §36).
template <class PS, typename Acc, int kVecs, int kVec, int kThreads>
struct StagedParamSlices : ParamSlices<PS, Acc, kVecs, kVec, kThreads> {
  using Base = ParamSlices<PS, Acc, kVecs, kVec, kThreads>;
  using W = typename Base::W;
  static constexpr bool kStagesPerRow = true;

  // Thread `rank`'s packs begin + rank + k * kThreads (< end) of every given parameter of
  // aligned rows: 16-byte asynchronous copies where every given parameter is 16-byte aligned,
  // else Fill's element loads.
  ROWNORM_DEVICE void IssueAsync(const PS& ps, int rank, int64_t begin, int64_t end) {
    static_assert(sizeof(Pack<W, Base::kPiece>) == 16, "the copies move 16-byte pieces");
    bool aligned = true;
#pragma unroll
    for (int j = 0; j < Base::K; ++j) {
      aligned = aligned && (ps.p[j] == nullptr || reinterpret_cast<uintptr_t>(ps.p[j]) % 16 == 0);
    }
    if (!aligned) {
      Base::Fill(ps, rank, begin, end);
      return;
    }
    Base::ForEachOwnedPiece(ps, rank, begin, end, 0, [&](int j, int k, int h, const W* src) {
      CopyPackAsync</*kCacheL1=*/true>(&this->pieces[j][k][h][rank], src);
    });
    CommitAsyncCopies();
  }

  ROWNORM_DEVICE void Get(const PS& ps, int k, int rank, Acc (&pv)[Base::K][kVec]) const {
    WaitAsyncCopies<0>();  // this thread's copies of the row (a no-op once they are in)
    Base::Get(ps, k, rank, pv);
  }
};

// Whether a kernel's copy of the parameters, Slices, is refilled per row (StagedParamSlices)
// rather than kept for every row (ParamSlices).
template <class Slices, class = void>
struct StagesPerRow : std::false_type {};
template <class Slices>
struct StagesPerRow<Slices, std::void_t<decltype(Slices::kStagesPerRow)>>
    : std::bool_constant<Slices::kStagesPerRow> {};

// A row's packs staged in shared memory by a prefetching kernel (CtaRowSumsStagedKernel, through
// CachedRow::Prefetch): thread t's pack k of input i at [k][i][t] (a warp's 16-byte accesses
// contiguous). The launcher sizes the kernel's shared memory from it.
template <class Args, int kVec, int kVecs, int kThreads>
struct RowStage {
  Pack<typename Args::InElem, kVec> packs[kVecs][Args::kNumIn][kThreads];
};

// ---------------------------------------------------------------------------------------
// Row views.

// What both views share: the team, the row's geometry, this thread's share of it, the outputs,
// the row's identity (Index(), and Leader(): the one thread of the team that writes per-row
// results such as saved statistics), and the row interface built on the two primitives.
template <class Derived, class Args, int kVec, class Team, bool kAligned>
class PackedRow : public RowOps<Derived, AccType<typename Args::InElem>> {
 public:
  using TIn = typename Args::InElem;
  using TOut = typename Args::OutElem;
  using Acc = AccType<TIn>;
  static constexpr int kIn = Args::kNumIn;
  static constexpr int kOut = Args::kNumOut;
  static constexpr int kSlices = Team::kSlices;         // CTAs that share a row (a cluster's)
  static constexpr int kSliceThreads = Team::kThreads;  // threads of each (a CTA's)
  using InPacks = Pack<TIn, kVec>[kIn];

  ROWNORM_DEVICE int64_t Size() const { return n_; }
  ROWNORM_DEVICE int64_t Index() const { return row_; }
  ROWNORM_DEVICE bool Valid() const { return valid_; }
  ROWNORM_DEVICE bool Leader() const {
    return valid_ && team_.ThreadRank() == 0 && team_.SliceRank() == 0;
  }
  ROWNORM_DEVICE Acc First() const { return ToAcc(row0_[0]); }
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return team_.AllReduce(v, op);
  }
  // Cluster rows only (kOneRound): the elements of this CTA's slice (its packs, and the head
  // scalars in slice 0, the tail scalars in the last), and RowOps::ReduceSlice's primitives.
  ROWNORM_DEVICE int64_t SliceSize() const {
    const int slice = team_.SliceRank();
    const int64_t packs = Ownership<Team, kVec>::SliceBegin(geo_.vecs, slice + 1) -
                          Ownership<Team, kVec>::SliceBegin(geo_.vecs, slice);
    return packs * kVec + (slice == 0 ? geo_.head : 0) +
           (slice == Team::kSlices - 1 ? geo_.tail : 0);
  }
  template <typename Op, typename V>
  ROWNORM_DEVICE V SliceAllReduce(V v, Op op) {
    return team_.SliceAllReduce(v, op);
  }
  template <typename V, class Combine>
  ROWNORM_DEVICE auto MergeSlices(const V& v, Combine combine) {
    return team_.MergeSlices(v, combine);
  }

  template <class G>
  ROWNORM_DEVICE void ForEachValue(G g) const {
    this->Self().ForEachPack([&](int, const InPacks& p, int64_t col0) {
      Acc x[kIn];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        g(static_cast<const Acc*>(x), col0 + e);
      }
    });
    ForEachScalar(g);
  }

  template <int J, typename F>
  ROWNORM_DEVICE void StoreTo(F f) {
    static_assert(J >= 0 && J < kOut, "the op has no such output");
    if constexpr (Args::kMixed) {
      StoreMixed<J>(f);
    } else {
      TOut* out = out_[J];
      this->Self().ForEachPack([&](int, const InPacks& p, int64_t col0) {
        Pack<TOut, kVec> o;
        Acc x[kIn];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
          o.Set(e, static_cast<AccType<TOut>>(f(static_cast<const Acc*>(x), col0 + e)));
        }
        o.Store(out + col0);
      });
      ForEachScalar([&](const Acc* x, int64_t col) {
        out[col] = FromAcc<TOut>(static_cast<AccType<TOut>>(f(x, col)));
      });
    }
  }

  // Whether the general rows read parameters of type W that are not aligned like the row a
  // pack at a time, by 4-byte loads (LoadPackUnaligned), rather than an element at a time: on
  // rows that do not start 16-byte aligned the parameters at a pack's columns rarely are.
  // H100, forward, time per element ÷ by words: layer_norm bf16 16383 / 32767 1.106 / 1.107
  // (80 → 89, 79 → 87% of copy), 65535 / 131071 1.024 / 1.018; rms_norm bf16 16383-131071
  // 1.022-1.048; add_rms_norm and float32 rows 0.98-1.02 (NOTES.md §43).
  template <typename W>
  static constexpr bool kUnalignedParamPacks = !kAligned && Pack<W, kParamVec<W, kVec>>::kWords;

  // Output 0 at col = f(x, col, p), p[j] = parameter j at col (StoreWith in row_ops.h), the
  // parameters of a pack's columns read by the view's ParamPack where ParamsPackable, else
  // (kUnalignedParamPacks) a word at a time, else one element at a time. The two packed loops
  // apart: one loop with a branch per pack made the kernels held to 64 registers spill, and
  // rms_norm bf16 65535 fell from 94 to 80% of copy (NOTES.md §43).
  template <typename F, class PS>
  ROWNORM_DEVICE void StoreWith(F f, const PS& ps) {
    const auto g = WithParams<Acc>(f, ps);
    if (!this->Self().ParamsPackable(ps)) {
      if constexpr (kUnalignedParamPacks<typename PS::Elem>) {
        StorePacks<true>(f, ps, g);
      } else {
        StoreTo<0>(g);
      }
      return;
    }
    StorePacks<false>(f, ps, g);
  }
  template <bool kUnaligned, typename F, class PS, class G>
  ROWNORM_DEVICE void StorePacks(F f, const PS& ps, G g) {
    constexpr int K = PS::kCount;
    if constexpr (Args::kMixed) {
      StoreWithMixed<kUnaligned>(f, ps, g);
    } else {
      TOut* out = out_[0];
      this->Self().ForEachPack([&](int k, const InPacks& p, int64_t col0) {
        Acc pv[K][kVec];
        this->Self().template ParamPack<kUnaligned>(ps, k, col0, pv);
        Pack<TOut, kVec> o;
        Acc x[kIn];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
          Acc pe[K];
#pragma unroll
          for (int j = 0; j < K; ++j) pe[j] = pv[j][e];
          o.Set(e, static_cast<AccType<TOut>>(f(static_cast<const Acc*>(x), col0 + e, pe)));
        }
        o.Store(out + col0);
      });
      ForEachScalar([&](const Acc* x, int64_t col) {
        out[col] = FromAcc<TOut>(static_cast<AccType<TOut>>(g(x, col)));
      });
    }
  }

  // StoreTo and StoreWith of a mixed problem (args.h): each output in its own storage type
  // (OutOffset, StoreOutPack, StoreOutScalar), output 1 by output 0's stores where it is output
  // 0's copy (Args::kOut1CopiesOut0). Apart from the uniform ones above so that those compile
  // as they did: serving uniform problems too, these changed the SASS of 522 uniform kernels
  // (address arithmetic moved off the uniform datapath; benchmarks/results/h100/NOTES.md §33).
  template <int J>
  static constexpr bool kWithCopy = J == 0 && Args::kOut1CopiesOut0;

  template <int J, typename F>
  ROWNORM_DEVICE void StoreMixed(F f) {
    static_assert(J != 1 || !Args::kOut1CopiesOut0, "output 1 is written with output 0");
    this->Self().ForEachPack([&](int, const InPacks& p, int64_t col0) {
      Acc y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        Acc x[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        y[e] = f(static_cast<const Acc*>(x), col0 + e);
      }
      StoreMixedPack<J>(col0, y);
    });
    ForEachScalar([&](const Acc* x, int64_t col) { StoreMixedScalar<J>(col, f(x, col)); });
  }
  template <bool kUnaligned, typename F, class PS, class G>
  ROWNORM_DEVICE void StoreWithMixed(F f, const PS& ps, G g) {
    constexpr int K = PS::kCount;
    this->Self().ForEachPack([&](int k, const InPacks& p, int64_t col0) {
      Acc pv[K][kVec];
      this->Self().template ParamPack<kUnaligned>(ps, k, col0, pv);
      Acc y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        Acc x[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        Acc pe[K];
#pragma unroll
        for (int j = 0; j < K; ++j) pe[j] = pv[j][e];
        y[e] = f(static_cast<const Acc*>(x), col0 + e, pe);
      }
      StoreMixedPack<0>(col0, y);
    });
    ForEachScalar([&](const Acc* x, int64_t col) { StoreMixedScalar<0>(col, g(x, col)); });
  }
  // Output J's pack at col0 = y (and its copy), each rounded once to its storage type.
  template <int J>
  ROWNORM_DEVICE void StoreMixedPack(int64_t col0, const Acc (&y)[kVec]) {
    StoreOutPack<Args, J, kVec>(OutOffset<Args>(out_[J], J, col0), [&](int e) { return y[e]; });
    if constexpr (kWithCopy<J>) {
      StoreOutPack<Args, 1, kVec>(OutOffset<Args>(out_[1], 1, col0), [&](int e) { return y[e]; });
    }
  }
  template <int J>
  ROWNORM_DEVICE void StoreMixedScalar(int64_t col, Acc v) {
    StoreOutScalar<Args, J>(OutOffset<Args>(out_[J], J, col), v);
    if constexpr (kWithCopy<J>) StoreOutScalar<Args, 1>(OutOffset<Args>(out_[1], 1, col), v);
  }

  // Whether ParamPack may read `ps` a pack at a time with vector loads: every given parameter
  // aligned like the row for them (ParamPacksAligned).
  template <class PS>
  ROWNORM_DEVICE bool ParamsPackable(const PS& ps) const {
    bool aligned = true;
#pragma unroll
    for (int j = 0; j < PS::kCount; ++j) {
      aligned = aligned && (ps.p[j] == nullptr ||
                            ParamPacksAligned<typename PS::Elem, kVec>(ps.p[j], geo_.head));
    }
    return aligned;
  }

  // pv[j][e] = parameter j at col0 + e for the pack at col0 (this thread's pack k), with vector
  // loads (ParamsPackable(ps)), or with kUnaligned by 4-byte loads (kUnalignedParamPacks);
  // kOrAbsent: LoadParamPack's.
  template <bool kUnaligned, bool kOrAbsent = false, class PS>
  ROWNORM_DEVICE void ParamPack(const PS& ps, int, int64_t col0,
                                Acc (&pv)[PS::kCount][kVec]) const {
#pragma unroll
    for (int j = 0; j < PS::kCount; ++j) {
      if (kOrAbsent || ps.p[j] != nullptr) {
        LoadParamPack<Acc, kVec, kUnaligned, kOrAbsent>(ps, j, col0, pv[j]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) pv[j][e] = ps.template Absent<Acc>(j);
      }
    }
  }

 protected:
  ROWNORM_DEVICE PackedRow(Team& team, const Args& args, int64_t row, bool valid)
      : team_(team),
        row0_(In(args, 0, row, valid)),
        geo_(RowGeometry<TIn, kVec>::template Of<kAligned>(row0_, args.n)),
        own_(team, geo_, valid),
        n_(args.n),
        row_(row),
        valid_(valid) {
    static_assert(!Args::NarrowIn(0),
                  "input 0, whose address gives the row's geometry, is "
                  "not narrowed");
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      out_[j] = OutOffset<Args>(args.out[j], j, (valid ? row : 0) * args.out_stride[j]);
    }
  }

  ROWNORM_DEVICE static const TIn* In(const Args& args, int i, int64_t row, bool valid) {
    return InOffset<Args>(args.in[i], i, (valid ? row : 0) * args.in_stride[i]);
  }

  // g(x, col) for the head and tail scalars this thread owns.
  template <class G>
  ROWNORM_DEVICE void ForEachScalar(G g) const {
    if constexpr (!kAligned) {  // aligned rows have no head and no tail
      Acc x[kIn];
      if (own_.head_col >= 0) {
        this->Self().template LoadScalar<false>(own_.head_col, x);
        g(static_cast<const Acc*>(x), own_.head_col);
      }
      if (own_.tail_col >= 0) {
        this->Self().template LoadScalar<true>(own_.tail_col, x);
        g(static_cast<const Acc*>(x), own_.tail_col);
      }
    }
  }

  Team& team_;
  const TIn* row0_;  // input 0's row
  RowGeometry<TIn, kVec> geo_;
  Ownership<Team, kVec> own_;
  TOut* out_[kOut];
  int64_t n_;
  int64_t row_;
  bool valid_;
};

// The row cached in registers as packs of the storage type (converted on use, which keeps
// 16-bit rows at half the registers). Capacity: kVecs packs per thread per slice.
// The fused parameter-gradient kernels, the kept-parameter cluster rows and the register rows of
// aligned problems (tier_kernels.cuh) set kAligned (their rows have no head or tail:
// RowGeometry::Of); the first two pass the ParamCache their CTA filled as `Cache`, from which
// ReduceWith and StoreWith then read the parameters (NoParamCache: from global memory). The
// fused kernels of rows in phase (plan.h's PhasedSumPlan) pass one without kAligned: the
// cache holds the packs' columns of its rows' geometry, and the head and tail scalars'
// parameters are read from global memory.
// kFlatPacks, with kAligned: the row's passes test once a row whether the thread owns all its
// packs (ForEachPack), not a branch a pack, and read an absent weight or bias as a pack preset
// to its value (LoadParamPack's kOrAbsent). Set by the held CTA kernels (CtaRowKernelBounded,
// whose launch bounds fix their registers) and the group tier, where they measured faster
// (h200/NOTES.md §44: 16-bit layer_norm's forward 0.94x at 16384 in the bench; the group
// tier's 0.98x at 256-1024 in kernel time only, which the bench does not show). Not in
// every row: there they moved ptxas's registers across hundreds of kernels, a CTA per SM fewer
// in some (layer_norm's 256 x 4 CTA 1.03x the time) and past kMaxHeldLocalBytes in the held
// kernels of rows not aligned (§43-§44).
template <class Args, int kVec, int kVecs, class Team, bool kAligned = false,
          class Cache = NoParamCache, bool kFlatPacks = false>
class CachedRow : public PackedRow<CachedRow<Args, kVec, kVecs, Team, kAligned, Cache, kFlatPacks>,
                                   Args, kVec, Team, kAligned> {
  using Base = PackedRow<CachedRow, Args, kVec, Team, kAligned>;
  using Base::geo_;
  using Base::own_;
  using Base::team_;
  static constexpr bool kParamsCached = !std::is_same_v<Cache, NoParamCache>;
  static constexpr bool kFlat = kFlatPacks && kAligned;  // kFlatPacks applies to aligned rows

 public:
  using typename Base::Acc;
  using typename Base::InPacks;
  using typename Base::TIn;
  using typename Base::TOut;
  static constexpr int kIn = Base::kIn;
  static constexpr bool kCached = true;                 // another Reduce costs no memory traffic
  static constexpr bool kOneRound = Team::kSlices > 1;  // an all-reduce crosses the cluster
  static constexpr bool kPackedParams = true;
  static constexpr bool kSharedParams = kParamsCached;
  // StoreWithColumns in one pass: aligned rows (no head or tail scalars) of a problem of one
  // storage type, on a CTA or a cluster. Two passes stay where fused measured worse: rows in
  // phase (the frame of the 384-thread staged kernel held to two CTAs per SM passed
  // dispatch.cuh's kMaxHeldLocalBytes, and layer_norm bf16 6141 lost its held plan) and the
  // group tier's rows of a warp or less (layer_norm bf16 256-1024 1.03-1.05x the time;
  // h200/NOTES.md §33).
  static constexpr bool kFusesColumns = kAligned && !Args::kMixed && Team::kThreads > kWarpSize;

  // What a cached row holds: its loads, issued apart from the view by Load so that a kernel
  // can have the next row's in flight while it reduces this one (CtaRowSumsKernel).
  struct Scalars {  // the head and tail scalars a thread owns (rows that are not aligned)
    TIn head[kIn];
    TIn tail[kIn];
  };
  struct Loaded {
    Pack<TIn, kVec> packs[kVecs][kIn];
    Scalars scalars;
  };

  ROWNORM_DEVICE static Loaded Load(const Team& team, const Args& args, int64_t row, bool valid) {
    return LoadWith(team, args, row, valid, [](int, int i, const TIn* src, Pack<TIn, kVec>& dst) {
      LoadInPack<Args>(src, i, dst);
    });
  }

  // Load, input 0's packs under an L2 eviction policy (pack.cuh's L2EvictionPolicy): kernels
  // that load with evict_last call ReleaseInput0 once the row is stored.
  ROWNORM_DEVICE static Loaded LoadWithPolicy(const Team& team, const Args& args, int64_t row,
                                              bool valid, uint64_t l2_policy) {
    return LoadWith(team, args, row, valid,
                    [l2_policy](int, int i, const TIn* src, Pack<TIn, kVec>& dst) {
                      // The compiler's own load through the annotated pointer: its addressing
                      // folds as a plain load's (an asm load of each pack's address held 8-16
                      // more registers in the group kernels).
                      if (i == 0) src = WithL2Policy(src, l2_policy);
                      LoadInPack<Args>(src, i, dst);
                    });
  }

  // Once `row` (loaded with evict_last) is stored: input 0's L2 lines that this thread's packs
  // open go back to evict_normal. A line opens with the pack that holds its first 16 bytes; the
  // team's first pack (thread 0's first) may start inside a line that another row or slice read
  // too, so thread 0 releases that line as well. Every line of the row is then released by a
  // thread of the row after its loads landed. Recomputed from args rather than kept in the view:
  // kept, the addresses held registers through the op body.
  ROWNORM_DEVICE static void ReleaseInput0(const Team& team, const Args& args, int64_t row,
                                           bool valid) {
    const TIn* p = Base::In(args, 0, row, valid);
    const auto geo = RowGeometry<TIn, kVec>::template Of<kAligned>(p, args.n);
    const Ownership<Team, kVec> own(team, geo, valid);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own.first_vec + k * Team::kThreads;
      if (v < own.vec_end) {
        const TIn* at = p + geo.head + v * kVec;
        if ((reinterpret_cast<uintptr_t>(at) & 127) < 16 || (k == 0 && team.ThreadRank() == 0)) {
          ReleaseL2Line(at);
        }
      }
    }
  }

  using Stage = RowStage<Args, kVec, kVecs, Team::kThreads>;

  // Issues the asynchronous copies of this thread's packs of `row` into `stage`.
  ROWNORM_DEVICE static void Prefetch(const Team& team, const Args& args, int64_t row,
                                      Stage& stage) {
    static_assert(!Args::kMixed, "a stage holds packs of one type (plan.h stages no mixed rows)");
    const auto geo =
        RowGeometry<TIn, kVec>::template Of<kAligned>(Base::In(args, 0, row, true), args.n);
    const Ownership<Team, kVec> own(team, geo, true);
    ForEachOwnedPack(args, row, true, geo, own, [&](int k, int i, const TIn* src) {
      CopyPackAsync(&stage.packs[k][i][team.ThreadRank()], src);
    });
  }

  // Brings this CTA's slice of `row`'s inputs into L2 (threads 0 .. kIn - 1, one bulk prefetch
  // each, rounded inwards to 16 bytes; sm_90+): a persistent kernel's next row (SliceRowSums),
  // or a CTA's (CtaRowSumsKernel), whose loads then find it there. Thread i takes input i by
  // its rank, which puts the kernel's argument arrays in local memory (a 72-104-byte stack
  // frame); with kUnrolled through a constant index instead (the inputs unrolled). The CTA sums
  // take that; the slice sums keep the indexed form: unrolled, rms_norm's bf16 sums on 8-CTA
  // clusters at 65536 took 1.08x the time (benchmarks/results/h200/NOTES.md §41).
  template <bool kUnrolled = false>
  ROWNORM_DEVICE static void PrefetchL2(const Team& team, const Args& args, int64_t row) {
    const int rank = team.ThreadRank();
    if (rank >= kIn) return;
    const auto geo =
        RowGeometry<TIn, kVec>::template Of<kAligned>(Base::In(args, 0, row, true), args.n);
    const int slice = team.SliceRank();
    const int64_t begin = Ownership<Team, kVec>::SliceBegin(geo.vecs, slice);
    const int64_t end = Ownership<Team, kVec>::SliceBegin(geo.vecs, slice + 1);
    const auto prefetch = [&](int i) {
      const int64_t elem = Args::InBytes(i);
      const uintptr_t first = reinterpret_cast<uintptr_t>(Base::In(args, i, row, true)) +
                              static_cast<uintptr_t>((geo.head + begin * kVec) * elem);
      const uintptr_t from = (first + 15) & ~uintptr_t{15};
      const uintptr_t to =
          (first + static_cast<uintptr_t>((end - begin) * kVec * elem)) & ~uintptr_t{15};
      if (to > from) {
        PrefetchBulkL2(reinterpret_cast<const void*>(from), static_cast<unsigned>(to - from));
      }
    };
    if constexpr (kUnrolled) {
#pragma unroll
      for (int i = 0; i < kIn; ++i) {
        if (i == rank) prefetch(i);
      }
    } else {
      prefetch(rank);
    }
  }

  // The loads of `row` whose packs Prefetch staged in `stage` (the caller waited for the
  // copies); the head and tail scalars are read from global memory, or (rows that are not
  // aligned) taken from `scalars`, LoadScalars of the row issued earlier: read here, their
  // latency would hold the CTA at the row's first barrier.
  ROWNORM_DEVICE static Loaded LoadStaged(const Team& team, const Args& args, int64_t row,
                                          const Stage& stage, const Scalars* scalars = nullptr) {
    return LoadWith(
        team, args, row, true,
        [&](int k, int i, const TIn*, Pack<TIn, kVec>& dst) {
          dst = stage.packs[k][i][team.ThreadRank()];
        },
        scalars);
  }

  // The loads of aligned row `row` from `slices` (RowSlices), where the bulk copies of
  // SharedRow::Issue put this CTA's slice of it (the caller waited for them): thread t's pack k
  // of input i at slices.packs[i][t + k * kThreads], a warp's 16-byte reads contiguous.
  template <class Slices>
  ROWNORM_DEVICE static Loaded LoadSlices(const Team& team, const Args& args, int64_t row,
                                          const Slices& slices) {
    static_assert(kAligned, "a slice's packs start at its first column (no head scalars)");
    return LoadWith(team, args, row, true, [&](int k, int i, const TIn*, Pack<TIn, kVec>& dst) {
      dst = slices.packs[i][team.ThreadRank() + k * Team::kThreads];
    });
  }

  // The head and tail scalars of `row` that this thread owns.
  ROWNORM_DEVICE static Scalars LoadScalars(const Team& team, const Args& args, int64_t row,
                                            bool valid) {
    const auto geo =
        RowGeometry<TIn, kVec>::template Of<kAligned>(Base::In(args, 0, row, valid), args.n);
    return ReadScalars(args, row, valid, Ownership<Team, kVec>(team, geo, valid));
  }

  ROWNORM_DEVICE CachedRow(Team& team, const Args& args, int64_t row, bool valid,
                           const Cache* cache = nullptr)
      : CachedRow(team, args, row, valid, Load(team, args, row, valid), cache) {}

  // The view of row `row` whose loads `l` are (Load of the same row).
  ROWNORM_DEVICE CachedRow(Team& team, const Args& args, int64_t row, bool valid, const Loaded& l,
                           const Cache* cache = nullptr)
      : Base(team, args, row, valid), data_(l), cache_(cache) {}

  // f(x, col, p) reduced over the row (ReduceWith in row_ops.h; kSharedParams), a pack's
  // parameters read from the cache, the scalars' from global memory; the order of operations
  // of Reduce (the packs, then the scalars), so the same bits as the two-pass path's rows.
  template <typename Op, typename F, class PS>
  ROWNORM_DEVICE auto ReduceWith(Op op, F f, const PS& ps) {
    static_assert(kParamsCached, "ReduceWith reads the parameters from a ParamCache");
    constexpr int K = PS::kCount;
    const auto g = WithParams<Acc>(f, ps);
    using V = ReduceValue<decltype(g), Acc>;
    V acc = Op::template Identity<V>();
    ForEachPack([&](int k, const InPacks& p, int64_t col0) {
      Acc pv[K][kVec];
      ParamPack<false>(ps, k, col0, pv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        Acc x[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        Acc pe[K];
#pragma unroll
        for (int j = 0; j < K; ++j) pe[j] = pv[j][e];
        acc = op(acc, f(static_cast<const Acc*>(x), col0 + e, pe));
      }
    });
    this->ForEachScalar([&](const Acc* x, int64_t col) { acc = op(acc, g(x, col)); });
    return this->AllReduce(acc, op);
  }

  // The largest element of input 0 this thread owns (RowOps::MaxLocal), for 16-bit rows as a
  // max of the stored pairs (exact: no rounding in a max; one conversion per pair of packs'
  // words instead of one per element). Like fmax, a NaN loses to a number.
  ROWNORM_DEVICE Acc MaxLocal() const {
    if constexpr (sizeof(TIn) == 2 && !Args::kMixed) {
      using Pair = std::conditional_t<std::is_same_v<TIn, __half>, __half2, __nv_bfloat162>;
      constexpr uint32_t kNegInf = std::is_same_v<TIn, __half> ? 0xFC00FC00u : 0xFF80FF80u;
      uint32_t acc = kNegInf;
      ForEachPack([&](int, const InPacks& p, int64_t) {
#pragma unroll
        for (int w = 0; w < Pack<TIn, kVec>::kNumWords; ++w) {
          const Pair m = __hmax2(*reinterpret_cast<const Pair*>(&acc),
                                 *reinterpret_cast<const Pair*>(&p[0].d.w[w]));
          acc = *reinterpret_cast<const uint32_t*>(&m);
        }
      });
      Acc m = Max(BitsToAcc<TIn>(acc & 0xFFFFu), BitsToAcc<TIn>(acc >> 16));
      this->ForEachScalar([&](const Acc* x, int64_t) { m = Max(m, x[0]); });
      return m;
    } else {
      return Base::MaxLocal();
    }
  }

  // Parameters from the cache where the kernel keeps one (else PackedRow's vector loads).
  template <class PS>
  ROWNORM_DEVICE bool ParamsPackable(const PS& ps) const {
    if constexpr (kParamsCached) {
      return true;
    } else {
      return Base::ParamsPackable(ps);
    }
  }
  template <bool kUnaligned, class PS>
  ROWNORM_DEVICE void ParamPack(const PS& ps, int k, int64_t col0,
                                Acc (&pv)[PS::kCount][kVec]) const {
    if constexpr (kParamsCached) {
      static_assert(std::is_same_v<PS, typename Cache::List>,
                    "an op body reads the parameters its ColumnParams() lists");
      cache_->Get(ps, k, team_.ThreadRank(), pv);
    } else {
      // (kFlatPacks: the absent values preset. In every row that moved ptxas's registers in
      // 282 kernels, across kMaxHeldLocalBytes in three held ones: h200/NOTES.md §44.)
      Base::template ParamPack<kUnaligned, kFlat>(ps, k, col0, pv);
    }
  }

  // sums[j][col] += f(x, col)[j] over this row when the kernel accumulates column sums
  // (the *RowSumsKernel: ColumnSums in registers or SharedColumnSums); a no-op otherwise. Rows
  // of one geometry: a pack's sums by the thread's pack index, and (not kAligned) the head
  // and tail scalars' by AddScalar<0 / 1> (PhasedSums in tier_kernels.cuh).
  template <typename F, class Sums>
  ROWNORM_DEVICE void AddColumns(F f, Sums* sums) {
    constexpr int kK = Sums::kCount;
    if (sums == nullptr) return;
    ForEachPack([&](int k, const InPacks& p, int64_t col0) {
      Acc a[kK][kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        Acc x[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
        const Array<Acc, kK> v = f(static_cast<const Acc*>(x), col0 + e);
#pragma unroll
        for (int j = 0; j < kK; ++j) a[j][e] = v[j];
      }
      sums->Add(k, team_.ThreadRank(), a);
    });
    if constexpr (!kAligned) {
      Acc x[kIn];
      if (own_.head_col >= 0) {
        LoadScalar<false>(own_.head_col, x);
        sums->template AddScalar<0>(f(static_cast<const Acc*>(x), own_.head_col));
      }
      if (own_.tail_col >= 0) {
        LoadScalar<true>(own_.tail_col, x);
        sums->template AddScalar<1>(f(static_cast<const Acc*>(x), own_.tail_col));
      }
    }
  }

  // StoreWith(f, ps) and AddColumns(c, sums) in one pass over the packs (StoreWithColumns in
  // row_ops.h) where kFusesColumns and the parameters come a pack at a time (else the two
  // passes): each element converted once, and the terms f and c share (layer_norm's x − μ)
  // computed once. Two passes converted every pack twice and left layer_norm's staged
  // backward, bf16 8192, at 35.6 warp instructions per element (h200/NOTES.md §32). The same
  // values in the same order, so the same sums.
  template <typename F, class PS, typename C, class Sums>
  ROWNORM_DEVICE void StoreWithColumns(F f, const PS& ps, C c, Sums* sums) {
    if constexpr (kFusesColumns) {
      if (sums != nullptr && ParamsPackable(ps)) {
        constexpr int K = PS::kCount;
        constexpr int kK = Sums::kCount;
        TOut* out = this->out_[0];
        ForEachPack([&](int k, const InPacks& p, int64_t col0) {
          Acc pv[K][kVec];
          ParamPack<false>(ps, k, col0, pv);
          Pack<TOut, kVec> o;
          Acc a[kK][kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            Acc x[kIn];
#pragma unroll
            for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
            Acc pe[K];
#pragma unroll
            for (int j = 0; j < K; ++j) pe[j] = pv[j][e];
            o.Set(e, static_cast<AccType<TOut>>(f(static_cast<const Acc*>(x), col0 + e, pe)));
            const Array<Acc, kK> v = c(static_cast<const Acc*>(x), col0 + e);
#pragma unroll
            for (int j = 0; j < kK; ++j) a[j][e] = v[j];
          }
          o.Store(out + col0);
          sums->Add(k, team_.ThreadRank(), a);
        });
        return;
      }
    }
    this->StoreWith(f, ps);
    AddColumns(c, sums);
  }

  // Primitives (see the top of this file).
  template <class G>
  ROWNORM_DEVICE void ForEachPack(G g) const {
    if constexpr (kParamsCached || kFlat) {
      // Where the thread owns all kVecs packs, no branch per pack: the kernels that keep
      // parameters (aligned rows), so that ptxas may issue the packs' shared-memory loads
      // together, and kFlatPacks rows, whose passes then take one base address and no branch a
      // pack (16-bit layer_norm's forward at 16384: 26.5 -> 22.6 warp instructions an element,
      // h200/NOTES.md §43).
      if (own_.first_vec + (kVecs - 1) * int64_t{Team::kThreads} < own_.vec_end) {
#pragma unroll
        for (int k = 0; k < kVecs; ++k) {
          g(k, data_.packs[k], geo_.head + (own_.first_vec + k * Team::kThreads) * kVec);
        }
        return;
      }
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) g(k, data_.packs[k], geo_.head + v * kVec);
    }
  }
  template <bool kTail>
  ROWNORM_DEVICE void LoadScalar(int64_t, Acc (&x)[kIn]) const {
#pragma unroll
    for (int i = 0; i < kIn; ++i)
      x[i] = ToAcc(kTail ? data_.scalars.tail[i] : data_.scalars.head[i]);
  }

 private:
  // g(k, i, address) for each pack k of input i of `row` that this thread owns.
  template <class G>
  ROWNORM_DEVICE static void ForEachOwnedPack(const Args& args, int64_t row, bool valid,
                                              const RowGeometry<TIn, kVec>& geo,
                                              const Ownership<Team, kVec>& own, G g) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) {
      const TIn* p = Base::In(args, i, row, valid);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = own.first_vec + k * Team::kThreads;
        if (v < own.vec_end) g(k, i, InOffset<Args>(p, i, geo.head + v * kVec));
      }
    }
  }

  // The head and tail scalars of `row` that `own` gives this thread.
  ROWNORM_DEVICE static Scalars ReadScalars(const Args& args, int64_t row, bool valid,
                                            const Ownership<Team, kVec>& own) {
    Scalars sc;
    if constexpr (!kAligned) {  // aligned rows have no head and no tail
#pragma unroll
      for (int i = 0; i < kIn; ++i) {
        const TIn* p = Base::In(args, i, row, valid);
        if (own.head_col >= 0)
          sc.head[i] = LoadInScalar<Args>(InOffset<Args>(p, i, own.head_col), i);
        if (own.tail_col >= 0)
          sc.tail[i] = LoadInScalar<Args>(InOffset<Args>(p, i, own.tail_col), i);
      }
    }
    return sc;
  }

  // The loads of `row`, each pack moved by fill(k, i, address, pack), the scalars read (or
  // copied from `scalars`).
  template <class Fill>
  ROWNORM_DEVICE static Loaded LoadWith(const Team& team, const Args& args, int64_t row, bool valid,
                                        Fill fill, const Scalars* scalars = nullptr) {
    const auto geo =
        RowGeometry<TIn, kVec>::template Of<kAligned>(Base::In(args, 0, row, valid), args.n);
    const Ownership<Team, kVec> own(team, geo, valid);
    Loaded l;
    ForEachOwnedPack(args, row, valid, geo, own,
                     [&](int k, int i, const TIn* src) { fill(k, i, src, l.packs[k][i]); });
    if constexpr (!kAligned) {
      l.scalars = scalars != nullptr ? *scalars : ReadScalars(args, row, valid, own);
    }
    return l;
  }

  Loaded data_;
  const Cache* cache_;
};

// The row left in global memory: every Reduce and Store streams it again. Used where no
// cached tier fits (very long rows before sm_90, misaligned operands, float64).
template <class Args, int kVec, class Team>
class StreamingRow : public PackedRow<StreamingRow<Args, kVec, Team>, Args, kVec, Team, false> {
  using Base = PackedRow<StreamingRow, Args, kVec, Team, false>;
  using Base::geo_;
  using Base::own_;

 public:
  using typename Base::Acc;
  using typename Base::TIn;
  static constexpr int kIn = Base::kIn;
  static constexpr bool kCached = false;  // every Reduce reads the row again

  ROWNORM_DEVICE StreamingRow(Team& team, const Args& args, int64_t row, bool valid)
      : Base(team, args, row, valid) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) in_[i] = Base::In(args, i, row, valid);
  }

  // Primitives (see the top of this file).
  template <class G>
  ROWNORM_DEVICE void ForEachPack(G g) const {
#pragma unroll 2
    for (int64_t v = own_.first_vec; v < own_.vec_end; v += Team::kThreads) {
      Pack<TIn, kVec> p[kIn];
#pragma unroll
      for (int i = 0; i < kIn; ++i)
        LoadInPack<Args>(InOffset<Args>(in_[i], i, geo_.head + v * kVec), i, p[i]);
      g(0, p, geo_.head + v * kVec);
    }
  }
  template <bool kTail>
  ROWNORM_DEVICE void LoadScalar(int64_t col, Acc (&x)[kIn]) const {
#pragma unroll
    for (int i = 0; i < kIn; ++i)
      x[i] = ToAcc(LoadInScalar<Args>(InOffset<Args>(in_[i], i, col), i));
  }

  // A thread's share of a streamed row is long (fp32 rows of 262145: 512 elements), and one
  // running sum over it carried a relative error of 5e-6 on a constant row (the fuzz net, on
  // an H200). So, as the strided view does: one partial per pack lane over a block of
  // kBlockPacks packs, the lanes combined, blocks folded into groups of kBlockPacks, groups
  // into the total; the longest chain of roundings is ~8 + kVec + 8 + m / (64 kVec) for m
  // elements a thread.
  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    constexpr int kBlockPacks = 8;
    V acc = Op::template Identity<V>();
    V group = acc;
    int in_group = 0;
    for (int64_t v = own_.first_vec; v < own_.vec_end;) {
      V lane[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) lane[e] = Op::template Identity<V>();
#pragma unroll 2
      for (int k = 0; k < kBlockPacks && v < own_.vec_end; ++k, v += Team::kThreads) {
        Pack<TIn, kVec> p[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) {
          LoadInPack<Args>(InOffset<Args>(in_[i], i, geo_.head + v * kVec), i, p[i]);
        }
        const int64_t col0 = geo_.head + v * kVec;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          Acc x[kIn];
#pragma unroll
          for (int i = 0; i < kIn; ++i) x[i] = p[i].Get(e);
          lane[e] = op(lane[e], f(static_cast<const Acc*>(x), col0 + e));
        }
      }
      V block = lane[0];
#pragma unroll
      for (int e = 1; e < kVec; ++e) block = op(block, lane[e]);
      group = op(group, block);
      if (++in_group == kBlockPacks) {
        acc = op(acc, group);
        group = Op::template Identity<V>();
        in_group = 0;
      }
    }
    acc = op(acc, group);
    this->ForEachScalar([&](const Acc* x, int64_t col) { acc = op(acc, f(x, col)); });
    return acc;
  }

 private:
  const TIn* in_[kIn];
};

// A row whose slices are in shared memory, where BulkRowKernel's bulk copies put them (sm_90+):
// the packs of input i of this CTA's slice at slices[i][0, 1, ...], in the order of global
// memory, so that thread t's pack k, t + k * kThreads, is read by a warp as 512 contiguous
// bytes. Capacity: kVecs packs per thread per slice, as CachedRow's; the head and tail scalars
// are read from global memory. Nothing of the row is held in registers: a Reduce or a Store
// reads the packs it uses from shared memory, which keeps the kernel's registers few and its
// CTAs many, each with its next rows' bytes in flight.
template <class Args, int kVec, int kVecs, int kThreads>
struct RowSlices {
  Pack<typename Args::InElem, kVec> packs[Args::kNumIn][kVecs * kThreads];
};

template <class Args, int kVec, int kVecs, class Team>
class SharedRow : public PackedRow<SharedRow<Args, kVec, kVecs, Team>, Args, kVec, Team, false> {
  using Base = PackedRow<SharedRow, Args, kVec, Team, false>;
  using Base::geo_;
  using Base::own_;
  using Base::row_;
  using Base::team_;

 public:
  using typename Base::Acc;
  using typename Base::TIn;
  static constexpr int kIn = Base::kIn;
  static constexpr bool kCached = true;                 // another Reduce reads shared memory only
  static constexpr bool kOneRound = Team::kSlices > 1;  // an all-reduce crosses the cluster
  static constexpr bool kPackedParams = true;
  using Stage = RowSlices<Args, kVec, kVecs, Team::kThreads>;

  // Issued by one thread of the CTA: the bulk copies of this CTA's slices of `row` into
  // `stage`, which complete the current phase of `bar`.
  ROWNORM_DEVICE static void Issue(const Team& team, const Args& args, int64_t row, Stage& stage,
                                   uint64_t* bar) {
    static_assert(!Args::kMixed, "a slice holds packs of one type (plan.h: no mixed rows here)");
    const TIn* row0 = Base::In(args, 0, row, true);
    const auto geo = RowGeometry<TIn, kVec>::template Of<false>(row0, args.n);
    using Own = Ownership<Team, kVec>;
    const int64_t begin = Own::SliceBegin(geo.vecs, team.SliceRank());
    const int64_t packs = Own::SliceBegin(geo.vecs, team.SliceRank() + 1) - begin;
    const unsigned bytes = static_cast<unsigned>(packs * sizeof(Pack<TIn, kVec>));
    ExpectBytes(bar, kIn * bytes);
    if (bytes > 0) {
#pragma unroll
      for (int i = 0; i < kIn; ++i) {
        CopyBulkAsync(stage.packs[i], Base::In(args, i, row, true) + geo.head + begin * kVec, bytes,
                      bar);
      }
    }
  }

  // The view of row `row`, whose slices are in `stage` (the caller waited for them).
  ROWNORM_DEVICE SharedRow(Team& team, const Args& args, int64_t row, const Stage& stage)
      : Base(team, args, row, true), args_(args), stage_(stage) {}

  // Primitives (see the top of this file).
  template <class G>
  ROWNORM_DEVICE void ForEachPack(G g) const {
    const int tid = team_.ThreadRank();
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = own_.first_vec + k * Team::kThreads;
      if (v < own_.vec_end) {
        Pack<TIn, kVec> p[kIn];
#pragma unroll
        for (int i = 0; i < kIn; ++i) p[i] = stage_.packs[i][tid + k * Team::kThreads];
        g(k, p, geo_.head + v * kVec);
      }
    }
  }
  template <bool kTail>
  ROWNORM_DEVICE void LoadScalar(int64_t col, Acc (&x)[kIn]) const {
#pragma unroll
    for (int i = 0; i < kIn; ++i) x[i] = ToAcc(Base::In(args_, i, row_, true)[col]);
  }

 private:
  const Args& args_;
  const Stage& stage_;
};

#endif  // __CUDACC__

}  // namespace rownorm

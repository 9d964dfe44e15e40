// The fast Walsh-Hadamard transform of rows (chapter 5, "The fast Walsh-Hadamard
// transform"): the row kernels that hadamard_cpu.cpp exposes as kernels.hadamard.fwht and
// that the fused BH projections of lookup_cpu.cpp run on their tiles. Header-only templates
// with internal linkage, compiled into each source file that includes them.
#pragma once

#include "common.h"

#include <algorithm>

namespace {

// ---------------------------------------------------------------------------- FWHT
// Unnormalised Sylvester ordering: H_1 = [1], H_{2n} = [[H_n, H_n], [H_n, -H_n]].
// One row of length d (a power of two) is transformed from src into dst (src == dst is
// allowed: every pass loads a group before it stores it).
//
// Why it is shaped this way (chapter 5, "The fast Walsh-Hadamard transform"; FFHT, the
// AVX kernel of FALCONN, is the anchor in benchmarks/bench_fwht.py): the transform does
// d log2 d additions on d elements, so it is fast only if each element is loaded and
// stored a few times, not log2 d times. The vector path below therefore does
//   * the first log2(L) stages (spans 1 .. L/2, L = lanes of one SIMD vector) inside each
//     register: one lane shuffle and one fused multiply-add by a +-1 vector per stage;
//   * the next stages in registers across a group of 2^K vectors (K = 4 with AVX-512's 32
//     registers, 3 otherwise): so one pass over the data does log2(L) + K stages
//     (8 stages for float32 with AVX-512), and every later pass K more stages, loading
//     2^K vectors at a stride of h vectors;
//   * rows shorter than 16 KiB pass by pass over chunks of rows that fill 16 KiB (L1), so
//     that a short row does not pay a loop set-up per pass; longer rows block by block
//     of 16 KiB before the stages that span blocks; the scale of the normalised transform
//     folded into the last pass; threads over rows only when each gets enough work;
//   * outputs of 32 MiB and more on transparent huge pages (empty_output_like below).
// Written with GCC's vector extensions (vector_size, __builtin_shuffle): the same source
// becomes AVX-512, AVX2 or SSE code under -march=native. Other compilers, and rows shorter
// than one vector, take the scalar path (fwht_row_portable), which uses the same stage
// order and is checked by the same tests.

template <typename T>
inline void radix8_first(const T* __restrict src, T* __restrict dst, int64_t d) {
  for (int64_t i = 0; i < d; i += 8) {
    const T a0 = src[i], a1 = src[i + 1], a2 = src[i + 2], a3 = src[i + 3];
    const T a4 = src[i + 4], a5 = src[i + 5], a6 = src[i + 6], a7 = src[i + 7];
    const T b0 = a0 + a1, b1 = a0 - a1, b2 = a2 + a3, b3 = a2 - a3;
    const T b4 = a4 + a5, b5 = a4 - a5, b6 = a6 + a7, b7 = a6 - a7;
    const T c0 = b0 + b2, c1 = b1 + b3, c2 = b0 - b2, c3 = b1 - b3;
    const T c4 = b4 + b6, c5 = b5 + b7, c6 = b4 - b6, c7 = b5 - b7;
    dst[i] = c0 + c4;
    dst[i + 1] = c1 + c5;
    dst[i + 2] = c2 + c6;
    dst[i + 3] = c3 + c7;
    dst[i + 4] = c0 - c4;
    dst[i + 5] = c1 - c5;
    dst[i + 6] = c2 - c6;
    dst[i + 7] = c3 - c7;
  }
}

// Two stages (spans h and 2h) on x[0 : len), len a multiple of 4h.
template <typename T>
inline void radix4_stage(T* __restrict x, int64_t len, int64_t h) {
  for (int64_t base = 0; base < len; base += 4 * h) {
    T* __restrict p0 = x + base;
    T* __restrict p1 = p0 + h;
    T* __restrict p2 = p1 + h;
    T* __restrict p3 = p2 + h;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      const T a = p0[j], b = p1[j], c = p2[j], e = p3[j];
      const T s0 = a + b, s1 = a - b, s2 = c + e, s3 = c - e;
      p0[j] = s0 + s2;
      p1[j] = s1 + s3;
      p2[j] = s0 - s2;
      p3[j] = s1 - s3;
    }
  }
}

// One stage (span h) on x[0 : len), len a multiple of 2h.
template <typename T>
inline void radix2_stage(T* __restrict x, int64_t len, int64_t h) {
  for (int64_t base = 0; base < len; base += 2 * h) {
    T* __restrict p0 = x + base;
    T* __restrict p1 = p0 + h;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      const T a = p0[j], b = p1[j];
      p0[j] = a + b;
      p1[j] = a - b;
    }
  }
}

// Stages with spans h_start, 2 h_start, ... < h_stop on x[0 : len).
template <typename T>
inline void stages(T* __restrict x, int64_t len, int64_t h_start, int64_t h_stop) {
  int64_t h = h_start;
  while (4 * h <= h_stop) {
    radix4_stage(x, len, h);
    h *= 4;
  }
  if (h < h_stop) radix2_stage(x, len, h);
}

template <typename T>
constexpr int64_t block_elems() {
  return 16384 / sizeof(T);  // 16 KiB: half of a 32 KiB L1 data cache
}

// Scalar path: radix 8 in registers, then radix-4 stages, L1-blocked.
template <typename T>
void fwht_row_portable(const T* src, T* dst, int64_t d, T scale) {
  if (d < 8) {
    for (int64_t i = 0; i < d; ++i) dst[i] = src[i];
    stages(dst, d, 1, d);
  } else {
    const int64_t block = std::min<int64_t>(d, block_elems<T>());
    for (int64_t b = 0; b < d; b += block) {
      if (src == dst) {
        // radix8_first reads 8 and writes the same 8, but is declared __restrict
        T tmp[8];
        for (int64_t i = b; i < b + block; i += 8) {
          std::copy(src + i, src + i + 8, tmp);
          radix8_first(tmp, dst + i, 8);
        }
      } else {
        radix8_first(src + b, dst + b, block);
      }
      stages(dst + b, block, 8, block);
    }
    stages(dst, d, block, d);
  }
  if (scale != T(1)) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dst[i] *= scale;
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#define NNK_FWHT_VECTOR 1

#if defined(__AVX512F__)
constexpr int kFwhtVecBytes = 64;
constexpr int kFwhtMaxK = 4;  // 16 vectors in flight (+ temporaries) of 32 registers
#elif defined(__AVX__)
constexpr int kFwhtVecBytes = 32;
constexpr int kFwhtMaxK = 3;  // 8 of 16 registers
#else
constexpr int kFwhtVecBytes = 16;
constexpr int kFwhtMaxK = 3;
#endif

template <typename T>
struct FwhtVec {
  static constexpr int lanes = kFwhtVecBytes / int(sizeof(T));
  typedef T V __attribute__((vector_size(kFwhtVecBytes)));
  typedef typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type I;
  typedef I M __attribute__((vector_size(kFwhtVecBytes)));
};

template <typename T>
inline typename FwhtVec<T>::V fwht_load(const T* p) {
  typename FwhtVec<T>::V v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

template <typename T>
inline void fwht_store(T* p, typename FwhtVec<T>::V v) {
  std::memcpy(p, &v, sizeof v);
}

// One stage of span H (< lanes) inside a register: lane i becomes v[i ^ H] + s_i v[i]
// with s_i = -1 where bit H of i is set: (a, b) -> (a + b, a - b), exactly as a
// separate add and subtract (the product by +-1 is exact, so the FMA rounds once).
template <typename T, int H, int... Lane>
inline typename FwhtVec<T>::V lane_stage(typename FwhtVec<T>::V v,
                                         std::integer_sequence<int, Lane...>) {
  using V = typename FwhtVec<T>::V;
  using M = typename FwhtVec<T>::M;
  using I = typename FwhtVec<T>::I;
  const M partner = {I(Lane ^ H)...};
  const V sign = {((Lane & H) ? T(-1) : T(1))...};
  return __builtin_shuffle(v, partner) + sign * v;
}

template <typename T, int H = 1>
inline typename FwhtVec<T>::V lane_stages(typename FwhtVec<T>::V v) {
  if constexpr (H < FwhtVec<T>::lanes) {
    v = lane_stage<T, H>(v, std::make_integer_sequence<int, FwhtVec<T>::lanes>{});
    return lane_stages<T, 2 * H>(v);
  } else {
    return v;
  }
}

// The stages of spans 1, 2, .., 2^(K-1) across the 2^K registers r.
template <typename T, int K>
inline void register_stages(typename FwhtVec<T>::V* r) {
  constexpr int G = 1 << K;
#pragma GCC unroll 4
  for (int h = 1; h < G; h *= 2) {
#pragma GCC unroll 16
    for (int i = 0; i < G; ++i) {
      if (i & h) continue;
      const auto a = r[i], b = r[i + h];
      r[i] = a + b;
      r[i + h] = a - b;
    }
  }
}

// First pass over nvec vectors: the lane stages and the register stages across groups of
// 2^K consecutive vectors, from src to dst, times scale when `last`.
template <typename T, int K>
void first_pass(const T* src, T* dst, int64_t nvec, T scale, bool last) {
  using V = typename FwhtVec<T>::V;
  constexpr int L = FwhtVec<T>::lanes, G = 1 << K;
  for (int64_t g = 0; g < nvec; g += G) {
    V r[G];
#pragma GCC unroll 16
    for (int i = 0; i < G; ++i) r[i] = lane_stages<T>(fwht_load(src + (g + i) * L));
    register_stages<T, K>(r);
    if (last) {
#pragma GCC unroll 16
      for (int i = 0; i < G; ++i) r[i] *= scale;
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; ++i) fwht_store(dst + (g + i) * L, r[i]);
  }
}

// A later pass, in place on nvec vectors: stages of spans h, 2h, .., 2^(K-1) h (in
// vectors), on groups of 2^K vectors h apart; times scale when `last`.
template <typename T, int K>
void stride_pass(T* x, int64_t nvec, int64_t h, T scale, bool last) {
  using V = typename FwhtVec<T>::V;
  constexpr int L = FwhtVec<T>::lanes, G = 1 << K;
  for (int64_t base = 0; base < nvec; base += G * h) {
    for (int64_t j = 0; j < h; ++j) {
      T* p = x + (base + j) * L;
      V r[G];
#pragma GCC unroll 16
      for (int i = 0; i < G; ++i) r[i] = fwht_load(p + i * h * L);
      register_stages<T, K>(r);
      if (last) {
#pragma GCC unroll 16
        for (int i = 0; i < G; ++i) r[i] *= scale;
      }
#pragma GCC unroll 16
      for (int i = 0; i < G; ++i) fwht_store(p + i * h * L, r[i]);
    }
  }
}

inline int ilog2(int64_t n) { return 63 - __builtin_clzll(uint64_t(n)); }

template <typename T>
void first_pass_k(int k, const T* src, T* dst, int64_t nvec, T scale, bool last) {
  switch (k) {
    case 0: first_pass<T, 0>(src, dst, nvec, scale, last); break;
    case 1: first_pass<T, 1>(src, dst, nvec, scale, last); break;
    case 2: first_pass<T, 2>(src, dst, nvec, scale, last); break;
    case 3: first_pass<T, 3>(src, dst, nvec, scale, last); break;
    default:
      if constexpr (kFwhtMaxK >= 4) first_pass<T, 4>(src, dst, nvec, scale, last);
      break;
  }
}

template <typename T>
void stride_pass_k(int k, T* x, int64_t nvec, int64_t h, T scale, bool last) {
  switch (k) {
    case 1: stride_pass<T, 1>(x, nvec, h, scale, last); break;
    case 2: stride_pass<T, 2>(x, nvec, h, scale, last); break;
    case 3: stride_pass<T, 3>(x, nvec, h, scale, last); break;
    default:
      if constexpr (kFwhtMaxK >= 4) stride_pass<T, 4>(x, nvec, h, scale, last);
      break;
  }
}

// Stages of spans h0 .. row/2 (in vectors) on x[0 : total vectors), rows of `row` vectors
// one after the other, in passes of at most kFwhtMaxK stages, the remainder spread so
// that no pass is much shorter than the others.
template <typename T>
void stride_passes(T* x, int64_t total, int64_t row, int64_t h0, T scale, bool last) {
  int left = ilog2(row) - ilog2(h0);
  int64_t h = h0;
  while (left > 0) {
    const int passes = (left + kFwhtMaxK - 1) / kFwhtMaxK;
    const int k = (left + passes - 1) / passes;
    stride_pass_k<T>(k, x, total, h, scale, last && k == left);
    h <<= k;
    left -= k;
  }
}

// All stages of total / row consecutive rows of `row` vectors each, pass by pass over all
// of them (so that short rows share one loop instead of paying its set-up per row).
template <typename T>
void fwht_rows_in_cache(const T* src, T* dst, int64_t total, int64_t row, T scale) {
  const int k0 = std::min(kFwhtMaxK, ilog2(row));
  const bool done = (int64_t(1) << k0) == row;
  first_pass_k<T>(k0, src, dst, total, scale, done);
  if (!done) stride_passes<T>(dst, total, row, int64_t(1) << k0, scale, true);
}

template <typename T>
void fwht_row_vector(const T* src, T* dst, int64_t d, T scale) {
  constexpr int L = FwhtVec<T>::lanes;
  const int64_t nvec = d / L;
  const int64_t block = block_elems<T>() / L;  // in vectors
  if (nvec <= block) {
    fwht_rows_in_cache<T>(src, dst, nvec, nvec, scale);
    return;
  }
  // A row larger than the L1 block: its first stages block by block, then the stages
  // that span blocks over the whole row.
  const int k0 = std::min(kFwhtMaxK, ilog2(block));
  for (int64_t b = 0; b < nvec; b += block) {
    first_pass_k<T>(k0, src + b * L, dst + b * L, block, scale, false);
    stride_passes<T>(dst + b * L, block, block, int64_t(1) << k0, scale, false);
  }
  stride_passes<T>(dst, nvec, nvec, block, scale, true);
}

// rows consecutive rows of d (>= lanes) elements.
template <typename T>
void fwht_rows_vector(const T* src, T* dst, int64_t rows, int64_t d, T scale) {
  constexpr int L = FwhtVec<T>::lanes;
  const int64_t nvec = d / L;
  if (d > block_elems<T>()) {
    for (int64_t r = 0; r < rows; ++r) fwht_row_vector<T>(src + r * d, dst + r * d, d, scale);
    return;
  }
  const int64_t chunk = block_elems<T>() / d;  // rows per L1 block
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    fwht_rows_in_cache<T>(src + r * d, dst + r * d, n * nvec, nvec, scale);
  }
}
#endif  // vector path

template <typename T>
inline void fwht_row(const T* src, T* dst, int64_t d, T scale) {
#ifdef NNK_FWHT_VECTOR
  if (d >= FwhtVec<T>::lanes) {
    fwht_row_vector<T>(src, dst, d, scale);
    return;
  }
#endif
  fwht_row_portable<T>(src, dst, d, scale);
}

template <typename T>
void fwht_rows(const T* src, T* dst, int64_t rows, int64_t d, T scale) {
  // A task of >= 2^17 elements (512 KiB of float32, about 50 microseconds on one core):
  // below that, waking a second thread costs more than it saves, and on a loaded machine
  // a barrier that waits for a descheduled thread costs a whole time slice.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 17) / d);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
#ifdef NNK_FWHT_VECTOR
    if (d >= FwhtVec<T>::lanes) {
      fwht_rows_vector<T>(src + begin * d, dst + begin * d, end - begin, d, scale);
      return;
    }
#endif
    for (int64_t r = begin; r < end; ++r) fwht_row(src + r * d, dst + r * d, d, scale);
  });
}

}  // namespace

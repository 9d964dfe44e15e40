// CPU kernels of chapter 5 (chapters/05_lookupffn.ipynb): the fused LookupFFN inference
// kernel (code + weight + gather-accumulate), and the extension module that also holds the
// fast Walsh-Hadamard transform of hadamard_cpu.cpp (row kernels in fwht.h).
//
// Built on first use (or at install time) by kernels/_ext.py with
// torch.utils.cpp_extension.load; the Python wrappers in kernels/hadamard.py and
// kernels/lookup/ validate every argument with messages that name it. The entry points
// below check again (NNK_ARG: shapes, dtypes, contiguity, sizes >= 1; a few integer
// compares per call, always on), so that a direct call with bad arguments raises a
// RuntimeError instead of reading out of bounds. Inner loops check their indices only
// in debug builds (-DNNK_DEBUG, NN_KERNELS_EXT_DEBUG=1 in kernels/_ext.py): NNK_ASSERT.
//
// Parallelism: at::parallel_for over rows / tokens (OpenMP in torch's CPU builds), so
// torch.set_num_threads controls it. Vectorisation: the compiler's, with -O3 and
// -march=native (the extension is built on the machine that runs it); the inner loops
// are written so that they vectorise (contiguous, no aliasing between src and dst).
// The fused LookupFFN's hot loops pick their instruction set when the module is built:
// AVX-512 (hash: a 6-token x 64-output GEMM micro-kernel; gather: 128 output columns per
// pass, partial sums in registers), else AVX2 + F16C + FMA (rows added 8 lanes at a time),
// else scalar loops; float64 always takes the portable loops. Because the build uses
// -march=native and kernels/_ext.py names the module after the CPU's model and flags, each
// CPU gets the widest path it supports (a dispatch per machine at build time, not per call).

#include "fwht.h"


namespace {

// tables: (h, 2^tau, d) with h, d >= 1 and 1 <= tau <= 40; returns tau.
inline int64_t check_tables(const torch::Tensor& tables) {
  check_float_cpu(tables, "tables", 3);
  const int64_t h = tables.size(0), rows = tables.size(1), d = tables.size(2);
  NNK_ARG(h >= 1 && d >= 1, "tables must have h >= 1 tables of d_out >= 1 columns, got (",
          h, ", ", rows, ", ", d, ")");
  NNK_ARG(rows >= 2 && power_of_two(rows) && rows <= (int64_t(1) << 40),
          "tables must have 2^tau rows with 1 <= tau <= 40, got ", rows);
  int64_t tau = 0;
  while ((int64_t(1) << tau) < rows) ++tau;
  return tau;
}

// ---------------------------------------------------------------- fused LookupFFN
// For each token t and table k (eqs. 12-14 and 20 of Zeng et al., 2023):
//   code_k   = sum_j [z_kj > 0] 2^j                          (decimal(sign z_k))
//   weight_k = prod_j sigma(2 |z_kj|)                          (eq. 13, top numerator over
//                                                               the eq. 11 denominator)
//            * sum_j |z_kj|         if scaled                  (eq. 20: <z_k, S_code>)
//   y_t      = sum_k weight_k T_k[code_k]
// Per tile of tokens: the codes and weights of every token of the tile first (so that
// all the rows the tile will read are known), then the gather-accumulate token by token:
// the h rows of a token are added into its output row four at a time, the partial sums
// held in registers (one load and one store of the output per four rows), while the rows
// kPrefetchRows ahead in the tile's (token, table) order -- across token boundaries --
// are prefetched whole. Nothing of size (tokens, h, d) is formed.
//
// Why four rows and a prefetch distance in rows: each row is d_out contiguous entries
// (1 KiB for fp16, d_out = 512) at a random place in h * 2^tau * d_out entries (64 MiB at
// (256, 8, 64) fp16, twice the L3), so the gather is a stream of independent 1 KiB reads;
// the hardware prefetcher follows a row once it has started, but only software prefetch
// can start the next rows' misses early enough to keep the memory system busy.

}  // namespace
#include <immintrin.h>  // here rather than at the top: only the gather section uses it

namespace {

#ifndef PREFETCH_DIST
#define PREFETCH_DIST 16
#endif
#ifndef PREFETCH_HINT
#define PREFETCH_HINT 3
#endif
constexpr int64_t kPrefetchRows = PREFETCH_DIST;

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, PREFETCH_HINT);
}

// ------------------------------------------------ table storage (float32/64, fp16, bf16)
// With float32 z / x / y the tables may be stored in 16 bits: each entry is widened to
// float32 as it is read and multiplied-accumulated in float32, so the only change is that
// the gather -- bound by memory bandwidth for large tables -- streams half the bytes.
// The entries are read as raw 16-bit patterns: float16 is widened by F16C's vcvtph2ps,
// bfloat16 (the high half of a float32) by a 16-bit shift. Each storage is a traits type:
// S (the entry), widen (one entry), and for float compute the 16- and 8-lane loads.

struct RowsF64 {
  using S = double;
  static double widen(double v) { return v; }
};

struct RowsF32 {
  using S = float;
  static float widen(float v) { return v; }
#if defined(__AVX512F__)
  static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
#endif
#if defined(__AVX2__)
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
#endif
};

struct RowsF16 {
  using S = uint16_t;
  static float widen(uint16_t v) { return c10::detail::fp16_ieee_to_fp32_value(v); }
#if defined(__AVX512F__)
  static __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
#endif
};

struct RowsBF16 {
  using S = uint16_t;
  static float widen(uint16_t v) {
    const uint32_t u = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
#if defined(__AVX512F__)
  static __m512 load16(const uint16_t* p) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
#endif
#if defined(__AVX2__)
  static __m256 load8(const uint16_t* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
#endif
};

// int8 tables (symmetric, one float32 scale per row: entry = scale * q): the entries are
// widened by sign extension and an int -> float conversion; the row's scale is folded into
// the row's weight before the gather (ScaledTables below), so the gather's inner loop is
// the same FMA as for the other storages, on a quarter of float32's bytes.
struct RowsI8 {
  using S = int8_t;
  static float widen(int8_t v) { return float(v); }
#if defined(__AVX512F__)
  static __m512 load16(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
#endif
#if defined(__AVX2__)
  static __m256 load8(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
#endif
};

// y[0:d] (= 0 when `first`) += w[0] rows[0] + ... + w[NK-1] rows[NK-1], the products added
// one after the other in that order (the order of a row-by-row loop, so the result does
// not depend on NK), the partial sums in registers.
template <typename T, typename R, int NK>
inline void add_rows(T* __restrict y, const typename R::S* const* rows, const T* w, int64_t d,
                     bool first) {
  int64_t c = 0;
  if constexpr (std::is_same<T, float>::value) {
#if defined(__AVX512F__)
    __m512 wv[NK];
#pragma GCC unroll 4
    for (int i = 0; i < NK; ++i) wv[i] = _mm512_set1_ps(w[i]);
    for (; c + 16 <= d; c += 16) {
      __m512 a = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + c);
#pragma GCC unroll 4
      for (int i = 0; i < NK; ++i) a = _mm512_fmadd_ps(wv[i], R::load16(rows[i] + c), a);
      _mm512_storeu_ps(y + c, a);
    }
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    __m256 wv[NK];
#pragma GCC unroll 4
    for (int i = 0; i < NK; ++i) wv[i] = _mm256_set1_ps(w[i]);
    for (; c + 8 <= d; c += 8) {
      __m256 a = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + c);
#pragma GCC unroll 4
      for (int i = 0; i < NK; ++i) a = _mm256_fmadd_ps(wv[i], R::load8(rows[i] + c), a);
      _mm256_storeu_ps(y + c, a);
    }
#endif
  }
  // scalar path (float64, other CPUs, and the last d % lanes columns)
  for (; c < d; ++c) {
    T a = first ? T(0) : y[c];
#pragma GCC unroll 4
    for (int i = 0; i < NK; ++i) a += w[i] * T(R::widen(rows[i][c]));
    y[c] = a;
  }
}

// The gather-accumulate of a tile of ntok tokens:
//   y[t, 0:d] = sum_k weights[t h + k] tables[offsets[t h + k] : + d],
// offsets in entries (row starts), weights and y of the compute type T.
template <typename T, typename R>
void accumulate_tile(const typename R::S* __restrict tables, const int64_t* __restrict offsets,
                     const T* __restrict weights, int64_t ntok, int64_t h, int64_t d,
                     T* __restrict y) {
  using S = typename R::S;
  const int64_t total = ntok * h, row_bytes = d * int64_t(sizeof(S));
  for (int64_t p = 0; p < std::min(kPrefetchRows, total); ++p)
    prefetch_bytes(tables + offsets[p], row_bytes);
  for (int64_t t = 0; t < ntok; ++t) {
    T* __restrict yt = y + t * d;
    for (int64_t k = 0; k < h; k += 4) {
      const int64_t p0 = t * h + k, nk = std::min<int64_t>(4, h - k);
      for (int64_t p = p0 + kPrefetchRows; p < std::min(p0 + nk + kPrefetchRows, total); ++p)
        prefetch_bytes(tables + offsets[p], row_bytes);
      NNK_ASSERT(offsets[p0] >= 0, "negative row offset ", offsets[p0], " for table ", k);
      const S* rows[4] = {tables + offsets[p0], nullptr, nullptr, nullptr};
      for (int64_t i = 1; i < nk; ++i) rows[i] = tables + offsets[p0 + i];
      const T* w = weights + p0;
      switch (nk) {
        case 4: add_rows<T, R, 4>(yt, rows, w, d, k == 0); break;
        case 3: add_rows<T, R, 3>(yt, rows, w, d, k == 0); break;
        case 2: add_rows<T, R, 2>(yt, rows, w, d, k == 0); break;
        default: add_rows<T, R, 1>(yt, rows, w, d, k == 0); break;
      }
    }
  }
}

#if defined(__AVX512F__)
#ifndef GATHER_COLUMNS
#define GATHER_COLUMNS 128
#endif
#ifndef GATHER_PREFETCH
#define GATHER_PREFETCH 64
#endif
#ifndef GATHER_PREFETCH_HINT
#define GATHER_PREFETCH_HINT 2
#endif
// Columns per pass of the column-blocked gather (a multiple of 16), and its prefetch
// distance in (token, table) pairs.
constexpr int kGatherColumns = GATHER_COLUMNS;
#ifndef GATHER_BY_COLUMNS
#define GATHER_BY_COLUMNS 1
#endif
constexpr bool kGatherByColumns = GATHER_BY_COLUMNS;
constexpr int64_t kGatherPrefetch = GATHER_PREFETCH;

// The gather of ntok tokens, column block by column block (float compute, AVX-512):
// y[t, c0 : c0 + 16 CV] = sum_k weights[t h + k] tables[offsets[t h + k] + c0 : + 16 CV]
// for every t, the CV partial-sum vectors in registers for the whole sum over k (no
// loads or stores of y inside it), the products added in the order k = 0, 1, ...
//
// Why by column blocks: a pass over all tokens reads only columns [c0, c0 + 16 CV) of
// every table row -- a slice of h 2^tau 16 CV entries (16 MiB at (256, 8), fp16, 128
// columns) that stays in the L3 for the whole pass, whereas the whole tables (64 MiB) do
// not: each table entry the tokens of one pass touch comes from memory about once, and
// every later token that reads the same row reads it from the L3 -- in principle. Measured
// (32768 tokens, (256, 8, 64), fp16, 1 thread, machine load ~3, CPU-time minima of 5):
// 128 columns with prefetch 16 pairs ahead into L1: 346 ms, 48 ahead: 291 ms, 64 ahead into
// L2 (prefetcht1): 247 ms (96 and 128 ahead the same); 64 columns 516 ms; the row-by-row
// gather (accumulate_tile, y in L1) 341-364 ms in the same run. With every row in the L2
// (codes % 4) the 128-column gather takes ~175-210 ms: the rest is waiting for rows. Transparent huge pages for the tables changed nothing
// (311 against 321 ms): not TLB misses.
// Tried (Zen 5 EPYC, 1 thread pinned, load 1.1-1.8, medians of 5 interleaved runs,
// 32768 tokens, (256, 8, 64); each variant a -D build of this file; base fp16 gather
// 246-253 ms, in L2 209-216 ms): every variant below gave bit-identical outputs, none a
// faster gather from memory, so none is kept.
//  * fewer prefetches per 256-byte row chunk (the first 1 / 2 / 3 of its 4 lines): in
//    L2 198 / 203 / 199 ms, from memory 627-664 / 618 / 555 ms -- every line must be
//    prefetched (no hardware prefetcher covers the rest of a chunk in time);
//  * hint: prefetcht0 / prefetcht2 / prefetchnta at 64 pairs: 294 / 251 / 292 ms;
//  * k loop unrolled by 2: 265 against 272 ms (noise); the loop is already one
//    vcvtph2ps with a memory operand + one FMA per 16 columns into 8 register
//    accumulators, no spills (objdump);
//  * bfloat16 as 32 entries per zmm, even columns v << 16, odd v & 0xFFFF0000, two
//    accumulator sets interleaved per token (exact): from memory 257-276 against
//    248-280 ms, in L2 265 against 219 ms -- slower, not kept;
//  * 256 columns per pass (16 accumulators): in L2 184 against 215 ms, but from memory
//    411-414 ms (prefetch 16 / 32 / 64 pairs ahead: 443 / 426 / 412 ms), presumably
//    because the 32 MiB slice no longer stays in the L3;
//  * super-tiles of 2016 / 4032 tokens (more reuse of the slice per pass): gather
//    266 / 286 against 281 ms (noise; the fused kernel not faster either).
// At (128, 8, 64): fp16 gather 97 ms (in L2 80), the bfloat16 variant 113 against 101 ms,
// 256 columns 133 ms.
// So the gather from memory is bound by getting rows into the L2 in time, not by its
// instructions; the in-L2 time (~210 ms) is the floor the 128-column layout allows.
// (Note: "in L2" there is codes % 4, whose rows lie 256 KiB apart in the tables -- the
// same L2 sets -- so most of them come from the L3 after all. From the L1 the loop runs
// at ~7 cycles per 128-column step (8 vcvtph2ps + 8 FMAs), ~57 ms for the whole gather.)
// Also tried (same machine, 1 thread pinned to CPU 1, interleaved runs against the same
// build without the change; fused fp16 ~455-475 ms, gather ~255-265 ms): none of these
// faster, none kept (all gave the same sums, in the same order, as the code below).
//  * table-major order (for each table, every token of the super-tile; partial sums in
//    a contiguous buffer, the next table's 64 KiB slice prefetched during this one):
//    gather 511 against 275 ms (480 tokens, 128 columns); 1920 tokens, 64 columns: 380.
//    Every step then reads and writes its token's partial sums from the L2.
//  * two tokens per pass of the k loop (16 accumulators, two rows in flight per table):
//    360 against 258 ms (the second token's first rows come too late for the prefetch).
//  * column blocks in alternating order from super-tile to super-tile (the first pass
//    starting on the slice the last one left in the L3): no difference (+-5 ms).
//  * the gather of super-tile s - 1 interleaved with the hash of super-tile s, in pieces
//    of 16 / 64 / 256 tables per token after every register block of the block product
//    (partial sums stored in y between pieces): fused 522 / 511 / 472 against 475 ms.
//  * the same with the block product's inner loop prefetching the rows (1 or 2 lines per
//    iteration) and whole token blocks gathered between its register blocks once their
//    rows were 512 pairs ahead: fused 770 ms -- the gather from the L2 took longer than
//    from memory (336 against ~240 ms in the profile) and the block product 55 ms more:
//    the two compete for the same L2 and miss buffers instead of overlapping.
template <typename R, int CV>
void gather_column_block(const typename R::S* __restrict tables,
                         const int64_t* __restrict offsets, const float* __restrict weights,
                         int64_t ntok, int64_t h, int64_t d, int64_t c0, float* __restrict y) {
  using S = typename R::S;
  constexpr int64_t bytes = 16 * CV * int64_t(sizeof(S));
  auto prefetch_bytes = [](const void* p, int64_t n) {
    const char* c = static_cast<const char*>(p);
    for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(c + off, 0, GATHER_PREFETCH_HINT);
  };
  const int64_t total = ntok * h;
  for (int64_t p = 0; p < std::min(kGatherPrefetch, total); ++p)
    prefetch_bytes(tables + offsets[p] + c0, bytes);
  for (int64_t t = 0; t < ntok; ++t) {
    __m512 acc[CV];
#pragma GCC unroll 16
    for (int v = 0; v < CV; ++v) acc[v] = _mm512_setzero_ps();
    const int64_t* __restrict off = offsets + t * h;
    const float* __restrict w = weights + t * h;
    const int64_t ahead = std::min(h, total - t * h - kGatherPrefetch);
    for (int64_t k = 0; k < h; ++k) {
      if (k < ahead) prefetch_bytes(tables + off[k + kGatherPrefetch] + c0, bytes);
      NNK_ASSERT(off[k] >= 0, "negative row offset ", off[k], " for table ", k);
      const S* __restrict row = tables + off[k] + c0;
      const __m512 wv = _mm512_set1_ps(w[k]);
#pragma GCC unroll 16
      for (int v = 0; v < CV; ++v) acc[v] = _mm512_fmadd_ps(wv, R::load16(row + 16 * v), acc[v]);
    }
#pragma GCC unroll 16
    for (int v = 0; v < CV; ++v) _mm512_storeu_ps(y + t * d + c0 + 16 * v, acc[v]);
  }
}

#ifndef GATHER_COLUMNS_I8
#define GATHER_COLUMNS_I8 256
#endif
// Columns per pass by storage: int8 rows are a quarter of float32's bytes, so a pass can
// cover twice fp16's columns (16 accumulators of 32 registers) for the same slice of the
// tables in the L3 and half the passes over the (token, table) pairs.
// Measured (session 8, 32768 tokens, (256, 8, 64), 1 thread pinned to CPU 1, minima of 3,
// fused fp16 458-482 ms in the same runs): int8 with 128 columns per pass 467-475 ms -- no
// faster than fp16, although it reads half the bytes: each pass over the pairs waits for its
// rows about as long whatever their width, so what counts is the number of passes; with
// 256 columns 325-337 ms. Prefetch 32 / 64 / 128 pairs ahead: 335-342 / 338-341 / 333 ms.
// The committed benchmark: fused int8 341 ms, gather 153 ms (in the L2 108 ms), against
// fp16 469 / 281 / 159 ms.
template <typename R>
constexpr int gather_columns_of() {
  return std::is_same<R, RowsI8>::value ? GATHER_COLUMNS_I8 : kGatherColumns;
}

template <typename R>
void gather_columns(const typename R::S* tables, const int64_t* offsets, const float* weights,
                    int64_t ntok, int64_t h, int64_t d, float* y) {
  constexpr int cols = gather_columns_of<R>();
  static_assert(cols % 16 == 0 && cols >= 16 && cols <= 256,
                "GATHER_COLUMNS(_I8) must be 16, 32, .., 256");
  int64_t c0 = 0;
  for (; c0 + cols <= d; c0 += cols)
    gather_column_block<R, cols / 16>(tables, offsets, weights, ntok, h, d, c0, y);
  if constexpr (cols > 128)
    for (; c0 + 128 <= d; c0 += 128)
      gather_column_block<R, 8>(tables, offsets, weights, ntok, h, d, c0, y);
  for (; c0 + 16 <= d; c0 += 16)
    gather_column_block<R, 1>(tables, offsets, weights, ntok, h, d, c0, y);
  if (c0 < d) {  // the last d % 16 columns
    for (int64_t t = 0; t < ntok; ++t)
      for (int64_t c = c0; c < d; ++c) {
        float a = 0.0f;
        for (int64_t k = 0; k < h; ++k)
          a += weights[t * h + k] * R::widen(tables[offsets[t * h + k] + c]);
        y[t * d + c] = a;
      }
  }
}
#endif  // __AVX512F__

// The kinds of table storage as one callable: acc(offsets, weights, ntok, h, d, y), the
// gather of ntok tokens (column-blocked with AVX-512 and float compute, else token by
// token with rows added four at a time).
template <typename T, typename R>
struct Tables {
  const typename R::S* tables;
  void operator()(const int64_t* offsets, const T* weights, int64_t ntok, int64_t h, int64_t d,
                  T* y) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same<T, float>::value && kGatherByColumns) {
      gather_columns<R>(tables, offsets, weights, ntok, h, d, y);
      return;
    }
#endif
    accumulate_tile<T, R>(tables, offsets, weights, ntok, h, d, y);
  }
};

// int8 tables: acc as Tables, with each weight first multiplied by the scale of the row it
// reads (scales: (h, 2^tau) float32, row r = offset / d). The row index is recovered from
// the offset in floating point: offsets are exact multiples of d below 2^53, so
// offset * (1 / d) is within 2^-17 of the integer row and rounding gives it exactly.
// The folded weights live in a per-thread buffer of ntok * h floats.
struct ScaledTables {
  Tables<float, RowsI8> rows;
  const float* scales;
  int64_t n_rows;  // h 2^tau, for the debug check
  void operator()(const int64_t* offsets, const float* weights, int64_t ntok, int64_t h,
                  int64_t d, float* y) const {
    thread_local std::vector<float> folded;
    const int64_t total = ntok * h;
    if (int64_t(folded.size()) < total) folded.resize(total);
    float* __restrict w = folded.data();
    const double inv_d = 1.0 / double(d);
    for (int64_t p = 0; p < total; ++p) {
      const int64_t r = int64_t(double(offsets[p]) * inv_d + 0.5);
      NNK_ASSERT(r >= 0 && r < n_rows && r * d == offsets[p], "row ", r, " of offset ",
                 offsets[p], " outside the ", n_rows, " scales");
      w[p] = weights[p] * scales[r];
    }
    rows(offsets, w, ntok, h, d, y);
  }
};

// tables: (h, 2^tau, d) contiguous on the CPU, of the compute dtype (float32/float64) or,
// for float32 compute, float16 / bfloat16; returns tau.
inline int64_t check_lookup_tables(const torch::Tensor& tables, torch::ScalarType compute,
                                   const c10::optional<torch::Tensor>& scales = c10::nullopt) {
  const auto st = tables.scalar_type();
  if (st == torch::kChar) {
    NNK_ARG(scales.has_value() && scales->defined(), "int8 tables need their scales");
  } else {
    NNK_ARG(!(scales.has_value() && scales->defined()),
            "scales are only for int8 tables, got ", st, " tables");
  }
  if (st == torch::kHalf || st == torch::kBFloat16 || st == torch::kChar) {
    NNK_ARG(compute == torch::kFloat, "float16 / bfloat16 / int8 tables need float32 inputs, got ",
            compute);
    NNK_ARG(tables.device().is_cpu(), "tables must be a CPU tensor");
    NNK_ARG(tables.is_contiguous(), "tables must be contiguous");
    NNK_ARG(tables.dim() == 3, "tables must have 3 dimensions, got ", tables.dim());
    const int64_t h = tables.size(0), rows = tables.size(1), d = tables.size(2);
    NNK_ARG(h >= 1 && d >= 1, "tables must have h >= 1 tables of d_out >= 1 columns, got (",
            h, ", ", rows, ", ", d, ")");
    NNK_ARG(rows >= 2 && power_of_two(rows) && rows <= (int64_t(1) << 40),
            "tables must have 2^tau rows with 1 <= tau <= 40, got ", rows);
    int64_t tau = 0;
    while ((int64_t(1) << tau) < rows) ++tau;
    if (st == torch::kChar) {
      const torch::Tensor& s = *scales;
      NNK_ARG(s.device().is_cpu() && s.scalar_type() == torch::kFloat && s.is_contiguous() &&
                  s.dim() == 2 && s.size(0) == h && s.size(1) == rows,
              "scales must be a contiguous CPU float32 tensor of shape (", h, ", ", rows,
              "), got ", s.scalar_type(), " of shape ", s.sizes());
    }
    return tau;
  }
  const int64_t tau = check_tables(tables);
  NNK_ARG(st == compute, "the inputs and float tables must share one dtype, got ", compute,
          " and ", st);
  return tau;
}

// Calls fn(T(), acc) with T the compute type and acc the accumulator of the tables'
// storage (the dtypes were checked by check_lookup_tables).
template <typename Fn>
void dispatch_tables(const torch::Tensor& tables, torch::ScalarType compute, Fn&& fn,
                     const c10::optional<torch::Tensor>& scales = c10::nullopt) {
  switch (tables.scalar_type()) {
    case torch::kChar:
      fn(float(), ScaledTables{Tables<float, RowsI8>{tables.data_ptr<int8_t>()},
                               scales->data_ptr<float>(), tables.size(0) * tables.size(1)});
      break;
    case torch::kHalf:
      fn(float(), Tables<float, RowsF16>{
                      reinterpret_cast<const uint16_t*>(tables.data_ptr<at::Half>())});
      break;
    case torch::kBFloat16:
      fn(float(), Tables<float, RowsBF16>{
                      reinterpret_cast<const uint16_t*>(tables.data_ptr<at::BFloat16>())});
      break;
    case torch::kFloat:
      fn(float(), Tables<float, RowsF32>{tables.data_ptr<float>()});
      break;
    default:
      NNK_ARG(compute == torch::kDouble && tables.scalar_type() == torch::kDouble,
              "unsupported tables dtype ", tables.scalar_type());
      fn(double(), Tables<double, RowsF64>{tables.data_ptr<double>()});
  }
}

#ifndef NNK_FAST_EXP
#define NNK_FAST_EXP 1
#endif
#if defined(__AVX512F__)
// 1 + exp(-2 |z|) for 16 floats, inline: exp(v) = 2^n exp(r) with n = round(v / ln 2),
// r = v - n ln 2 (ln 2 in two parts, so r is exact to ~1e-10), exp(r) by its Taylor
// polynomial of degree 6 on |r| <= ln(2)/2 (truncation below 1.2e-7, about 1-2 ulp), 2^n by
// vscalefps; v clamped at -87 (where 1 + exp(v) is 1 in float32). Replaces glibc's vector
// expf (libmvec, a call per 16 values): the weights differ from it by a few ulp.
inline __m512 one_plus_exp_neg2abs(__m512 z) {
  const __m512 v = _mm512_max_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f), _mm512_abs_ps(z)),
                                 _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_scalef_ps(p, n));
}
#endif

// zt[j h + k] = z[k tau + j]: the token's h x tau soft codes transposed, so that the loops
// below run over tables (vector lanes) with the tau features of a table one after another.
template <typename T>
inline void transpose_features(const T* __restrict z, T* __restrict zt, int64_t h, int64_t tau) {
  for (int64_t k = 0; k < h; ++k)
    for (int64_t j = 0; j < tau; ++j) zt[j * h + k] = z[k * tau + j];
}

#if defined(__AVX512F__)
// token_codes_weights for tau = 8 and float, 16 tables (8 vectors of soft codes) at a time
// in registers: three rounds of two-source lane permutes, each swapping one bit of the
// vector index with one bit of the lane index, leave r[j] = feature j of the 16 tables;
// then the code bits (compare masks), the product of 1 + exp(-2|z|) and the sum of |z| in
// the order j = 0, 1, .. (as the loops of token_codes_weights), one permute puts the
// tables in order. Returns the number of tables done (h rounded down to 16).
inline int64_t codes_weights_tau8(const float* __restrict z, int64_t* __restrict codes,
                                  float* __restrict weights, int64_t h, int64_t d, bool scaled) {
  // lanes p of the round-s outputs X (index bit s now 0) and Y (bit s now 1) of the
  // vector pair (A: bit s of the vector index 0, B: 1); 16 + p selects B's lane p
  struct Indices {
    alignas(64) int32_t ix[3][16], iy[3][16], order[16];
    constexpr Indices() : ix(), iy(), order() {
      for (int s = 0; s < 3; ++s)
        for (int p = 0; p < 16; ++p) {
          const int bit = 1 << s;
          ix[s][p] = (p & bit) ? 16 + (p & ~bit) : p;
          iy[s][p] = (p & bit) ? 16 + p : (p | bit);
        }
      // after the rounds lane p = 8 i3 + a holds table 2 a + i3
      for (int l = 0; l < 16; ++l) order[l] = 8 * (l & 1) + (l >> 1);
    }
  };
  static constexpr Indices idx{};
  __m512i vx[3], vy[3];
  for (int s = 0; s < 3; ++s) {
    vx[s] = _mm512_load_si512(idx.ix[s]);
    vy[s] = _mm512_load_si512(idx.iy[s]);
  }
  const __m512i vorder = _mm512_load_si512(idx.order);
  const __m512 zero = _mm512_setzero_ps();
  int64_t k0 = 0;
  for (; k0 + 16 <= h; k0 += 16) {
    __m512 r[8];
#pragma GCC unroll 8
    for (int a = 0; a < 8; ++a) r[a] = _mm512_loadu_ps(z + k0 * 8 + 16 * a);
#pragma GCC unroll 3
    for (int s = 0; s < 3; ++s) {
      const int bit = 1 << s;
#pragma GCC unroll 8
      for (int a = 0; a < 8; ++a) {
        if (a & bit) continue;
        const __m512 A = r[a], B = r[a | bit];
        r[a] = _mm512_permutex2var_ps(A, vx[s], B);
        r[a | bit] = _mm512_permutex2var_ps(A, vy[s], B);
      }
    }
    __m512 denom = _mm512_mul_ps(_mm512_set1_ps(1.0f), one_plus_exp_neg2abs(r[0]));
    __m512 sum = _mm512_add_ps(zero, _mm512_abs_ps(r[0]));
    __m512i code = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(r[0], zero, _CMP_GT_OQ),
                                          _mm512_set1_epi32(1));
#pragma GCC unroll 7
    for (int j = 1; j < 8; ++j) {
      denom = _mm512_mul_ps(denom, one_plus_exp_neg2abs(r[j]));
      sum = _mm512_add_ps(sum, _mm512_abs_ps(r[j]));
      code = _mm512_mask_or_epi32(code, _mm512_cmp_ps_mask(r[j], zero, _CMP_GT_OQ), code,
                                  _mm512_set1_epi32(1 << j));
    }
    denom = _mm512_permutexvar_ps(vorder, denom);
    sum = _mm512_permutexvar_ps(vorder, sum);
    code = _mm512_permutexvar_epi32(vorder, code);
    _mm512_storeu_ps(weights + k0, _mm512_div_ps(scaled ? sum : _mm512_set1_ps(1.0f), denom));
    alignas(64) int32_t c[16];
    _mm512_store_si512(c, code);
    for (int l = 0; l < 16; ++l) codes[k0 + l] = ((k0 + l) * 256 + c[l]) * d;
  }
  return k0;
}
#endif

// Codes (as row offsets, in entries) and weights of the h tables for one token; scratch is
// a 2 h tau buffer. The same arithmetic as the literal loop (features of a table in the
// order j = 0, 1, ..; sign bits, product of 1 + exp(-2 |z|), sum of |z|), vectorised over
// tables: with AVX-512, float and tau = 8 in registers, 16 tables at a time
// (codes_weights_tau8), else on the transposed soft codes. (Before: the same loop over k
// with the features contiguous, scalar: ~26 ms of the 220 ms hash at (256, 8, 64), 32768
// tokens; transposed through memory ~18 ms; in registers ~12 ms.)
template <typename T>
inline void token_codes_weights(const T* __restrict z, T* __restrict scratch,
                                int64_t* __restrict codes, T* __restrict weights, int64_t h,
                                int64_t tau, int64_t d, bool scaled) {
  const int64_t rows_per_table = int64_t(1) << tau;
  int64_t k0 = 0;
#if defined(__AVX512F__) && NNK_FAST_EXP
  if constexpr (std::is_same<T, float>::value)
    if (tau == 8) k0 = codes_weights_tau8(z, codes, weights, h, d, scaled);
#endif
  // the other tables (all of them but with AVX-512 at tau = 8): transposed, then loops
  z += k0 * tau, codes += k0, weights += k0;
  const int64_t hr = h - k0, ht = hr * tau;
  T* __restrict zt = scratch;
  T* __restrict expo = scratch + ht;
  transpose_features<T>(z, zt, hr, tau);
  int64_t i0 = 0;
#if defined(__AVX512F__) && NNK_FAST_EXP
  if constexpr (std::is_same<T, float>::value)
    for (; i0 + 16 <= ht; i0 += 16) _mm512_storeu_ps(expo + i0, one_plus_exp_neg2abs(_mm512_loadu_ps(zt + i0)));
#endif
#pragma omp simd
  for (int64_t i = i0; i < ht; ++i) expo[i] = T(1) + std::exp(T(-2) * std::abs(zt[i]));
  // feature by feature over all tables: the code bits in codes, the product in expo's
  // first row, the sum of |z| in weights (a loop over k inside one over j vectorises)
  T* __restrict denom = expo;
#pragma omp simd
  for (int64_t k = 0; k < hr; ++k) {
    const T v = zt[k];
    codes[k] = int64_t(v > T(0));
    denom[k] = T(1) * expo[k];
    weights[k] = T(0) + std::abs(v);
  }
  for (int64_t j = 1; j < tau; ++j) {
    const T* __restrict zj = zt + j * hr;
    const T* __restrict ej = expo + j * hr;
#pragma omp simd
    for (int64_t k = 0; k < hr; ++k) {
      const T v = zj[k];
      codes[k] |= int64_t(v > T(0)) << j;
      denom[k] *= ej[k];
      weights[k] += std::abs(v);
    }
  }
#pragma omp simd
  for (int64_t k = 0; k < hr; ++k) {
    codes[k] = ((k0 + k) * rows_per_table + codes[k]) * d;
    weights[k] = scaled ? weights[k] / denom[k] : T(1) / denom[k];
  }
#ifdef NNK_DEBUG
  codes -= k0;
  for (int64_t k = 0; k < h; ++k) {
    const int64_t code = codes[k] / d - k * rows_per_table;
    NNK_ASSERT(code >= 0 && code < rows_per_table, "code ", code, " of table ", k,
               " outside [0, ", rows_per_table, ")");
  }
#endif
}

// Tokens per tile of the fused kernels: a multiple of every register block below (2, 4,
// 6, 8, 12 tokens). 48 tokens keep the tile's activations (2 x 48 x d_pad floats, 192 KiB
// at d_pad = 512) and its soft codes (48 x h tau, 384 KiB at h tau = 2048) within the
// 1 MiB L2 while each 64 x 64 block of the projection (16 KiB, L1) is reused by 48 tokens.
constexpr int64_t kTile = 48;
#ifndef SUPER_TILE
#define SUPER_TILE 480
#endif
// Tokens whose codes are gathered together (a multiple of kTile), 1.4 MiB of offsets and
// weights at h = 256. Measured at (256, 8, 64), fp16 (load ~2.8): 480 and 2016 tokens gave
// the same gather time (289 / 291 ms), so the reuse of rows within a column pass that
// larger super-tiles would add is not what limits it; the smaller buffer is kept.
constexpr int64_t kSuperTile = SUPER_TILE;
static_assert(kSuperTile % kTile == 0, "SUPER_TILE must be a multiple of kTile");

template <typename T, typename Acc>
void lookup_tokens(const T* z, const Acc& acc, T* y, int64_t n, int64_t h, int64_t tau,
                   int64_t d, bool scaled) {
  const int64_t ht = h * tau;
  const int64_t tiles = (n + kSuperTile - 1) / kSuperTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    const int64_t cap = std::min(kSuperTile, n);
    std::vector<T> expo(2 * ht), weights(cap * h);
    std::vector<int64_t> codes(cap * h);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t t_first = tile * kSuperTile, count = std::min<int64_t>(kSuperTile, n - t_first);
      for (int64_t t = 0; t < count; ++t)
        token_codes_weights<T>(z + (t_first + t) * ht, expo.data(), codes.data() + t * h,
                               weights.data() + t * h, h, tau, d, scaled);
      acc(codes.data(), weights.data(), count, h, d, y + t_first * d);
    }
  });
}

torch::Tensor lookup_forward_cpu(const torch::Tensor& z, const torch::Tensor& tables,
                                 bool scaled, const c10::optional<torch::Tensor>& scales) {
  // z: (n, h*tau), tables: (h, 2^tau, d); both contiguous CPU; tables of z's dtype or,
  // for float32 z, float16 / bfloat16.
  check_float_cpu(z, "z", 2);
  const int64_t tau = check_lookup_tables(tables, z.scalar_type(), scales);
  const int64_t n = z.size(0), h = tables.size(0), d = tables.size(2);
  NNK_ARG(z.size(1) == h * tau, "z must have h * tau = ", h * tau, " columns, got ", z.size(1));
  auto y = empty_output({n, d}, z.scalar_type());
  if (n == 0) return y;
  dispatch_tables(tables, z.scalar_type(), [&](auto zero, const auto& acc) {
    using T = decltype(zero);
    lookup_tokens<T>(z.data_ptr<T>(), acc, y.data_ptr<T>(), n, h, tau, d, scaled);
  }, scales);
  return y;
}

// Fully fused BH-m LookupFFN inference: hash (eq. 19 projection, codes, weights) and
// gather-accumulate per tile of kTile tokens, all in per-thread buffers that stay in
// L2: nothing of size (tokens, h * tau) or (tokens, h, d) is written to memory.
//   x: (n, d_in); blocks: (m, copies, d_pad / b, b, b) with b a multiple of 16;
//   tables: (h, 2^tau, d_out); z_k comes from copy c = (k tau) / d_pad of the projection.
//
// The hash is m rounds of (block-diagonal product, FWHT) per copy. The block product is
// nearly all of its FLOP (2 d_pad b per token and round against d_pad log2 d_pad for the
// FWHT: 65536 against 4608 at d_pad = 512, b = 64), so it is written as a small GEMM
// micro-kernel: R tokens x CV vectors of outputs accumulated in registers over the b
// inputs of a block, each step one load per output vector, one broadcast per token and
// R * CV fused multiply-adds (R = 6, CV = 4 with AVX-512: 24 accumulators of 32
// registers). The FWHT of each row is the vector kernel above, on rows in L1.
// Measured (1 thread pinned to CPU 1, 32768 tokens, (256, 8, 64)): the block
// product is ~135-140 ms of the ~205 ms hash, 34.4 GFLOP at ~245-255 GFLOP/s, against a
// measured peak of 263 GFLOP/s for independent zmm FMAs on this core (2 per cycle at
// ~4.1 GHz): ~93-95 % of the FMA peak, so the rest of the hash (FWHT passes, copies,
// exp, codes) is where the time could go, not the micro-kernel. In the fused kernel the
// same product takes ~165 ms (the gather leaves the blocks and activations out of the
// caches); prefetching the next block of the same product into the L1 over this block's
// register blocks did not help (hash +3 ms, fused unchanged), the next product's blocks
// into the L2 a little (fused ~5 ms; not confirmed later, see block_matmul_vec). Also tried: the next tile's rows of x into the L2,
// 1/16 before each product (fused 421 against 413 ms, hash unchanged); super-tiles of
// 960 tokens (fused 423 against 422 ms).

// Generic register block (float64, other compilers): 4 tokens x 16 outputs.
// out[t, q b : (q+1) b] = in[t, q b : (q+1) b] @ B_q for `rows` (a multiple of 4) rows.
template <typename T>
inline void block_matmul_generic(const T* __restrict in, T* __restrict out,
                                 const T* __restrict blocks, int64_t rows, int64_t dp,
                                 int64_t b) {
  const int64_t nb = dp / b;
  for (int64_t q = 0; q < nb; ++q) {
    const T* __restrict bq = blocks + q * b * b;
    for (int64_t t0 = 0; t0 < rows; t0 += 4) {
      const T* __restrict x0 = in + t0 * dp + q * b;
      for (int64_t jc = 0; jc < b; jc += 16) {
        T acc[4][16] = {};
        for (int64_t i = 0; i < b; ++i) {
          const T* __restrict brow = bq + i * b + jc;
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            const T xv = x0[r * dp + i];
#pragma omp simd
            for (int l = 0; l < 16; ++l) acc[r][l] += xv * brow[l];
          }
        }
        for (int r = 0; r < 4; ++r)
          for (int l = 0; l < 16; ++l) out[(t0 + r) * dp + q * b + jc + l] = acc[r][l];
      }
    }
  }
}

#ifdef NNK_FWHT_VECTOR
// The same product with an R x CV register block of float vectors (rows a multiple of
// R, b a multiple of CV lanes).
// Tried: the FWHT's stages within a block applied to the accumulators before
// they are stored (adds and masked subtracts on the adder pipes). No faster (fused fp16
// 431-443 against 435-438 ms), and under -ffast-math its float32 sums differed from the
// FWHT pass's by ~1e-6: the projection then no longer equalled BHProjection.forward bit
// for bit, and projections within rounding of zero flipped their sign bits and read
// other table rows. Removed; tests/test_lookup.py checks that equality. Also tried:
// prefetching the next product's blocks into the L2 during this one: hash 188-194
// against 181-184 ms without (fused fp16 no faster); removed.
template <int R, int CV>
inline void block_matmul_vec(const float* __restrict in, float* __restrict out,
                             const float* __restrict blocks, int64_t rows, int64_t dp,
                             int64_t b) {
  using V = FwhtVec<float>::V;
  constexpr int L = FwhtVec<float>::lanes;
  const int64_t nb = dp / b;
  for (int64_t q = 0; q < nb; ++q) {
    const float* __restrict bq = blocks + q * b * b;
    for (int64_t t0 = 0; t0 < rows; t0 += R) {
      const float* __restrict x0 = in + t0 * dp + q * b;
      for (int64_t jc = 0; jc < b; jc += CV * L) {
        V acc[R][CV];
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < CV; ++v) acc[r][v] = V{};
        for (int64_t i = 0; i < b; ++i) {
          V bv[CV];
#pragma GCC unroll 4
          for (int v = 0; v < CV; ++v) bv[v] = fwht_load<float>(bq + i * b + jc + v * L);
#pragma GCC unroll 12
          for (int r = 0; r < R; ++r) {
            const float xs = x0[r * dp + i];
#pragma GCC unroll 4
            for (int v = 0; v < CV; ++v) acc[r][v] += xs * bv[v];
          }
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < CV; ++v)
            fwht_store<float>(out + (t0 + r) * dp + q * b + jc + v * L, acc[r][v]);
      }
    }
  }
}

#if defined(__AVX512F__)
constexpr int kRegBlockRows[3] = {6, 8, 12};  // for CV = 4, 2, 1 vectors of 16 lanes
#elif defined(__AVX__)
constexpr int kRegBlockRows[3] = {2, 6, 12};  // CV = 4 (never: b % 32 lanes), 2, 1 of 8
#else
constexpr int kRegBlockRows[3] = {2, 4, 8};
#endif
#endif  // NNK_FWHT_VECTOR

// The register block's token count for this dtype and block side (tiles are padded to it).
template <typename T>
inline int64_t matmul_rows(int64_t b) {
#ifdef NNK_FWHT_VECTOR
  if constexpr (std::is_same<T, float>::value) {
    constexpr int L = FwhtVec<float>::lanes;
    if (b % (4 * L) == 0) return kRegBlockRows[0];
    if (b % (2 * L) == 0) return kRegBlockRows[1];
    return kRegBlockRows[2];
  }
#endif
  (void)b;
  return 4;
}

template <typename T>
inline void block_matmul_tile(const T* in, T* out, const T* blocks, int64_t rows, int64_t dp,
                              int64_t b) {
#ifdef NNK_FWHT_VECTOR
  if constexpr (std::is_same<T, float>::value) {
    constexpr int L = FwhtVec<float>::lanes;
    if (b % (4 * L) == 0) return block_matmul_vec<kRegBlockRows[0], 4>(in, out, blocks, rows, dp, b);
    if (b % (2 * L) == 0) return block_matmul_vec<kRegBlockRows[1], 2>(in, out, blocks, rows, dp, b);
    if (b % L == 0) return block_matmul_vec<kRegBlockRows[2], 1>(in, out, blocks, rows, dp, b);
  }
#endif
  block_matmul_generic<T>(in, out, blocks, rows, dp, b);
}

// FWHT of `rows` consecutive rows of dp, src -> dst (one thread).
template <typename T>
inline void fwht_tile(const T* src, T* dst, int64_t rows, int64_t dp, T scale) {
#ifdef NNK_FWHT_VECTOR
  if (dp >= FwhtVec<T>::lanes) {
    fwht_rows_vector<T>(src, dst, rows, dp, scale);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) fwht_row<T>(src + r * dp, dst + r * dp, dp, scale);
}

// BH projection of one tile of `count` <= kTile tokens (rows of `x`, stride d_in):
// for each of `copies` copies, zero-pad to dp, then m rounds of block matmul + FWHT, and
// write the first `width` outputs of the concatenated copies to rows of `out` (stride
// out_stride). `cur`/`tmp` are kTile * dp scratch buffers; rows beyond `count` up to the
// register block are computed on zeros and not written. Shared by the fused LookupFFN
// kernel and the stand-alone projection.
template <typename T>
void bh_project_tile(const T* x, const T* blocks, T* cur, T* tmp, T* xin, T* out, int64_t count,
                     int64_t d_in, int64_t m, int64_t copies, int64_t dp, int64_t b,
                     int64_t width, int64_t out_stride, T scale) {
  const int64_t rb = matmul_rows<T>(b);
  const int64_t rows = (count + rb - 1) / rb * rb;
  NNK_ASSERT(d_in <= dp && rows <= kTile && width <= out_stride,
             "tile bounds: d_in ", d_in, " > width ", dp, " or rows ", rows, " > ", kTile);
  // Tried: the first round reading a full tile of unpadded rows of x in place (no copy):
  // the hash alone no faster, the fused kernel 0-10 ms slower (x then comes from memory
  // in the block product's scattered broadcasts instead of one streaming copy).
  // x padded once per tile into xin (read by every copy's first round).
  for (int64_t t = 0; t < count; ++t) {
    std::copy(x + t * d_in, x + (t + 1) * d_in, xin + t * dp);
    std::fill(xin + t * dp + d_in, xin + (t + 1) * dp, T(0));
  }
  std::fill(xin + count * dp, xin + rows * dp, T(0));
  for (int64_t c = 0; c < copies; ++c) {
    const int64_t lo = c * dp, hi = std::min<int64_t>(width, (c + 1) * dp);
    const T* in = xin;
    for (int64_t i = 0; i < m; ++i) {
      block_matmul_tile<T>(in, tmp, blocks + (i * copies + c) * dp * b, rows, dp, b);
      fwht_tile<T>(tmp, cur, rows, dp, scale);
      in = cur;
    }
    for (int64_t t = 0; t < count; ++t)
      std::copy(in + t * dp, in + t * dp + (hi - lo), out + t * out_stride + lo);
  }
}

// x: (n, d_in); blocks: (m, copies, dp / b, b, b) with b a positive multiple of 16, dp a
// power of two >= d_in, and copies * dp >= width (the features that are read).
inline void check_bh(const torch::Tensor& x, const torch::Tensor& blocks, int64_t width) {
  check_float_cpu(x, "x", 2);
  check_float_cpu(blocks, "blocks", 5);
  NNK_ARG(x.scalar_type() == blocks.scalar_type(), "x and blocks must share one dtype");
  const int64_t m = blocks.size(0), copies = blocks.size(1), nb = blocks.size(2);
  const int64_t b = blocks.size(3);
  NNK_ARG(m >= 1 && copies >= 1 && nb >= 1, "blocks must have m, copies and blocks >= 1");
  NNK_ARG(b >= 16 && b % 16 == 0 && blocks.size(4) == b,
          "blocks must be square with a side that is a multiple of 16, got ", b, " x ",
          blocks.size(4));
  const int64_t dp = nb * b;
  NNK_ARG(power_of_two(dp) && dp >= x.size(1), "blocks cover a width of ", dp,
          ", which must be a power of two >= the ", x.size(1), " columns of x");
  NNK_ARG(width >= 1 && copies * dp >= width, "blocks give ", copies * dp,
          " features, fewer than the ", width, " needed");
}

template <typename T, typename Acc>
void lookup_bh_tokens(const T* x, const T* blocks, const Acc& acc, T* y, int64_t n,
                      int64_t d_in, int64_t m, int64_t copies, int64_t dp, int64_t b,
                      int64_t h, int64_t tau, int64_t d, bool scaled) {
  const int64_t ht = h * tau;
  const int64_t supers = (n + kSuperTile - 1) / kSuperTile;
  const T scale = T(1) / std::sqrt(T(dp));
  at::parallel_for(0, supers, 1, [&](int64_t begin, int64_t end) {
    const int64_t cap = std::min(kSuperTile, n);
    std::vector<T> cur(kTile * dp), tmp(kTile * dp), xin(kTile * dp), z(kTile * ht);
    std::vector<T> expo(2 * ht), weights(cap * h);
    std::vector<int64_t> codes(cap * h);
    for (int64_t super = begin; super < end; ++super) {
      const int64_t s_first = super * kSuperTile;
      const int64_t s_count = std::min<int64_t>(kSuperTile, n - s_first);
      // the hash of the super-tile, kTile tokens at a time: codes and weights
      for (int64_t t0 = 0; t0 < s_count; t0 += kTile) {
        const int64_t count = std::min<int64_t>(kTile, s_count - t0);
        bh_project_tile<T>(x + (s_first + t0) * d_in, blocks, cur.data(), tmp.data(), xin.data(),
                           z.data(),
                           count, d_in, m, copies, dp, b, ht, ht, scale);
        for (int64_t t = 0; t < count; ++t)
          token_codes_weights<T>(z.data() + t * ht, expo.data(), codes.data() + (t0 + t) * h,
                                 weights.data() + (t0 + t) * h, h, tau, d, scaled);
      }
      acc(codes.data(), weights.data(), s_count, h, d, y + s_first * d);
    }
  });
}

// Sizes of a fused BH LookupFFN call, after the checks both entry points below share.
struct BHLookupShape {
  int64_t n, d_in, m, copies, b, dp, h, d;
};

inline BHLookupShape check_bh_lookup(const torch::Tensor& x, const torch::Tensor& blocks,
                                     const torch::Tensor& tables, int64_t tau,
                                     const c10::optional<torch::Tensor>& scales) {
  check_float_cpu(x, "x", 2);
  NNK_ARG(check_lookup_tables(tables, x.scalar_type(), scales) == tau,
          "tables must have 2^tau = 2^", tau, " rows");
  check_bh(x, blocks, tables.size(0) * tau);
  const int64_t b = blocks.size(3);
  return {x.size(0), x.size(1), blocks.size(0), blocks.size(1), b, blocks.size(2) * b,
          tables.size(0), tables.size(2)};
}

torch::Tensor lookup_bh_forward_cpu(const torch::Tensor& x, const torch::Tensor& blocks,
                                    const torch::Tensor& tables, int64_t tau, bool scaled,
                                    const c10::optional<torch::Tensor>& scales) {
  // tables of x's dtype or, for float32 x, float16 / bfloat16 / int8 with scales (see
  // check_lookup_tables)
  const BHLookupShape g = check_bh_lookup(x, blocks, tables, tau, scales);
  auto y = empty_output({g.n, g.d}, x.scalar_type());
  if (g.n == 0) return y;
  dispatch_tables(tables, x.scalar_type(), [&](auto zero, const auto& acc) {
    using T = decltype(zero);
    lookup_bh_tokens<T>(x.data_ptr<T>(), blocks.data_ptr<T>(), acc, y.data_ptr<T>(), g.n, g.d_in,
                        g.m, g.copies, g.dp, g.b, g.h, tau, g.d, scaled);
  }, scales);
  return y;
}

// The fused kernel without its gather (the benchmark's "hash" step: projection, codes and
// weights exactly as lookup_bh_forward_cpu computes them, same tiles and buffers): the
// gather is replaced by a sum of the weights and offsets written to the first entry of
// each super-tile's output (so that nothing is optimised away); the rest of y is left
// uninitialised. The fused time minus this time is what the gather costs inside it.
template <typename T>
struct HashOnly {
  void operator()(const int64_t* offsets, const T* weights, int64_t ntok, int64_t h, int64_t d,
                  T* y) const {
    (void)d;
    T s = T(0);
    for (int64_t i = 0; i < ntok * h; ++i) s += weights[i] + T(offsets[i] & 1);
    y[0] = s;
  }
};

torch::Tensor lookup_bh_hash_cpu(const torch::Tensor& x, const torch::Tensor& blocks,
                                 const torch::Tensor& tables, int64_t tau, bool scaled,
                                 const c10::optional<torch::Tensor>& scales) {
  const BHLookupShape g = check_bh_lookup(x, blocks, tables, tau, scales);
  auto y = empty_output({g.n, g.d}, x.scalar_type());
  if (g.n == 0) return y;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lookup_bh_hash_cpu", [&] {
    using T = scalar_t;
    lookup_bh_tokens<T>(x.data_ptr<T>(), blocks.data_ptr<T>(), HashOnly<T>{}, y.data_ptr<T>(),
                        g.n, g.d_in, g.m, g.copies, g.dp, g.b, g.h, tau, g.d, scaled);
  });
  return y;
}

// BH-m projection alone, same tiles (used to time the hash step on its own).
torch::Tensor bh_project_cpu(const torch::Tensor& x, const torch::Tensor& blocks,
                             int64_t d_out) {
  check_bh(x, blocks, d_out);
  const int64_t n = x.size(0), d_in = x.size(1);
  const int64_t m = blocks.size(0), copies = blocks.size(1), b = blocks.size(3);
  const int64_t dp = blocks.size(2) * b;
  auto z = torch::empty({n, d_out}, x.options());
  if (n == 0) return z;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bh_project_cpu", [&] {
    using T = scalar_t;
    const T* xp = x.data_ptr<T>();
    const T* bp = blocks.data_ptr<T>();
    T* zp = z.data_ptr<T>();
    const T scale = T(1) / std::sqrt(T(dp));
    const int64_t tiles = (n + kTile - 1) / kTile;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> cur(kTile * dp), tmp(kTile * dp), xin(kTile * dp);
      for (int64_t tile = begin; tile < end; ++tile) {
        const int64_t t_first = tile * kTile;
        const int64_t count = std::min<int64_t>(kTile, n - t_first);
        bh_project_tile<T>(xp + t_first * d_in, bp, cur.data(), tmp.data(), xin.data(),
                           zp + t_first * d_out,
                           count, d_in, m, copies, dp, b, d_out, d_out, scale);
      }
    });
  });
  return z;
}

// Gather only (weights given): y_t = sum_k w_tk T_k[codes_tk]; used by the benchmark to
// time the gather step on its own (Table 6's breakdown).
template <typename T, typename Acc>
void gather_tokens(const int64_t* codes, const T* weights, const Acc& acc, T* y, int64_t n,
                   int64_t h, int64_t rows_per_table, int64_t d) {
  const int64_t tiles = (n + kSuperTile - 1) / kSuperTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> offsets(std::min(kSuperTile, n) * h);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t t_first = tile * kSuperTile, count = std::min<int64_t>(kSuperTile, n - t_first);
      for (int64_t i = 0; i < count * h; ++i) {
        const int64_t code = codes[t_first * h + i], k = i % h;
        NNK_ASSERT(code >= 0 && code < rows_per_table, "code ", code, " of table ", k,
                   " outside [0, ", rows_per_table, ")");
        offsets[i] = (k * rows_per_table + code) * d;
      }
      acc(offsets.data(), weights + t_first * h, count, h, d, y + t_first * d);
    }
  });
}

void gather_cpu(const torch::Tensor& codes, const torch::Tensor& weights,
                const torch::Tensor& tables, torch::Tensor& out, const c10::optional<torch::Tensor>& scales) {
  // codes: (n, h) int64 in [0, 2^tau); weights: (n, h); tables: (h, 2^tau, d);
  // out: (n, d), written (preallocated by the caller, so that timing the gather alone
  // does not time the page faults of a fresh output).
  check_float_cpu(weights, "weights", 2);
  check_float_cpu(out, "out", 2);
  check_lookup_tables(tables, weights.scalar_type(), scales);
  const int64_t n = codes.size(0), h = tables.size(0), rows = tables.size(1),
                d = tables.size(2);
  NNK_ARG(codes.device().is_cpu() && codes.scalar_type() == torch::kLong &&
              codes.is_contiguous() && codes.dim() == 2 && codes.size(1) == h,
          "codes must be a contiguous CPU int64 tensor of shape (tokens, ", h, ")");
  NNK_ARG(weights.sizes() == codes.sizes(), "weights must have the shape of codes");
  NNK_ARG(out.size(0) == n && out.size(1) == d && out.scalar_type() == weights.scalar_type(),
          "out must have shape (", n, ", ", d, ") and the dtype of weights");
  if (n == 0) return;
  {  // codes index the tables: one pass over n * h integers, cheap next to the gather
    const int64_t* c = codes.data_ptr<int64_t>();
    bool in_range = true;
    for (int64_t i = 0; i < n * h; ++i) in_range &= (c[i] >= 0) & (c[i] < rows);
    NNK_ARG(in_range, "codes must lie in [0, ", rows, ")");
  }
  dispatch_tables(tables, weights.scalar_type(), [&](auto zero, const auto& acc) {
    using T = decltype(zero);
    gather_tokens<T>(codes.data_ptr<int64_t>(), weights.data_ptr<T>(), acc, out.data_ptr<T>(),
                     n, h, rows, d);
  }, scales);
}

}  // namespace

// The FWHT's entry points (hadamard_cpu.cpp).
void register_hadamard(pybind11::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CPU kernels of chapter 5: FWHT and the fused LookupFFN inference kernel";
  register_hadamard(m);
  m.def("lookup_forward", &lookup_forward_cpu,
        "Fused LookupFFN inference: codes, weights and gather-accumulate",
        pybind11::arg("z"), pybind11::arg("tables"), pybind11::arg("scaled"),
        pybind11::arg("scales") = pybind11::none());
  m.def("lookup_bh_forward", &lookup_bh_forward_cpu,
        "Fully fused BH-m LookupFFN inference: projection, codes, weights, gather",
        pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("tables"),
        pybind11::arg("tau"), pybind11::arg("scaled"), pybind11::arg("scales") = pybind11::none());
  m.def("lookup_bh_hash", &lookup_bh_hash_cpu,
        "lookup_bh_forward without the gather (timing only; the output is not the layer's)",
        pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("tables"),
        pybind11::arg("tau"), pybind11::arg("scaled"), pybind11::arg("scales") = pybind11::none());
  m.def("bh_project", &bh_project_cpu, "BH-m projection of the rows of x (tiles as fused)",
        pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("d_out"));
  m.def("isa", []() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    return "avx2";
#else
    return "portable";
#endif
  }, "Which of the fused kernels' hot-loop paths this build compiled (see the header)");
  m.def("debug_checks", []() {
#ifdef NNK_DEBUG
    return true;
#else
    return false;
#endif
  }, "Whether this build checks every index in its inner loops (-DNNK_DEBUG)");
  m.def("raise_error", [](const torch::Tensor& x) {
    NNK_ARG(x.dim() == 5, "a deliberate error (kernels._ext's probe): x has ", x.dim(), " dimensions");
    return x;
  }, "Raise a C++ error for x without 5 dimensions (what the entry points' checks do): "
     "kernels._ext checks once that it arrives as a RuntimeError", pybind11::arg("x"));
  m.def("gather", &gather_cpu, "Weighted gather-accumulate of table rows",
        pybind11::arg("codes"), pybind11::arg("weights"), pybind11::arg("tables"),
        pybind11::arg("out"), pybind11::arg("scales") = pybind11::none());
}

// Plumbing shared by the CPU kernels of chapter 5 (hadamard_cpu.cpp, lookup_cpu.cpp): the
// argument checks of the entry points (NNK_ARG: always on; NNK_ASSERT: inner-loop index
// checks of debug builds, -DNNK_DEBUG) and the allocator of their outputs. Header-only;
// everything has internal linkage (an anonymous namespace), one copy per source file.
#pragma once

#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>  // madvise(MADV_HUGEPAGE) for the FWHT's large outputs
#endif

#define NNK_ARG(cond, ...) TORCH_CHECK(cond, "nnk_lookup_cpu: ", __VA_ARGS__)
#ifdef NNK_DEBUG
#define NNK_ASSERT(cond, ...) TORCH_CHECK(cond, "nnk_lookup_cpu (debug bounds check): ", __VA_ARGS__)
#else
#define NNK_ASSERT(cond, ...) ((void)0)
#endif

namespace {

// Argument checks shared by the entry points (always on; see the header comment).
inline void check_float_cpu(const torch::Tensor& t, const char* name, int64_t dim) {
  NNK_ARG(t.device().is_cpu(), name, " must be a CPU tensor");
  NNK_ARG(t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble, name,
          " must be float32 or float64, got ", t.scalar_type());
  NNK_ARG(t.is_contiguous(), name, " must be contiguous");
  NNK_ARG(t.dim() == dim, name, " must have ", dim, " dimensions, got ", t.dim());
}

inline bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }


#if defined(__linux__) && defined(MADV_HUGEPAGE)
// CPU allocator for large outputs: 2 MiB-aligned buffers advised to use transparent huge
// pages. The FWHT streams its output once, so for a fresh buffer of tens of MiB the
// first-touch page faults of 4 KiB pages cost more than the transform: measured on the
// reference VM, torch.empty + fill of 64 MiB took 62 ms against 12 ms for numpy, which
// advises huge pages for its large arrays (and so do FFHT's outputs).
struct HugePageAllocator final : c10::Allocator {
  static constexpr size_t kAlign = size_t(1) << 21;
  static void release(void* p) { std::free(p); }
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes > 0) {
      const size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
      p = std::aligned_alloc(kAlign, rounded);
      TORCH_CHECK(p != nullptr, "nnk_lookup_cpu: out of memory allocating ", nbytes, " bytes");
      madvise(p, rounded, MADV_HUGEPAGE);  // advice only: ignored where THP is off
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
#endif

// An uninitialised contiguous tensor of `sizes` and `dtype`; huge-page backed from 32 MiB on
// (also the fused LookupFFN's output: 64 MiB at 32768 tokens x 512, whose 4 KiB page
// faults cost about 40 ms of a 0.5 s call).
inline torch::Tensor empty_output(c10::IntArrayRef sizes, c10::ScalarType dtype) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  size_t numel = 1;
  for (const int64_t s : sizes) numel *= size_t(s);
  const size_t nbytes = numel * c10::elementSize(dtype);
  // From 32 MiB, glibc's largest mmap threshold: every such allocation is a fresh mapping
  // (its pages faulted in on first touch), while smaller ones are reused from the heap
  // after the first call, which huge pages would only slow (measured: 8-16 MiB outputs
  // ran 1.7x slower through this allocator, 64 MiB ones 3x faster).
  if (nbytes >= (size_t(32) << 20)) {
    static HugePageAllocator allocator;
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, &allocator,
                         /*resizable=*/true);
    return torch::empty({0}, torch::dtype(dtype)).set_(std::move(storage), 0, sizes,
                                                        c10::contiguous_strides(sizes));
  }
#endif
  // at::detail::empty_cpu skips the dispatcher: about half a microsecond less per call,
  // which is a third of a short row's whole call (batch 1 in benchmarks/bench_fwht.py).
  return at::Tensor(at::detail::empty_cpu(sizes, dtype));
}

inline torch::Tensor empty_output_like(const torch::Tensor& x) {
  return empty_output(x.sizes(), x.scalar_type());
}

}  // namespace

// One CUTLASS 3 (sm90 warp-specialised, TMA + WGMMA) GEMM configuration behind a plain C entry
// point: D (m x n, row-major) = X (m x k, row-major) @ W (n x k, row-major)^T, bf16 in, fp32
// accumulation. `python -m microbench.cutlass_build` writes one .cu file per configuration of
// microbench/cutlass_configs.py that includes this header and calls CHORUS_CUTLASS_GEMM.
//
// Template knobs:
//   Swap     false: A = X, B = W (the tokens are the MMA's M side).
//            true:  C^T = W @ X^T (the weights fill the 64/128-wide M side, the tokens are N);
//                   D is then written column-major as n x m, i.e. the same row-major m x n.
//   TM TN TK the CTA tile (M, N, K) of the problem as CUTLASS sees it (after any swap).
//   CM CN    the cluster shape (TMA multicast across CTAs of a cluster).
//   Sched    0 ping-pong (two consumer warp groups on alternate tiles, persistent),
//            1 cooperative (both consumer warp groups on one 128-row tile, persistent),
//            2 cooperative with the stream-K scheduler (split-K when splits > 1, reduced in
//              the kernel through a workspace; stream-K heuristics when splits == 1),
//            3 the basic warp-specialised kernel (one consumer warp group, not persistent).
//   Epi      0 TMA store epilogue (through shared memory), 1 direct stores from registers.
//   Partials true: D is fp32 (splits, m, n), one slice of k per batch (the engine's split-K
//            layout, summed by the add + norm that follows); false: D is bf16 (m, n).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace chorus_cutlass {

using namespace cute;

template <int Sched> struct Schedules;
template <> struct Schedules<0> {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
  using Tiles = cutlass::gemm::PersistentScheduler;
};
template <> struct Schedules<1> {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Tiles = cutlass::gemm::PersistentScheduler;
};
template <> struct Schedules<2> {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Tiles = cutlass::gemm::StreamKScheduler;
};
template <> struct Schedules<3> {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecialized;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
  using Tiles = void;
};

// CUTLASS's kernel with one addition ahead of it: each CTA asks the L2 cache for its share of
// the weight matrix (bulk prefetches, no registers or shared memory) before the kernel's own
// code, which waits on the previous kernel (programmatic dependent launch) before it loads.
// A kernel launched early behind its predecessor thus streams its weights while that one
// finishes. Off (prefetch_bytes == 0) it costs one branch.
template <class Base>
struct PrefetchingKernel : Base {
  struct Params : Base::Params {
    const char* prefetch = nullptr;
    size_t prefetch_bytes = 0;
  };

  static Params to_underlying_arguments(typename Base::Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(args, workspace);
    return p;
  }

  CUTLASS_DEVICE void operator()(Params const& params, char* smem) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    if (params.prefetch_bytes && threadIdx.x < 32) {
      const size_t ctas = size_t(gridDim.x) * gridDim.y * gridDim.z;
      const size_t cta = blockIdx.x + size_t(gridDim.x) * (blockIdx.y + size_t(gridDim.y) * blockIdx.z);
      constexpr size_t piece = 4096;
      const size_t pieces = (params.prefetch_bytes + piece - 1) / piece;
      for (size_t i = cta + ctas * threadIdx.x; i < pieces; i += ctas * 32) {
        const size_t off = i * piece;
        const size_t left = params.prefetch_bytes - off;
        const uint32_t bytes = uint32_t(left < piece ? left : piece) & ~15u;
        if (bytes)
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(params.prefetch + off), "r"(bytes)
                       : "memory");
      }
    }
#endif
    Base::operator()(params, smem);
  }
};

template <bool Swap, int TM, int TN, int TK, int CM, int CN, int Sched, int Epi, bool Partials>
struct Gemm {
  using ElementIn = cutlass::bfloat16_t;
  using ElementOut = cute::conditional_t<Partials, float, cutlass::bfloat16_t>;
  using Acc = float;
  using LayoutA = cutlass::layout::RowMajor;     // X (m, k) or, swapped, W (n, k)
  using LayoutB = cutlass::layout::ColumnMajor;  // W (n, k) or, swapped, X (m, k): k contiguous
  using LayoutD = cute::conditional_t<Swap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int AlignIn = 8;
  static constexpr int AlignOut = 16 / sizeof(ElementOut);

  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
  using S = Schedules<Sched>;
  using EpiSchedule = cute::conditional_t<Epi == 1, cutlass::epilogue::NoSmemWarpSpecialized, typename S::Epi>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc,
      void, LayoutD, AlignOut,  // no C operand: D = acc
      ElementOut, LayoutD, AlignOut, EpiSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, LayoutA, AlignIn, ElementIn, LayoutB,
      AlignIn, Acc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename S::Kernel>::CollectiveOp;

  using Base = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                    CollectiveEpilogue, typename S::Tiles>;
  using Kernel = PrefetchingKernel<Base>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments arguments(const void* x, const void* w, void* d, int m, int n, int k,
                                              int splits, int sm_count) {
    // Partials: L = splits batches, each over its own k slice (strided views, nothing copied).
    const int L = Partials ? splits : 1;
    const int ks = Partials ? k / splits : k;
    const int64_t slice = Partials ? ks : 0;
    const auto* xp = static_cast<const ElementIn*>(x);
    const auto* wp = static_cast<const ElementIn*>(w);
    auto* dp = static_cast<ElementOut*>(d);
    typename Kernel::StrideA sa{};
    typename Kernel::StrideB sb{};
    typename CollectiveEpilogue::StrideD sd{};
    // A and B: (rows, k, batch) with k contiguous; both operands have row stride k.
    sa = make_stride(int64_t(k), _1{}, slice);
    sb = make_stride(int64_t(k), _1{}, slice);
    const int64_t dbatch = int64_t(m) * n;
    int pm, pn;
    const ElementIn *pa, *pb;
    if constexpr (Swap) {
      pm = n; pn = m; pa = wp; pb = xp;
      sd = make_stride(_1{}, int64_t(n), dbatch);   // column-major n x m
    } else {
      pm = m; pn = n; pa = xp; pb = wp;
      sd = make_stride(int64_t(n), _1{}, dbatch);   // row-major m x n
    }
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {pm, pn, ks, L},
        {pa, sa, pb, sb},
        {{}, nullptr, sd, dp, sd}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;
    if constexpr (Sched == 2) {
      using Decomp = typename Kernel::TileScheduler::DecompositionMode;
      if (splits > 1) {
        args.scheduler.splits = splits;
        args.scheduler.decomposition_mode = Decomp::SplitK;
      } else {
        args.scheduler.decomposition_mode = Decomp::StreamK;
      }
    }
    return args;
  }

  static int sm_count() {
    static int count = 0;
    if (count == 0) {
      int dev = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
    }
    return count;
  }

  static size_t workspace(int m, int n, int k, int splits) {
    auto args = arguments(nullptr, nullptr, nullptr, m, n, k, splits, sm_count());
    return Device::get_workspace_size(args);
  }

  // flags: bit 0 launch with programmatic dependent launch, bit 1 prefetch the weights.
  // 0 on success; 1 cannot implement; 2 workspace too small; 3 initialise failed; 4 launch failed.
  static int run(const void* x, const void* w, void* d, int m, int n, int k, int splits, void* ws,
                 size_t ws_bytes, cudaStream_t stream, int flags) {
    if (!Partials && Sched != 2 && splits != 1) return 1;
    if (Partials && (splits < 1 || k % splits)) return 1;
    auto args = arguments(x, w, d, m, n, k, splits, sm_count());
    if (Device::can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (Device::get_workspace_size(args) > ws_bytes) return 2;
    static bool attribute_set = false;  // once, before any graph capture (the first call is eager)
    if (!attribute_set) {
      const int smem = Kernel::SharedStorageSize;
      if (smem >= (48 << 10) &&
          cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem) != cudaSuccess)
        return 3;
      attribute_set = true;
    }
    if (Kernel::initialize_workspace(args, ws, stream, nullptr) != cutlass::Status::kSuccess) return 3;
    auto params = Kernel::to_underlying_arguments(args, ws);
    if (flags & 2) {
      params.prefetch = static_cast<const char*>(w);
      params.prefetch_bytes = size_t(n) * k * sizeof(ElementIn);
    }
    if (Device::run(params, stream, nullptr, (flags & 1) != 0) != cutlass::Status::kSuccess) return 4;
    return cudaGetLastError() == cudaSuccess ? 0 : 4;
  }
};

}  // namespace chorus_cutlass

#define CHORUS_CUTLASS_GEMM(NAME, ...)                                                                   \
  using NAME##_t = chorus_cutlass::Gemm<__VA_ARGS__>;                                                    \
  extern "C" size_t NAME##_workspace(int m, int n, int k, int splits) {                                  \
    return NAME##_t::workspace(m, n, k, splits);                                                         \
  }                                                                                                      \
  extern "C" int NAME##_run(const void* x, const void* w, void* d, int m, int n, int k, int splits,      \
                            void* ws, size_t ws_bytes, cudaStream_t stream, int flags) {                 \
    return NAME##_t::run(x, w, d, m, n, k, splits, ws, ws_bytes, stream, flags);                           \
  }

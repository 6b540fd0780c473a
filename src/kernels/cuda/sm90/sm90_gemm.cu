// The Hopper GEMM of sm90_gemm.hpp. A block computes `Consumers` 128x128 tiles sharing one
// operand's rows (sm90_tiles.hpp says which); layout of a block (Consumers * 128 + 32 threads):
//   threads 0 .. 128*Consumers-1   consumer warpgroups, one per tile: wgmma over the stages,
//                                  then the tile's epilogue;
//   the last warp                  the producer: one thread issues the bulk tensor copies
//                                  (and, with beta, asks the epilogue's C rows into L2 a few
//                                  slices before the last).
// Shared memory: `Stages` stages of 1 + Consumers 128x64 bf16 slices (P's rows of tile 0, Q's
// rows of tile 0, and for tile 1 the rows of the operand it does not share), each slice
// 128-byte swizzled as the tensor maps write it (and as wgmma's descriptors read it), then the
// stages' full/empty barriers. Stage s is "full" when its copies have landed (the copy engine
// counts the bytes), "empty" when every active consumer warp is done with its wgmmas. Two
// consumers load 3/4 of the bytes per FLOP that one does (a slice serves two tiles).
#include "kernels/cuda/sm90/sm90_gemm.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <climits>
#include <mutex>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/gemm_choice.hpp"
#include "kernels/cuda/sm90/sm90_epilogue.cuh"
#include "kernels/cuda/sm90/sm90_ptx.cuh"
#include "kernels/cuda/sm90/sm90_tiles.hpp"

namespace zmuon::gpu {
namespace {

using namespace sm90;

constexpr int kSlice = static_cast<int>(kSm90Slice);  // 64 bf16 = 128 bytes: the swizzle's width
constexpr int kSliceBytes = kTile * kSlice * 2;       // 16 KB
constexpr int kPrefetchSlices = 6;  // how many slices before the last the C tile is prefetched

template <int Consumers>
__host__ __device__ constexpr int threads() {
  return Consumers * kGroupThreads + 32;  // + the producer warp
}
template <int Consumers>
__host__ __device__ constexpr int stage_bytes() {
  return (1 + Consumers) * kSliceBytes;
}
/// Shared memory of a block: the stages (which the epilogue's staging reuses), the barriers and
/// alignment slack.
template <int Consumers, int Stages>
__host__ __device__ constexpr int smem_bytes() {
  constexpr int stages = Stages * stage_bytes<Consumers>();
  constexpr int staged = stages > Consumers * kStagedBytes ? stages : Consumers * kStagedBytes;
  return staged + 2 * Stages * 8 + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// Syncs the consumer warpgroups only (named barrier 1; the producer warp has left).
template <int Consumers>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(Consumers * kGroupThreads) : "memory");
}

/// Block `item`'s tiles (sm90_tiles.hpp) and the matrix they belong to.
__device__ __forceinline__ block_work work_of(const kernel_params& prm, int item, int& matrix,
                                              int consumers) {
  matrix = item / prm.blocks_per_matrix;
  return tiles_of_block(consumers, prm.symmetric != 0, prm.tiles_n, item % prm.blocks_per_matrix);
}

/// The producer's part of one work item (tiles `w` of `matrix`): its slices into the stages.
/// Slice kb goes to stage kb % Stages, in round kb / Stages.
template <int Consumers, int Stages>
__device__ __forceinline__ void produce(const CUtensorMap* map_p, const CUtensorMap* map_q,
                                        const kernel_params& prm, uint8_t* smem, uint64_t* full,
                                        uint64_t* empty, const block_work& w, int matrix) {
  // The epilogue's C rows, asked into L2 a few slices before the last, so that the epilogue
  // reads them from L2 rather than waiting on memory (the tile's last act otherwise).
  const int prefetch_at = max(0, prm.slices - kPrefetchSlices);
  for (int kb = 0; kb < prm.slices; ++kb) {
    if (kb == prefetch_at && prm.c != nullptr) {
      for (int g = 0; g < w.active; ++g) {
        const __nv_bfloat16* c = prm.c + matrix * prm.stride_c
                                 + int64_t{w.row(g)} * kTile * prm.ld_c + int64_t{w.col(g)} * kTile;
        for (int row = 0; row < kTile; ++row)
          prefetch_l2(c + row * prm.ld_c, kTile * 2);
      }
    }
    const int s = kb % Stages;
    barrier_wait(&empty[s], ((kb / Stages) & 1) ^ 1);
    barrier_expect_bytes(&full[s], (1 + w.active) * kSliceBytes);
    uint8_t* stage = smem + s * stage_bytes<Consumers>();
    for (int slot = 0; slot <= w.active; ++slot) {
      const slot_rows rows = slot_of(w, slot);
      copy_slice(stage + slot * kSliceBytes, rows.p ? map_p : map_q, &full[s], kb * kSlice,
                 rows.tile * kTile, matrix);
    }
  }
}

/// A consumer group's part of one work item: wgmma over its slices, then its tile's epilogue.
template <int Consumers, int Stages>
__device__ __forceinline__ void consume(const kernel_params& prm, uint8_t* smem, uint64_t* full,
                                        uint64_t* empty, const block_work& w, int matrix,
                                        int group) {
  constexpr int kStageBytes = stage_bytes<Consumers>();
  const bool arrives = threadIdx.x % 32 == 0;  // one arrival per warp
  // The first slice's wgmmas overwrite the accumulators (scale-d 0), so they start undefined:
  // zeroing them here would make ptxas serialize the wgmmas.
  float acc0[64];  // rows 0-63 of the tile
  float acc1[64];  // rows 64-127
  if (group < w.active) {
    const int p_at = p_slot(w, group);  // the group's slices in a stage
    const int q_at = q_slot(w, group);
    for (int kb = 0; kb < prm.slices; ++kb) {
      const int s = kb % Stages;
      barrier_wait(&full[s], (kb / Stages) & 1);
      const uint32_t stage = shared_address(smem + s * kStageBytes);
      const uint32_t p_slice = stage + p_at * kSliceBytes;
      const uint32_t q_slice = stage + q_at * kSliceBytes;
      pin(acc0);
      pin(acc1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSlice / 16; ++kk) {
        const uint64_t q = operand_descriptor(q_slice + kk * 32);
        const uint32_t accumulate = (kb > 0 || kk > 0) ? 1u : 0u;
        wgmma_m64n128(acc0, operand_descriptor(p_slice + kk * 32), q, accumulate);
        wgmma_m64n128(acc1, operand_descriptor(p_slice + 64 * 128 + kk * 32), q, accumulate);
      }
      wgmma_commit();
      pin(acc0);
      pin(acc1);
      // Keep this slice's wgmmas in flight; the previous slice's are done, so its stage is free.
      wgmma_wait<1>();
      if (kb > 0 && arrives)
        barrier_arrive(&empty[(kb - 1) % Stages]);
    }
    wgmma_wait<0>();
    pin(acc0);
    pin(acc1);
  }
  const int tile_m = w.row(group);
  const int tile_n = w.col(group);
  const bool mirror = prm.symmetric != 0 && tile_m != tile_n;
  const int t = static_cast<int>(threadIdx.x) % kGroupThreads;
  consumers_sync<Consumers>();  // every group's wgmmas have read their stages
  if (group < w.active)
    store_staged(acc0, acc1, reinterpret_cast<float*>(smem + group * kStagedBytes), prm, matrix,
                 tile_m, tile_n, mirror, group, t);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

/// A block computes work item blockIdx.x (sm90_tiles.hpp).
template <int Consumers, int Stages>
__global__ void __launch_bounds__(threads<Consumers>())
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap map_p,
                     const __grid_constant__ CUtensorMap map_q, const kernel_params prm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023)
                                             & ~static_cast<uintptr_t>(1023));
  constexpr int kBarrierOffset = smem_bytes<Consumers, Stages>() - 1024 - 2 * Stages * 8;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);
  uint64_t* empty = full + Stages;
  int matrix = 0;
  const block_work w = work_of(prm, static_cast<int>(blockIdx.x), matrix, Consumers);

  if (threadIdx.x == 0) {
    const int arrivals = 4 * w.active;
    for (int s = 0; s < Stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], arrivals);  // one arrival per (working) consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= Consumers * kGroupThreads) {
    if (threadIdx.x == Consumers * kGroupThreads)
      produce<Consumers, Stages>(&map_p, &map_q, prm, smem, full, empty, w, matrix);
    return;
  }
  const int group = static_cast<int>(threadIdx.x) / kGroupThreads;
  consume<Consumers, Stages>(prm, smem, full, empty, w, matrix, group);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found)
            == cudaSuccess
        && found == cudaDriverEntryPointSuccess)
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  if (encode == nullptr)
    throw failure(
        error(errc::device_failure, "sm90_gemm: the driver has no cuTensorMapEncodeTiled"));
  return encode;
}

/// The tensor map of `batch` [rows, k] row-major bf16 matrices, read in [box_rows, 64] swizzled
/// boxes.
CUtensorMap operand_map(const sm90_operand& op, int64_t rows, int64_t k, int64_t batch,
                        int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const int64_t stride = batch > 1 ? op.stride : rows * op.ld;
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(op.ld * 2),
                                 static_cast<cuuint64_t>(stride * 2)};
  const cuuint32_t box[3] = {kSlice, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult status = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(op.data), dims, strides,
      box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw failure(error(errc::device_failure, "sm90_gemm: cuTensorMapEncodeTiled failed (CUresult "
                                                  + std::to_string(static_cast<int>(status))
                                                  + ")"));
  return map;
}

/// The current device's multiprocessor count (cached per device).
int multiprocessors() {
  static std::atomic<int> sms_of[64] = {};
  int device = 0;
  ZMUON_CUDA_CHECK(cudaGetDevice(&device));
  int sms = sms_of[device % 64].load();
  if (sms == 0) {
    ZMUON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    sms_of[device % 64].store(sms);
  }
  return sms;
}

/// Blocks per matrix of a block shape (sm90_tiles.hpp).
int64_t blocks_per_matrix(const sm90_gemm_args& a, int consumers) {
  return sm90::blocks_per_matrix(consumers, a.symmetric, static_cast<int>(a.m / kSm90Tile),
                                 static_cast<int>(a.n / kSm90Tile));
}

template <int Consumers, int Stages>
void launch(cudaStream_t stream, const sm90_gemm_args& a, kernel_params prm) {
  constexpr auto kernel = sm90_gemm_kernel<Consumers, Stages>;
  constexpr int kSmem = smem_bytes<Consumers, Stages>();
  static_assert(kSmem <= 227 * 1024, "a Hopper block has at most 227 KB of shared memory");
  // The shared-memory limit is raised once per device (a process may drive several).
  static std::atomic<uint64_t> raised{0};
  int device = 0;
  ZMUON_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((raised.load() & bit) == 0) {
    ZMUON_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    raised.fetch_or(bit);
  }
  const CUtensorMap map_p = operand_map(a.p, a.m, a.k, a.batch, kTile);
  const CUtensorMap map_q = operand_map(a.q, a.n, a.k, a.batch, kTile);
  prm.blocks_per_matrix = static_cast<int>(blocks_per_matrix(a, Consumers));
  const int64_t blocks = prm.blocks_per_matrix * a.batch;  // tiles_fit_grid
  kernel<<<static_cast<unsigned>(blocks), threads<Consumers>(), kSmem, stream>>>(map_p, map_q, prm);
  ZMUON_LAUNCH_CHECK();
}

/// The block shape for `a`. Over k >= 2048 a two-tile block loads 3/4 of the bytes per FLOP,
/// and its tiles run about 9/7 as fast as one-tile blocks' (docs/PERFORMANCE.md). So two tiles
/// win unless they take more waves: 7 * waves(two tiles) <= 9 * waves(one tile). Over short k
/// one tile wins: one block's epilogue runs beside the other's wgmmas.
sm90_block choose_block(const sm90_gemm_args& a) {
  if (a.k < 2048)
    return sm90_block::one_tile;
  const int64_t sms = multiprocessors();
  const int64_t two = (blocks_per_matrix(a, 2) * a.batch + sms - 1) / sms;
  const int64_t one = (blocks_per_matrix(a, 1) * a.batch + 2 * sms - 1) / (2 * sms);
  return 7 * two > 9 * one ? sm90_block::one_tile : sm90_block::two_tiles;
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// Whether all matrices' tiles (so the blocks of every shape) number at most 2^31 - 1. Needs
/// whole tiles and a positive batch.
bool tiles_fit_grid(const sm90_gemm_args& a) {
  const int64_t tiles = (a.m / kSm90Tile) * (a.n / kSm90Tile);  // < 2^48
  return tiles <= INT32_MAX / a.batch;
}

/// Why `a` does not fit, or an empty string.
std::string misfit(const sm90_gemm_args& a) {
  constexpr int64_t kMaxSide = INT32_MAX;  // the tensor maps' coordinates are 32-bit
  if (a.batch <= 0 || a.m <= 0 || a.n <= 0 || a.k <= 0 || a.batch > 65535 || a.m > kMaxSide
      || a.n > kMaxSide || a.k > kMaxSide)
    return "batch in [1, 65535] and sides in [1, 2^31) needed";
  if (a.m % kSm90Tile != 0 || a.n % kSm90Tile != 0 || a.k % kSm90Slice != 0)
    return "m and n must be multiples of 128, k of 64";
  if (!tiles_fit_grid(a))
    return "more than 2^31 - 1 tiles in all (the grid's size)";
  if (a.symmetric && a.m != a.n)
    return "a symmetric product must be square";
  if (!sm90_gemm_fits(a))
    return "every operand's rows and matrices must be 16-byte aligned (ld and stride multiples "
           "of 8), with ld at least the row's length";
  return {};
}

}  // namespace

bool sm90_gemm_fits(const sm90_gemm_args& a) {
  constexpr int64_t kMaxSide = INT32_MAX;
  const bool sides = a.batch > 0 && a.m > 0 && a.n > 0 && a.k > 0 && a.m % kSm90Tile == 0
                     && a.n % kSm90Tile == 0 && a.k % kSm90Slice == 0 && a.batch <= 65535
                     && a.m <= kMaxSide && a.n <= kMaxSide && a.k <= kMaxSide && tiles_fit_grid(a);
  const bool rows = a.p.ld >= a.k && a.q.ld >= a.k && a.p.ld % 8 == 0 && a.q.ld % 8 == 0
                    && (a.batch == 1 || (a.p.stride % 8 == 0 && a.q.stride % 8 == 0))
                    && aligned(a.p.data) && aligned(a.q.data) && a.d.data != nullptr
                    && aligned(a.d.data) && a.d.ld >= a.n && a.d.ld % 8 == 0 && a.d.stride % 8 == 0;
  const bool c = a.beta == 0.0f
                 || (a.c.data != nullptr && aligned(a.c.data) && a.c.ld >= a.n && a.c.ld % 8 == 0
                     && a.c.stride % 8 == 0);
  const bool symmetric = !a.symmetric || a.m == a.n;
  return sides && rows && c && symmetric;
}

bool sm90_gemm_suits_symmetric(int64_t batch, int64_t m, int64_t k) {
  // Over k >= 2048 the kernel beats cuBLAS's whole product once the upper tiles fill a wave and
  // a half; below that cuBLAS wins, since it splits k. Over short k it wins only where the upper
  // tiles number half the multiprocessors to twice them. Figures: docs/PERFORMANCE.md.
  if (m % kSm90Tile != 0 || k % kSm90Slice != 0 || m < 768 || batch > 65535)
    return false;
  const int64_t tiles = m / kSm90Tile;
  const int64_t blocks = batch * tiles * (tiles + 1) / 2;
  const int64_t sms = multiprocessors();
  if (k >= 2048)
    return 2 * blocks >= 3 * sms;
  return 2 * blocks >= sms && blocks <= 2 * sms;
}

namespace {
std::atomic<bool> own_gemm_allowed{true};
}  // namespace

void sm90_gemm_allow(bool on) {
  own_gemm_allowed.store(on, std::memory_order_relaxed);
}

bool sm90_gemm_available() {
  if (!own_gemm_allowed.load(std::memory_order_relaxed))
    return false;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess
      || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return false;
  return symmetric_gemm_for({prop.major, prop.minor}) == symmetric_gemm::own_sm90a;
}

void sm90_gemm(cudaStream_t stream, const sm90_gemm_args& a) {
  if (const std::string why = misfit(a); !why.empty())
    throw failure(error(errc::invalid_argument,
                        "sm90_gemm: batch " + std::to_string(a.batch) + ", m " + std::to_string(a.m)
                            + ", n " + std::to_string(a.n) + ", k " + std::to_string(a.k)
                            + " not supported: " + why));
  kernel_params prm{};
  prm.tiles_n = static_cast<int>(a.n / kSm90Tile);
  prm.slices = static_cast<int>(a.k / kSm90Slice);
  prm.symmetric = a.symmetric ? 1 : 0;
  prm.alpha = a.alpha;
  prm.beta = a.beta;
  if (a.beta != 0.0f) {
    prm.c = a.c.data;
    prm.ld_c = a.c.ld;
    prm.stride_c = a.c.stride;
  }
  prm.d = a.d.data;
  prm.ld_d = a.d.ld;
  prm.stride_d = a.d.stride;
  const sm90_block shape = a.shape == sm90_block::automatic ? choose_block(a) : a.shape;
  if (shape == sm90_block::two_tiles)
    launch<2, 4>(stream, a, prm);
  else
    launch<1, 3>(stream, a, prm);
}

}  // namespace zmuon::gpu

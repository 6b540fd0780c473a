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
#include "kernels/cuda/sm90_gemm.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/sm90_tiles.hpp"

namespace zmuon::gpu {
namespace {

constexpr int kTile = static_cast<int>(kSm90Tile);
constexpr int kSlice = static_cast<int>(kSm90Slice);  // 64 bf16 = 128 bytes: the swizzle's width
constexpr int kGroupThreads = 128;                    // one consumer warpgroup
constexpr int kSliceBytes = kTile * kSlice * 2;       // 16 KB
constexpr int kStagedLd = kTile + 8;  // floats per staged epilogue row: 8 more keeps half-warps
                                      // off each other's banks when the fragments go in
constexpr int kStagedBytes = kTile * kStagedLd * 4;
constexpr int kPrefetchSlices = 6;  // how many slices before the last the C tile is prefetched

template <int Consumers>
__host__ __device__ constexpr int threads() {
  return Consumers * kGroupThreads + 32;  // + the producer warp
}
template <int Consumers>
__host__ __device__ constexpr int stage_bytes() {
  return (1 + Consumers) * kSliceBytes;
}
template <int Consumers, int Stages>
__host__ __device__ constexpr int smem_bytes() {
  constexpr int stages = Stages * stage_bytes<Consumers>();
  constexpr int staged = Consumers * kStagedBytes;  // the epilogue reuses the stages
  return (stages > staged ? stages : staged) + 2 * Stages * 8 + 1024;  // + barriers + slack
}

struct kernel_params {
  int blocks_per_matrix;  // sm90::blocks_per_matrix
  int tiles_n;            // tiles per row of D
  int slices;             // k / kSlice
  int symmetric;
  float alpha;
  float beta;
  const __nv_bfloat16* c;
  int64_t ld_c, stride_c;
  __nv_bfloat16* d;
  int64_t ld_d, stride_d;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count));
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = shared_address(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

/// One [128 rows, 64 k] slice of a 3-d (k, rows, matrix) tensor into shared memory.
__device__ __forceinline__ void copy_slice(void* dst, const CUtensorMap* map, uint64_t* bar, int k,
                                           int row, int matrix) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(matrix), "r"(shared_address(bar))
      : "memory");
}

/// Starts moving `bytes` (a multiple of 16) at `p` (16-byte aligned) from memory into L2.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<uint64_t>(p)),
               "r"(bytes)
               : "memory");
}

/// wgmma's shared-memory descriptor of a K-major operand in 128-byte swizzled rows: 8-row
/// groups 1024 bytes apart (the stride byte offset); the leading offset is unused with this
/// swizzle. Advancing 16 k (32 bytes) is adding 32 to the address.
__device__ __forceinline__ uint64_t operand_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16)
         | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
/// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmmas.
__device__ __forceinline__ void pin(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i)
    asm volatile("" : "+f"(d[i])::"memory");
}

/// D[64 x 128] (+)= A[64 x 16] B[128 x 16]^T, A and B from shared memory, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], uint64_t a, uint64_t b,
                                              uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

/// Syncs the consumer warpgroups only (named barrier 1; the producer warp has left).
template <int Consumers>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(Consumers * kGroupThreads) : "memory");
}

/// Syncs one consumer warpgroup (named barrier 2 + group).
__device__ __forceinline__ void group_sync(int group) {
  if (group == 0)
    asm volatile("bar.sync 2, %0;" ::"n"(kGroupThreads) : "memory");
  else
    asm volatile("bar.sync 3, %0;" ::"n"(kGroupThreads) : "memory");
}

/// The tile through shared memory (the stages are free by now), so that every global access is
/// 16 bytes wide and whole rows of D and of its mirror are written by neighbouring threads: the
/// accumulators go in as fp32, alpha * acc + beta * C is formed and rounded along D's rows
/// (C read 16 bytes at a time), the rounded values go back, and the mirror pass writes them
/// down D's columns into the mirror's rows. `t` is the thread's index in its warpgroup.
__device__ __forceinline__ void store_staged(const float (&acc0)[64], const float (&acc1)[64],
                                             float* tile, const kernel_params& prm, int64_t matrix,
                                             int tile_m, int tile_n, bool mirror, int group,
                                             int t) {
  const int lane = t % 32;
  const int warp = t / 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float(&acc)[64] = h == 0 ? acc0 : acc1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = h * 64 + warp * 16 + lane / 4 + half * 8;
        const int col = j * 8 + (lane % 4) * 2;
        *reinterpret_cast<float2*>(tile + row * kStagedLd + col) =
            make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
  group_sync(group);
  const int64_t row0 = int64_t{tile_m} * kTile;
  const int64_t col0 = int64_t{tile_n} * kTile;
  const __nv_bfloat16* c = prm.c != nullptr ? prm.c + matrix * prm.stride_c : nullptr;
  __nv_bfloat16* d = prm.d + matrix * prm.stride_d;
  // Rows: 16 runs of 8 columns per row, one run per thread per pass; unrolled so that several
  // passes' loads of C are in flight at once.
#pragma unroll 4
  for (int pass = 0; pass < kTile * (kTile / 8) / kGroupThreads; ++pass) {
    const int i = t + pass * kGroupThreads;
    const int row = i / (kTile / 8);
    const int col = (i % (kTile / 8)) * 8;
    float* at = tile + row * kStagedLd + col;
    float v[8];
    *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(at);
    *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(at + 4);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v[e] *= prm.alpha;
    if (c != nullptr) {
      const uint4 raw = *reinterpret_cast<const uint4*>(c + (row0 + row) * prm.ld_c + col0 + col);
      const __nv_bfloat162* old = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[2 * e] += prm.beta * __low2float(old[e]);
        v[2 * e + 1] += prm.beta * __high2float(old[e]);
      }
    }
    uint4 out;
    __nv_bfloat162* packed = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      packed[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    *reinterpret_cast<uint4*>(d + (row0 + row) * prm.ld_d + col0 + col) = out;
    if (mirror) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[2 * e] = __low2float(packed[e]);
        v[2 * e + 1] = __high2float(packed[e]);
      }
      *reinterpret_cast<float4*>(at) = *reinterpret_cast<const float4*>(v);
      *reinterpret_cast<float4*>(at + 4) = *reinterpret_cast<const float4*>(v + 4);
    }
  }
  if (!mirror)
    return;
  group_sync(group);
  // Columns: each thread takes 16 rows of one column (32 bytes of a row of the mirror) per pass;
  // neighbouring threads take neighbouring columns, so the shared-memory reads do not conflict.
  for (int i = t; i < kTile * (kTile / 16); i += kGroupThreads) {
    const int col = i % kTile;
    const int row = (i / kTile) * 16;
    uint4 out[2];
    __nv_bfloat162* packed = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      packed[e] = __floats2bfloat162_rn(tile[(row + 2 * e) * kStagedLd + col],
                                        tile[(row + 2 * e + 1) * kStagedLd + col]);
    uint4* to = reinterpret_cast<uint4*>(d + (col0 + col) * prm.ld_d + row0 + row);
    to[0] = out[0];
    to[1] = out[1];
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int Consumers, int Stages>
__global__ void __launch_bounds__(threads<Consumers>())
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap map_p,
                     const __grid_constant__ CUtensorMap map_q, const kernel_params prm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStageBytes = stage_bytes<Consumers>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023)
                                             & ~static_cast<uintptr_t>(1023));
  constexpr int kBarrierOffset = smem_bytes<Consumers, Stages>() - 1024 - 2 * Stages * 8;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);
  uint64_t* empty = full + Stages;
  const int matrix = static_cast<int>(blockIdx.x) / prm.blocks_per_matrix;
  const sm90::block_work w =
      sm90::tiles_of_block(Consumers, prm.symmetric != 0, prm.tiles_n,
                           static_cast<int>(blockIdx.x) % prm.blocks_per_matrix);

  if (threadIdx.x == 0) {
    for (int s = 0; s < Stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 4 * w.active);  // one arrival per working consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= Consumers * kGroupThreads) {
    if (threadIdx.x == Consumers * kGroupThreads) {
      // The epilogue's C rows, asked into L2 a few slices before the last, so that the epilogue
      // reads them from L2 rather than waiting on memory (the tile's last act otherwise).
      const int prefetch_at = max(0, prm.slices - kPrefetchSlices);
      for (int kb = 0; kb < prm.slices; ++kb) {
        if (kb == prefetch_at && prm.c != nullptr) {
          for (int g = 0; g < w.active; ++g) {
            const __nv_bfloat16* c = prm.c + matrix * prm.stride_c
                                     + int64_t{w.row(g)} * kTile * prm.ld_c
                                     + int64_t{w.col(g)} * kTile;
            for (int row = 0; row < kTile; ++row)
              prefetch_l2(c + row * prm.ld_c, kTile * 2);
          }
        }
        const int s = kb % Stages;
        barrier_wait(&empty[s], ((kb / Stages) & 1) ^ 1);
        barrier_expect_bytes(&full[s], (1 + w.active) * kSliceBytes);
        uint8_t* stage = smem + s * kStageBytes;
        for (int slot = 0; slot <= w.active; ++slot) {
          const sm90::slot_rows rows = sm90::slot_of(w, slot);
          copy_slice(stage + slot * kSliceBytes, rows.p ? &map_p : &map_q, &full[s], kb * kSlice,
                     rows.tile * kTile, matrix);
        }
      }
    }
    return;
  }

  const int group = static_cast<int>(threadIdx.x) / kGroupThreads;
  const int p_at = sm90::p_slot(w, group);  // the group's slices in a stage
  const int q_at = sm90::q_slot(w, group);
  // The first slice's wgmmas overwrite the accumulators (scale-d 0), so they start undefined:
  // zeroing them here would make ptxas serialize the wgmmas.
  float acc0[64];  // rows 0-63 of the tile
  float acc1[64];  // rows 64-127
  if (group < w.active) {
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
      if (kb > 0 && threadIdx.x % 32 == 0)
        barrier_arrive(&empty[(kb - 1) % Stages]);
    }
    wgmma_wait<0>();
    pin(acc0);
    pin(acc1);
  }
  consumers_sync<Consumers>();  // every group's wgmmas have read their stages
  if (group >= w.active)
    return;
  const int tile_m = w.row(group);
  const int tile_n = w.col(group);
  const bool mirror = prm.symmetric != 0 && tile_m != tile_n;
  float* staged = reinterpret_cast<float*>(smem + group * kStagedBytes);
  store_staged(acc0, acc1, staged, prm, matrix, tile_m, tile_n, mirror, group,
               static_cast<int>(threadIdx.x) % kGroupThreads);
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
  const int64_t blocks = prm.blocks_per_matrix * a.batch;
  kernel<<<static_cast<unsigned>(blocks), threads<Consumers>(), kSmem, stream>>>(map_p, map_q, prm);
  ZMUON_LAUNCH_CHECK();
}

/// The block shape for `a` (measured, docs/NOTES.md sessions 8 and 16). Over k >= 2048 a tile
/// runs at about 90 % of the ceiling in a two-tile block (3/4 of the bytes per FLOP) and at about
/// 70 % in one-tile blocks (two a multiprocessor), so two tiles win unless they take more waves
/// of the device: 7 * waves(two tiles) <= 9 * waves(one tile). Over short k one tile wins (one
/// block's epilogue beside the other's wgmmas).
sm90_block choose_block(const sm90_gemm_args& a) {
  if (a.k < 2048)
    return sm90_block::one_tile;
  const int64_t sms = multiprocessors();
  const int64_t two = (blocks_per_matrix(a, 2) * a.batch + sms - 1) / sms;
  const int64_t one = (blocks_per_matrix(a, 1) * a.batch + 2 * sms - 1) / (2 * sms);
  return 7 * two <= 9 * one ? sm90_block::two_tiles : sm90_block::one_tile;
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
  // Measured (bench_sm90_gemm, docs/NOTES.md sessions 7 and 8): 1.22-1.55x cuBLAS's whole
  // product at m >= 768 over k >= 2048; 0.82x at m = 512 (4 tiles a side: 10 of 16 computed).
  // Over k = 768: 0.82-0.91x when the upper tiles take several waves of two blocks per
  // multiprocessor (48 x [768, 768]) and 0.84x on a single matrix (21 blocks), 0.98-1.06x
  // between half a wave and one (6 and 12 matrices), which made GPT-2's Gram groups 2-3 % faster.
  if (m % kSm90Tile != 0 || k % kSm90Slice != 0 || m < 768 || batch > 65535)
    return false;
  if (k >= 2048)
    return true;
  const int64_t tiles = m / kSm90Tile;
  const int64_t blocks = batch * tiles * (tiles + 1) / 2;
  const int64_t sms = multiprocessors();
  return 2 * blocks >= sms && blocks <= 2 * sms;
}

bool sm90_gemm_available() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess
      || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return false;
  return prop.major == 9 && prop.minor == 0;
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

// test_engine_cuda, continued: the hand-over of device gradients and the write-back of the
// parameters. reduce() reads the gradients before it returns, or in the caller's stream order
// (reduce(rank, views, stream)); gather_params(out, stream) and step(stream) write in that order
// too; a stream that cannot be waited for is refused by name, before anything is read, written
// or counted. Gradients handed over ahead of the step are read only after the step's stream.
#include "support/engine_fixture.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "support/device_grads.hpp"

using namespace zmuon;
using namespace zmuon::test;

// reduce() reads device gradients on the rank's stream; the caller may overwrite them as soon
// as it returns (the next backward pass). Here every SM is kept busy by a 16 GB memset on a
// low-priority stream while reduce() queues its copies, and the gradients are overwritten with
// NaN at once on a high-priority stream, whose blocks the GPU dispatches before the queued
// copies'. The step must still see the values handed over: not skipped, their norm.
BOOST_AUTO_TEST_CASE(device_gradients_are_read_before_reduce_returns) {
  const std::vector<param_spec> table{{"a", {4096, 4096}}, {"b", {4096, 4096}}};
  std::vector<std::vector<float>> values;
  std::vector<float*> device;
  std::vector<tensor_view> views;
  double sum_squares = 0;
  for (const auto& p : table) {
    values.push_back(random_values(numel(p), 11 + device.size()));
    for (float x : values.back())
      sum_squares += static_cast<double>(x) * x;
    float* d = nullptr;
    BOOST_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), values.back().size() * sizeof(float))
                  == cudaSuccess);
    device.push_back(d);
    views.push_back({p.name, d, numel(p), memory_space::cuda, 0});
  }
  int least = 0, greatest = 0;
  BOOST_REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  cudaStream_t busy = nullptr, urgent = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithPriority(&busy, cudaStreamNonBlocking, least) == cudaSuccess);
  BOOST_REQUIRE(cudaStreamCreateWithPriority(&urgent, cudaStreamNonBlocking, greatest)
                == cudaSuccess);
  const size_t ballast_bytes = size_t{16} << 30;
  void* ballast = nullptr;
  BOOST_REQUIRE(cudaMalloc(&ballast, ballast_bytes) == cudaSuccess);
  auto o = gpu_options(1, "nccl");
  o.reduce_bucket_size = numel(table[0]);  // one gradient a bucket
  auto eng = make_engine(o);
  register_table(*eng, table, 3);
  const double norm = std::sqrt(sum_squares);
  for (int s = 1; s <= 3; ++s) {
    for (size_t i = 0; i < device.size(); ++i)
      BOOST_REQUIRE(cudaMemcpy(device[i], values[i].data(), values[i].size() * sizeof(float),
                               cudaMemcpyHostToDevice)
                    == cudaSuccess);
    BOOST_REQUIRE(cudaMemsetAsync(ballast, 0, ballast_bytes, busy) == cudaSuccess);
    BOOST_REQUIRE(!eng->reduce(0, views));
    for (size_t i = 0; i < device.size(); ++i)  // all bits set: NaN
      BOOST_REQUIRE(cudaMemsetAsync(device[i], 0xff, values[i].size() * sizeof(float), urgent)
                    == cudaSuccess);
    BOOST_REQUIRE(cudaStreamSynchronize(urgent) == cudaSuccess);
    BOOST_REQUIRE(cudaStreamSynchronize(busy) == cudaSuccess);
    auto info = eng->step();
    BOOST_REQUIRE(info);
    BOOST_TEST(!info->skipped, "step " << s << " saw the NaN written after reduce() returned");
    BOOST_TEST(std::fabs(info->grad_norm - norm) <= 1e-5 * norm,
               "step " << s << ": grad norm " << info->grad_norm << ", handed over " << norm);
  }
  cudaFree(ballast);
  cudaStreamDestroy(busy);
  cudaStreamDestroy(urgent);
  for (float* d : device)
    cudaFree(d);
}

// reduce(rank, views, stream): the engine's reads come after the work queued on the caller's
// stream (here a 16 GB memset, then the gradients' upload over NaN), and the work queued there
// next (NaN over the gradients again) waits for them. Either order missing, the step sees NaN.
// Under the caf comm (zmuon.Muon's default) the gradients are copied to host memory during the
// call, after the caller's work.
BOOST_AUTO_TEST_CASE(stream_ordered_reduce_reads_between_the_callers_work) {
  const std::vector<param_spec> table{{"a", {4096, 4096}}, {"b", {2048, 4096}}};
  std::vector<float*> host;  // pinned: the uploads stay queued behind the memset
  std::vector<float*> device;
  std::vector<tensor_view> views;
  double sum_squares = 0;
  for (const auto& p : table) {
    auto v = random_values(numel(p), 21 + device.size());
    for (float x : v)
      sum_squares += static_cast<double>(x) * x;
    float* h = nullptr;
    float* d = nullptr;
    const size_t bytes = v.size() * sizeof(float);
    BOOST_REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&h), bytes) == cudaSuccess);
    BOOST_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), bytes) == cudaSuccess);
    std::copy(v.begin(), v.end(), h);
    host.push_back(h);
    device.push_back(d);
    views.push_back({p.name, d, numel(p), memory_space::cuda, 0});
  }
  cudaStream_t caller = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) == cudaSuccess);
  const size_t ballast_bytes = size_t{16} << 30;
  void* ballast = nullptr;
  BOOST_REQUIRE(cudaMalloc(&ballast, ballast_bytes) == cudaSuccess);
  const double norm = std::sqrt(sum_squares);
  // nccl: packed by copies on the rank's stream; caf: copied to host memory during the call.
  for (const char* comm : {"nccl", "caf"}) {
    auto o = gpu_options(1, comm);
    o.reduce_bucket_size = numel(table[0]);
    auto eng = make_engine(o);
    register_table(*eng, table, 4);
    for (int s = 1; s <= 3; ++s) {
      for (size_t i = 0; i < device.size(); ++i)  // NaN until the caller's upload
        BOOST_REQUIRE(cudaMemset(device[i], 0xff, views[i].size * sizeof(float)) == cudaSuccess);
      BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      BOOST_REQUIRE(cudaMemsetAsync(ballast, 0, ballast_bytes, caller) == cudaSuccess);
      for (size_t i = 0; i < device.size(); ++i)
        BOOST_REQUIRE(cudaMemcpyAsync(device[i], host[i], views[i].size * sizeof(float),
                                      cudaMemcpyHostToDevice, caller)
                      == cudaSuccess);
      BOOST_REQUIRE(!eng->reduce(0, views, caller));
      for (size_t i = 0; i < device.size(); ++i)  // the caller's next work: NaN again
        BOOST_REQUIRE(cudaMemsetAsync(device[i], 0xff, views[i].size * sizeof(float), caller)
                      == cudaSuccess);
      auto info = eng->step();
      BOOST_REQUIRE(info);
      BOOST_TEST(!info->skipped,
                 comm << ", step " << s << " read NaN: the reads left the caller's order");
      BOOST_TEST(
          std::fabs(info->grad_norm - norm) <= 1e-5 * norm,
          comm << ", step " << s << ": grad norm " << info->grad_norm << ", handed over " << norm);
      BOOST_REQUIRE(cudaStreamSynchronize(caller) == cudaSuccess);
    }
  }
  cudaFree(ballast);
  cudaStreamDestroy(caller);
  for (size_t i = 0; i < device.size(); ++i) {
    cudaFree(device[i]);
    cudaFreeHost(host[i]);
  }
}

// A caller's stream that is capturing a CUDA graph (a PyTorch CUDA-graph region) cannot be
// waited for: the rank's stream would join the capture and the engine's copies would land in
// the caller's graph instead of running. reduce() refuses it by name before reading or counting
// anything, the capture ends intact (empty), and the same hand-over outside the capture gives
// the bits of a run that never saw the refused call.
BOOST_AUTO_TEST_CASE(a_capturing_stream_is_refused_and_nothing_is_counted) {
  const std::vector<param_spec> table{{"a", {256, 512}}, {"b", {128, 256}}, {"c", {512}}};
  const device_grads grads(table, 31);
  const auto& views = grads.views;
  cudaStream_t caller = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) == cudaSuccess);
  for (const char* comm : {"nccl", "caf"}) {
    tensor_map weights[2];
    for (int refused = 0; refused < 2; ++refused) {
      auto eng = make_engine(gpu_options(1, comm));
      register_table(*eng, table, 5);
      for (int s = 1; s <= 2; ++s) {
        if (refused == 1) {
          BOOST_REQUIRE(cudaStreamBeginCapture(caller, cudaStreamCaptureModeRelaxed)
                        == cudaSuccess);
          const error err = eng->reduce(0, views, caller);
          cudaGraph_t graph = nullptr;
          BOOST_REQUIRE(cudaStreamEndCapture(caller, &graph) == cudaSuccess);
          size_t nodes = 99;
          BOOST_REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess);
          cudaGraphDestroy(graph);
          BOOST_TEST_MESSAGE(comm << ", step " << s << ": " << err.to_string());
          BOOST_TEST((err.code() == errc::invalid_argument));
          BOOST_TEST(err.message().find("capturing a CUDA graph") != std::string::npos);
          BOOST_TEST(nodes == 0u, comm << ": the engine's work went into the caller's graph");
        }
        BOOST_REQUIRE(!eng->reduce(0, views, caller));
        auto info = eng->step();
        BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
        BOOST_REQUIRE(cudaStreamSynchronize(caller) == cudaSuccess);
      }
      weights[refused] = params_of(*eng);
    }
    const double diff = rel_diff(weights[1], weights[0]);
    BOOST_TEST_MESSAGE(comm << ": weights after refused calls vs without: " << diff);
    BOOST_TEST(diff == 0.0);
  }
  cudaStreamDestroy(caller);
}

// gather_params(out, stream) writes device buffers between the caller's work on its stream,
// without waiting on the host: the caller's copy queued before it (behind a 16 GB memset, as a
// forward pass still reading the old values would be) reads the old values, the copy queued
// after it reads the new ones, and the call returns before the memset has finished. A capturing
// stream is refused by name with the buffers untouched.
BOOST_AUTO_TEST_CASE(stream_ordered_gather_params_writes_between_the_callers_work) {
  const std::vector<param_spec> table{{"a", {4096, 4096}}, {"b", {2048, 4096}}};
  const device_grads grads(table, 41);
  const device_grads buffers(table, 42);  // the caller's parameters (old values: these)
  const device_grads before(table, 43), after(table, 44);  // what the caller's copies saw
  std::vector<tensor_span> out;
  for (size_t i = 0; i < table.size(); ++i)
    out.push_back({table[i].name, buffers.data[i], buffers.views[i].size, memory_space::cuda, 0});
  cudaStream_t caller = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) == cudaSuccess);
  const size_t ballast_bytes = size_t{16} << 30;
  void* ballast = nullptr;
  BOOST_REQUIRE(cudaMalloc(&ballast, ballast_bytes) == cudaSuccess);
  auto host_of = [](const float* d, int64_t n) {
    std::vector<float> h(static_cast<size_t>(n));
    BOOST_REQUIRE(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost)
                  == cudaSuccess);
    return h;
  };
  for (const char* comm : {"nccl", "caf"}) {
    auto eng = make_engine(gpu_options(1, comm));
    register_table(*eng, table, 6);
    BOOST_REQUIRE(!eng->reduce(0, grads.views));
    BOOST_REQUIRE(eng->step());
    const tensor_map fresh = params_of(*eng);
    std::vector<std::vector<float>> old;
    for (size_t i = 0; i < table.size(); ++i)
      old.push_back(host_of(buffers.data[i], buffers.views[i].size));

    BOOST_REQUIRE(cudaStreamBeginCapture(caller, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    const error refused = eng->gather_params(out, caller);
    cudaGraph_t graph = nullptr;
    BOOST_REQUIRE(cudaStreamEndCapture(caller, &graph) == cudaSuccess);
    cudaGraphDestroy(graph);
    BOOST_TEST((refused.code() == errc::invalid_argument), refused.to_string());
    BOOST_TEST(refused.message().find("capturing a CUDA graph") != std::string::npos);

    BOOST_REQUIRE(cudaMemsetAsync(ballast, 0, ballast_bytes, caller) == cudaSuccess);
    for (size_t i = 0; i < table.size(); ++i)  // the caller still reads the old values
      BOOST_REQUIRE(cudaMemcpyAsync(before.data[i], buffers.data[i], out[i].size * sizeof(float),
                                    cudaMemcpyDeviceToDevice, caller)
                    == cudaSuccess);
    BOOST_REQUIRE(!eng->gather_params(out, caller));
    const bool returned_early = cudaStreamQuery(caller) == cudaErrorNotReady;
    for (size_t i = 0; i < table.size(); ++i)  // the caller's next work: the new values
      BOOST_REQUIRE(cudaMemcpyAsync(after.data[i], buffers.data[i], out[i].size * sizeof(float),
                                    cudaMemcpyDeviceToDevice, caller)
                    == cudaSuccess);
    BOOST_REQUIRE(cudaStreamSynchronize(caller) == cudaSuccess);
    BOOST_TEST(returned_early, comm << ": gather_params waited for the caller's stream");
    for (size_t i = 0; i < table.size(); ++i) {
      const auto& name = table[i].name;
      const auto seen_before = host_of(before.data[i], out[i].size);
      const auto seen_after = host_of(after.data[i], out[i].size);
      BOOST_TEST(same_bits(seen_before, old[i]),
                 comm << ": '" << name << "' was overwritten before the caller's queued read");
      BOOST_TEST(same_bits(seen_after, fresh.at(name)),
                 comm << ": the caller's next read of '" << name << "' missed the new values");
    }
  }
  cudaFree(ballast);
  cudaStreamDestroy(caller);
}

// step(stream) returns once the step is decided and enqueued, as torch.optim's steps do, and
// the caller's work queued after it sees the new values: copies of the masters queued on the
// caller's stream right after two such steps give the bits of two step() calls that waited. The
// step's Newton-Schulz of 4096² takes milliseconds, so a copy that did not wait for it reads
// the old values.
BOOST_AUTO_TEST_CASE(stream_ordered_step_orders_the_callers_later_work) {
  const std::vector<param_spec> table{{"a", {4096, 4096}}, {"b", {2048, 4096}}};
  const device_grads grads(table, 51);
  const device_grads seen(table, 52);  // the caller's copies of the masters
  cudaStream_t caller = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) == cudaSuccess);
  for (const char* comm : {"nccl", "caf"}) {
    auto waited = make_engine(gpu_options(1, comm));
    register_table(*waited, table, 8);
    auto ordered = make_engine(gpu_options(1, comm));
    register_table(*ordered, table, 8);
    for (int s = 1; s <= 2; ++s) {
      BOOST_REQUIRE(!waited->reduce(0, grads.views));
      BOOST_REQUIRE(waited->step());
      BOOST_REQUIRE(!ordered->reduce(0, grads.views));
      auto info = ordered->step(caller);
      BOOST_REQUIRE(info);
      BOOST_TEST(!info->skipped);
    }
    for (size_t i = 0; i < table.size(); ++i) {
      auto master = ordered->master_of(table[i].name);
      BOOST_REQUIRE(master);
      BOOST_REQUIRE(master->size == seen.views[i].size);
      BOOST_REQUIRE(cudaMemcpyAsync(seen.data[i], master->data, master->size * sizeof(float),
                                    cudaMemcpyDeviceToDevice, caller)
                    == cudaSuccess);
    }
    BOOST_REQUIRE(cudaStreamSynchronize(caller) == cudaSuccess);
    const tensor_map want = params_of(*waited);
    for (size_t i = 0; i < table.size(); ++i) {
      std::vector<float> got(static_cast<size_t>(seen.views[i].size));
      BOOST_REQUIRE(
          cudaMemcpy(got.data(), seen.data[i], got.size() * sizeof(float), cudaMemcpyDeviceToHost)
          == cudaSuccess);
      BOOST_TEST(same_bits(got, want.at(table[i].name)),
                 comm << ": the caller's read of '" << table[i].name
                      << "' after step(stream) is not the waited step's result");
    }
  }
  cudaStreamDestroy(caller);
}

// A hand-over ahead of the step (as a backward pass ends) is read only after the step's stream
// (or begin_step's): gradients handed over holding a NaN and then overwritten on the caller's
// stream behind a queue of slow work give, bit for bit, the step of the values written, two
// steps running.
BOOST_AUTO_TEST_CASE(a_hand_over_ahead_of_the_step_is_read_after_the_steps_stream) {
  const std::vector<param_spec> table{{"w1", {48, 80}}, {"w2", {80, 48}}, {"bias", {80}}};
  const device_grads want_grads(table, 5);
  cudaStream_t caller = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) == cudaSuccess);
  float* slow = nullptr;  // memsets that keep the caller's stream busy for milliseconds
  const size_t slow_bytes = size_t{256} << 20;
  BOOST_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&slow), slow_bytes) == cudaSuccess);
  auto run = [&](bool ahead, bool begun) {
    auto eng = make_engine(gpu_options(1, "nccl"));
    register_table(*eng, table, 9);
    const device_grads early(table, 11);
    for (int step = 0; step < 2; ++step) {
      if (!ahead) {
        BOOST_REQUIRE(!eng->hand_over(0, want_grads.views, caller, false, true));
      } else {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        BOOST_REQUIRE(cudaMemcpy(early.data[0] + 3, &nan, sizeof(float), cudaMemcpyHostToDevice)
                      == cudaSuccess);
        BOOST_REQUIRE(!eng->hand_over(0, early.views, caller, false, true, true));
        for (int i = 0; i < 20; ++i)
          BOOST_REQUIRE(cudaMemsetAsync(slow, i, slow_bytes, caller) == cudaSuccess);
        for (size_t i = 0; i < table.size(); ++i)
          BOOST_REQUIRE(cudaMemcpyAsync(early.data[i], want_grads.data[i],
                                        numel(table[i]) * sizeof(float), cudaMemcpyDeviceToDevice,
                                        caller)
                        == cudaSuccess);
        if (begun)
          BOOST_REQUIRE(!eng->begin_step(caller));
      }
      auto info = eng->step(caller);
      BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
      BOOST_TEST(!info->skipped);
      BOOST_REQUIRE(cudaStreamSynchronize(caller) == cudaSuccess);
    }
    return params_of(*eng);
  };
  const auto want = run(false, false);
  for (bool begun : {false, true}) {
    const auto got = run(true, begun);
    for (const auto& [name, v] : want)
      BOOST_TEST(same_bits(got.at(name), v), name << (begun ? ", begun" : ""));
  }
  cudaFree(slow);
  cudaStreamDestroy(caller);
}

// test_engine_cuda, continued: the hand-over of device gradients and the write-back of the
// parameters. reduce() reads the gradients before it returns, or in the caller's stream order
// (reduce(rank, views, stream)); gather_params(out, stream) and step(stream) write in that order
// too; a stream that cannot be waited for is refused by name, before anything is read, written
// or counted. Gradients handed over ahead of the step are read only after the step's stream.
// Gradients kept until the step: the vote ahead of the momentum sees them all, a refused step
// copies them in, and they take no bucket buffer (the bound on buckets in flight).
#include "support/engine_fixture.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "plan/plan.hpp"
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

// Ahead of the vote (world 1, gradients kept until the step) the Muon gradients are scanned in
// the momentum's own pass and the others at the hand-over: the step's norm is the norm of every
// gradient, and a non-finite value in either kind refuses the step, the parameters as they were.
BOOST_AUTO_TEST_CASE(the_vote_ahead_of_the_momentum_sees_every_kept_gradient) {
  const std::vector<param_spec> table{{"w1", {48, 80}}, {"w2", {80, 48}}, {"bias", {80}}};
  const device_grads grads(table, 5);
  double sum = 0.0;
  for (size_t i = 0; i < table.size(); ++i)
    for (const float x : random_values(numel(table[i]), 5 + i))
      sum += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum);
  auto eng = make_engine(gpu_options(1, "nccl"));  // momentum_before_vote auto: on for cuda
  register_table(*eng, table, 9);
  eng->time_backend_calls(true);
  const auto step_with = [&](int param, float bad) {
    float kept = 0.0f;
    float* at = param >= 0 ? grads.data[param] + 7 : nullptr;
    if (param >= 0) {
      BOOST_REQUIRE(cudaMemcpy(&kept, at, sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      BOOST_REQUIRE(cudaMemcpy(at, &bad, sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    BOOST_REQUIRE(!eng->hand_over(0, grads.views, nullptr, false, true));
    const auto before = params_of(*eng);
    const step_info info = step_ok(*eng);
    if (param >= 0) {
      BOOST_TEST(info.skipped, table[param].name << ": " << bad << " not seen");
      BOOST_TEST((params_of(*eng) == before), table[param].name << ": params after the refusal");
      BOOST_REQUIRE(cudaMemcpy(at, &kept, sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    } else {
      BOOST_TEST(!info.skipped);
      BOOST_TEST(std::fabs(info.grad_norm - norm) <= 1e-6 * norm,
                 "grad norm " << info.grad_norm << ", handed over " << norm);
    }
  };
  step_with(-1, 0.0f);
  step_with(0, std::numeric_limits<float>::quiet_NaN());  // w1: Muon
  step_with(2, std::numeric_limits<float>::infinity());   // bias: AdamW
  step_with(1, -std::numeric_limits<float>::infinity());  // w2: Muon
  step_with(-1, 0.0f);
  auto times = eng->take_backend_call_times(0);
  BOOST_REQUIRE(times);
  BOOST_TEST((*times)["momentum_spare"].calls > 0);  // the momentum went ahead of the vote
  eng->time_backend_calls(false);
}

// A step() refused before it begins (a schedule's bad rate) keeps what was handed over, the
// gradients kept until the step too: they are copied in before it returns, so the caller's
// writes into them afterwards (NaN here) do not reach the step that follows with a good rate,
// which equals, bit for bit, an engine that never saw the bad one.
BOOST_AUTO_TEST_CASE(a_refused_step_copies_in_the_gradients_kept_until_the_step) {
  const std::vector<param_spec> table{{"w1", {48, 80}}, {"w2", {80, 48}}, {"bias", {80}}};
  auto run = [&](bool refused) {
    const device_grads grads(table, 5);
    auto eng = make_engine(gpu_options(1, "nccl"));
    register_table(*eng, table, 9);
    BOOST_REQUIRE(!eng->hand_over(0, grads.views, nullptr, false, true));
    if (refused) {
      eng->set_lr_schedules([](uint64_t) { return NAN; }, nullptr);
      auto s = eng->step();
      BOOST_REQUIRE(!s);
      BOOST_TEST((s.err().code() == errc::invalid_argument));
      BOOST_TEST(
          s.err().message().find("the Muon learning rate for step 1 is ") != std::string::npos,
          s.err().message());
      for (size_t i = 0; i < grads.data.size(); ++i)
        BOOST_REQUIRE(cudaMemset(grads.data[i], 0xff, grads.views[i].size * sizeof(float))
                      == cudaSuccess);
    }
    eng->set_lr_schedules([](uint64_t) { return 0.02f; }, [](uint64_t) { return 3e-4f; });
    BOOST_TEST(!step_ok(*eng).skipped);
    return params_of(*eng);
  };
  const auto want = run(false);
  const auto got = run(true);
  for (const auto& [name, v] : want)
    BOOST_TEST(same_bits(got.at(name), v), name);
}

// engine_options::max_buckets_in_flight on the production path (nccl world 1, device gradients,
// packed in the backend's memory): during reduce() the backend holds at most `window` buckets'
// input and output buffers above what it held before (world 1: both are a whole bucket); the
// weights are the same bits either way. Unbounded, how many pile up depends on how fast the
// reducer lands them (printed, not checked; test_reduce_window checks the window itself).
// Gradients kept until the step (engine::hand_over) take no buffer.
BOOST_AUTO_TEST_CASE(buckets_in_flight_bound_the_hand_over_memory) {
  const int64_t bucket = 1 << 16;  // elements: one parameter a bucket, six buckets
  const std::vector<param_spec> table{{"a", {256, 256}}, {"b", {128, 512}}, {"c", {512, 128}},
                                      {"d", {256, 256}}, {"e", {65536}},    {"f", {256, 256}}};
  const int gas = 2;
  const device_grads grads(table, 5);
  const auto& views = grads.views;
  auto run = [&](int window, int64_t& handover_peak, bool kept = false) {
    auto o = gpu_options(1, "nccl");
    o.reduce_bucket_size = bucket;
    o.max_buckets_in_flight = window;
    auto eng = make_engine(o);
    register_table(*eng, table, 5);
    handover_peak = 0;
    for (int s = 1; s <= 3; ++s) {
      int64_t before = s > 1 ? eng->memory(0)->in_use : 0;  // the state, once the engine runs
      eng->reset_peak_memory();
      for (int k = 0; k < gas; ++k)
        BOOST_REQUIRE(kept ? !eng->hand_over(0, views, nullptr, false, true)
                           : !eng->reduce(0, views));
      if (s > 1)
        handover_peak = std::max(handover_peak, eng->memory(0)->peak - before);
      step_ok(*eng);
    }
    BOOST_REQUIRE_EQUAL(eng->layout()->buckets.size(), table.size());
    return params_of(*eng);
  };
  const int64_t bucket_bytes = bucket * static_cast<int64_t>(sizeof(float));
  int64_t unbounded_peak = 0;
  auto unbounded = run(0, unbounded_peak);
  for (int window : {1, 2}) {
    int64_t peak = 0;
    auto params = run(window, peak);
    BOOST_TEST_MESSAGE("window " << window << ": reduce() hand-over peak " << peak
                                 << " bytes = " << static_cast<double>(peak) / bucket_bytes
                                 << " buckets (bound: " << 2 * window << ", unbounded: "
                                 << static_cast<double>(unbounded_peak) / bucket_bytes << ")");
    BOOST_TEST(peak <= 2 * window * bucket_bytes);
    BOOST_TEST(rel_diff(params, unbounded) == 0.0);
  }
  // Gradients kept until the step are read where they lie: no bucket buffer at all.
  int64_t kept_peak = -1;
  auto kept = run(0, kept_peak, true);
  BOOST_TEST_MESSAGE("kept until the step: hand-over peak " << kept_peak << " bytes");
  BOOST_TEST(kept_peak == 0);
  BOOST_TEST(rel_diff(kept, unbounded) == 0.0);

  // One micro-batch a step kept until the step: the store never allocates its gradient buffer.
  auto in_use_after_steps = [&](bool kept) {
    auto o = gpu_options(1, "nccl");
    o.reduce_bucket_size = bucket;
    auto eng = make_engine(o);
    register_table(*eng, table, 5);
    for (int s = 1; s <= 2; ++s) {
      BOOST_REQUIRE(kept ? !eng->hand_over(0, views, nullptr, false, true)
                         : !eng->reduce(0, views));
      step_ok(*eng);
    }
    return eng->memory(0)->in_use;
  };
  const int64_t copied = in_use_after_steps(false), read_in_place = in_use_after_steps(true);
  BOOST_TEST_MESSAGE("in use after two steps: " << copied << " bytes copied in, " << read_in_place
                                                << " read in place");
  BOOST_TEST(copied - read_in_place == 6 * bucket_bytes);  // world 1: the whole gradient
}

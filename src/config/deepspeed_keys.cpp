// The table of DeepSpeed's keys that zmuon accepts with no effect or refuses. Sources:
// DeepSpeed's config-json page and its pydantic models (runtime/zero/config.py, offload_config.py,
// monitor/config.py), which reject an unknown key inside a section: so does zmuon.
#include "config/deepspeed_keys.hpp"

#include <cmath>

namespace zmuon {
namespace {

using json = nlohmann::json;

ds_key no_effect(std::string path, ds_type type) {
  return {std::move(path), ds_kind::no_effect, type, {}, ""};
}

ds_key refused(std::string path, ds_type type, std::vector<json> off, std::string why) {
  return {std::move(path), ds_kind::refused, type, std::move(off), std::move(why)};
}

ds_key section(std::string path, std::string why) {
  return {std::move(path), ds_kind::section, ds_type::object, {}, std::move(why)};
}

const std::string kOffloadWhy =
    "zmuon keeps each rank's shards in that rank's own memory; it has no CPU or NVMe offload";

std::vector<ds_key> make_table() {
  using t = ds_type;
  std::vector<ds_key> keys = {
      // Batch, logging and communication options.
      no_effect("managed_gradient_accumulation", t::boolean),
      no_effect("memory_breakdown", t::boolean),
      no_effect("dump_state", t::boolean),
      refused("prescale_gradients", t::boolean, {false},
              "zmuon averages the gradients once, after the reduce"),
      refused("gradient_predivide_factor", t::number, {1, 1.0},
              "zmuon averages the gradients once, after the reduce"),
      refused("sparse_gradients", t::boolean, {false}, "zmuon reduces dense gradients only"),
      refused("communication_data_type", t::string, {nullptr, "fp32", "float32"},
              "zmuon reduces gradients in fp32 (the Muon phase's type is zmuon.muon_transport)"),
      refused("gradient_allreduce_op", t::string, {"mean", "avg"},
              "zmuon averages the gradients over the ranks"),
      no_effect("zero_allow_untested_optimizer", t::boolean),
      no_effect("zero_force_ds_cpu_optimizer", t::boolean),
      no_effect("disable_allgather", t::boolean),
      no_effect("graph_harvesting", t::boolean),
      no_effect("seq_parallel_communication_data_type", t::string),
      no_effect("dataloader_drop_last", t::boolean),
      no_effect("use_data_before_expert_parallel_", t::boolean),
      // optimizer: Adam's own knobs, which the AdamW group of Muon does not read.
      no_effect("optimizer.legacy_fusion", t::boolean),
      no_effect("optimizer.params.torch_adam", t::boolean),
      refused("optimizer.params.adam_w_mode", t::boolean, {true},
              "zmuon's AdamW group decays weights decoupled (AdamW), not by L2"),
      no_effect("optimizer.params.bias_correction", t::boolean),
      no_effect("optimizer.params.amsgrad", t::boolean),
      // fp16 and bf16.
      refused("fp16.auto_cast", t::boolean, {false}, "the host casts its own forward pass"),
      refused("fp16.consecutive_hysteresis", t::boolean, {false},
              "zmuon's loss scaler restores its hysteresis only by raising the scale"),
      refused("fp16.fp16_master_weights_and_grads", t::boolean, {false},
              "zmuon keeps fp32 master weights and gradients"),
      refused("bf16.bf16_master_weights_and_grads", t::boolean, {false},
              "zmuon keeps fp32 master weights and gradients"),
      refused("bf16.bf16_optimizer_states", t::boolean, {false},
              "zmuon keeps fp32 optimizer states"),
      no_effect("bf16.immediate_grad_update", t::boolean),
      no_effect("bf16.check_grad_overflow", t::boolean),
      // zero_optimization: ZeRO-3's tuning, which zmuon's actors do their own way.
      no_effect("zero_optimization.allgather_partitions", t::boolean),
      no_effect("zero_optimization.allgather_bucket_size", t::integer),
      no_effect("zero_optimization.overlap_comm", t::boolean),
      no_effect("zero_optimization.reduce_scatter", t::boolean),
      no_effect("zero_optimization.contiguous_gradients", t::boolean),
      no_effect("zero_optimization.load_from_fp32_weights", t::boolean),
      no_effect("zero_optimization.elastic_checkpoint", t::boolean),
      no_effect("zero_optimization.grad_hooks", t::boolean),
      no_effect("zero_optimization.round_robin_gradients", t::boolean),
      no_effect("zero_optimization.use_multi_rank_bucket_allreduce", t::boolean),
      no_effect("zero_optimization.sub_group_size", t::integer),
      no_effect("zero_optimization.ignore_unused_parameters", t::boolean),
      no_effect("zero_optimization.legacy_stage1", t::boolean),
      no_effect("zero_optimization.log_trace_cache_warnings", t::boolean),
      no_effect("zero_optimization.memory_efficient_linear", t::boolean),
      no_effect("zero_optimization.override_module_apply", t::boolean),
      no_effect("zero_optimization.pipeline_loading_checkpoint", t::boolean),
      no_effect("zero_optimization.enable_sanity_checks", t::boolean),
      no_effect("zero_optimization.save_muon_momentum_buffer_in_memory", t::boolean),
      no_effect("zero_optimization.leaf_module", t::object),
      no_effect("zero_optimization.zeropp_loco_param", t::object),
      no_effect("zero_optimization.mics_hierarchical_params_gather", t::boolean),
      refused("zero_optimization.mics_shard_size", t::integer, {-1},
              "zmuon shards over every rank of the job (no MiCS sub-groups)"),
      refused("zero_optimization.zero_hpz_partition_size", t::integer, {1},
              "zmuon has no hierarchical (ZeRO++ hpZ) partitions"),
      refused("zero_optimization.zero_quantized_weights", t::boolean, {false},
              "zmuon gathers parameters unquantized (no ZeRO++ qwZ)"),
      refused("zero_optimization.zero_quantized_nontrainable_weights", t::boolean, {false},
              "zmuon gathers parameters unquantized (no ZeRO++ qwZ)"),
      refused("zero_optimization.zero_quantized_gradients", t::boolean, {false},
              "zmuon reduces gradients unquantized (no ZeRO++ qgZ)"),
      refused("zero_optimization.cpu_offload", t::boolean, {false}, kOffloadWhy),
      refused("zero_optimization.cpu_offload_param", t::boolean, {false}, kOffloadWhy),
      no_effect("zero_optimization.cpu_offload_use_pin_memory", t::boolean),
      section("zero_optimization.zenflow", "zmuon has no ZenFlow (stall-free offload)"),
  };
  // The stage-3 keys, under both of DeepSpeed's names.
  for (const char* key :
       {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
        "max_live_parameters", "max_reuse_distance", "module_granularity_threshold"}) {
    keys.push_back(no_effect(std::string("zero_optimization.stage3_") + key, t::integer));
    keys.push_back(no_effect(std::string("zero_optimization.") + key, t::integer));
  }
  for (const char* key : {"gather_16bit_weights_on_model_save", "use_all_reduce_for_fetch_params",
                          "allgather_sequential"}) {
    keys.push_back(no_effect(std::string("zero_optimization.stage3_") + key, t::boolean));
    keys.push_back(no_effect(std::string("zero_optimization.") + key, t::boolean));
  }
  keys.push_back(
      no_effect("zero_optimization.stage3_gather_fp16_weights_on_model_save", t::boolean));
  // Offloading: off (device "none") is accepted.
  for (const char* what : {"offload_param", "offload_optimizer"}) {
    const std::string p = std::string("zero_optimization.") + what + ".";
    keys.push_back(refused(p + "device", t::string, {"none"}, kOffloadWhy));
    for (const char* key : {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"})
      keys.push_back(no_effect(p + key, key == std::string("nvme_path") ? t::any : t::integer));
    keys.push_back(no_effect(p + "pin_memory", t::boolean));
  }
  for (const char* key : {"pipeline_read", "pipeline_write", "fast_init", "super_offload"})
    keys.push_back(
        no_effect(std::string("zero_optimization.offload_optimizer.") + key, t::boolean));
  for (const char* key : {"ratio", "cpuadam_cores_perc"})
    keys.push_back(no_effect(std::string("zero_optimization.offload_optimizer.") + key, t::number));
  // Feature sections with their keys listed.
  for (const char* key : {"block_size", "queue_depth", "thread_count"})
    keys.push_back(no_effect(std::string("aio.") + key, t::integer));
  for (const char* key : {"single_submit", "overlap_events", "use_gds"})
    keys.push_back(no_effect(std::string("aio.") + key, t::boolean));
  for (const char* key :
       {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
        "synchronize_checkpoint_boundary", "profile"})
    keys.push_back(no_effect(std::string("activation_checkpointing.") + key, t::boolean));
  keys.push_back(no_effect("activation_checkpointing.number_checkpoints", t::any));
  keys.push_back(refused("flops_profiler.enabled", t::boolean, {false},
                         "zmuon has no FLOPs profiler (its message trace is zmuon.trace)"));
  for (const char* key : {"profile_step", "module_depth", "top_modules"})
    keys.push_back(no_effect(std::string("flops_profiler.") + key, t::integer));
  keys.push_back(no_effect("flops_profiler.detailed", t::boolean));
  keys.push_back(no_effect("flops_profiler.output_file", t::any));
  keys.push_back(refused("comms_logger.enabled", t::boolean, {false},
                         "zmuon logs no collectives (its message trace is zmuon.trace)"));
  for (const char* key : {"verbose", "prof_all", "debug"})
    keys.push_back(no_effect(std::string("comms_logger.") + key, t::boolean));
  keys.push_back(no_effect("comms_logger.prof_ops", t::any));
  keys.push_back(no_effect("checkpoint.tag_validation", t::string));
  for (const char* key : {"load_universal", "use_node_local_storage", "pipeline_stage"})
    keys.push_back(no_effect(std::string("checkpoint.") + key, t::boolean));
  keys.push_back(no_effect("checkpoint.parallel_write", t::object));
  keys.push_back(refused("data_types.grad_accum_dtype", t::string, {nullptr, "fp32"},
                         "zmuon accumulates gradients in fp32"));
  keys.push_back(refused("torch_autocast.enabled", t::boolean, {false},
                         "the host runs its own autocast; zmuon sees only fp32 gradients"));
  keys.push_back(no_effect("torch_autocast.dtype", t::string));
  keys.push_back(no_effect("torch_autocast.lower_precision_safe_modules", t::any));
  // Feature sections taken whole: refused when enabled.
  const std::vector<std::pair<const char*, const char*>> sections = {
      {"amp", "zmuon has no apex AMP; fp16 loss scaling is the fp16 section"},
      {"autotuning", "zmuon has no autotuner"},
      {"compression_training", "zmuon has no compression training"},
      {"data_efficiency", "zmuon has no data sampling or routing"},
      {"curriculum_learning", "zmuon has no curriculum learning"},
      {"elasticity", "zmuon has no elastic training"},
      {"progressive_layer_drop", "zmuon has no progressive layer drop"},
      {"eigenvalue", "zmuon computes no Hessian eigenvalues"},
      {"quantize_training", "zmuon has no quantized training"},
      {"hybrid_engine", "zmuon has no hybrid (RLHF) engine"},
      {"expert_parallel", "zmuon has no expert parallelism"},
      {"nebula", "zmuon has no Nebula checkpointing"},
      {"compile", "zmuon has no DeepCompile"},
      {"weight_quantization", "zmuon has no weight quantization"},
  };
  for (const auto& [name, why] : sections)
    keys.push_back(section(name, why));
  keys.push_back(refused("tensor_parallel", t::object, {json::object(), json{{"autotp_size", 1}}},
                         "zmuon shards with ZeRO-3 only (no tensor parallelism)"));
  keys.push_back(refused("sparse_attention", t::object, {json::object()},
                         "zmuon has no attention kernels; the host's model computes attention"));
  keys.push_back(
      refused("pipeline", t::object, {json::object()}, "zmuon has no pipeline parallelism"));
  return keys;
}

}  // namespace

const std::vector<ds_key>& deepspeed_keys() {
  static const std::vector<ds_key> keys = make_table();
  return keys;
}

const ds_key* find_deepspeed_key(const std::string& path) {
  for (const auto& k : deepspeed_keys())
    if (k.path == path)
      return &k;
  return nullptr;
}

bool has_ds_type(const json& v, ds_type t) {
  if (v.is_string() && v.get<std::string>() == "auto")
    return true;
  switch (t) {
    case ds_type::any:
      return true;
    case ds_type::boolean:
      return v.is_boolean();
    case ds_type::integer:
      return v.is_number_integer()
             || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    case ds_type::number:
      return v.is_number();
    case ds_type::string:
      return v.is_string() || v.is_null();
    case ds_type::object:
      return v.is_object();
  }
  return false;
}

std::string ds_type_text(ds_type t) {
  switch (t) {
    case ds_type::boolean:
      return "true or false";
    case ds_type::integer:
      return "an integer";
    case ds_type::number:
      return "a number";
    case ds_type::string:
      return "a string";
    case ds_type::object:
      return "an object";
    case ds_type::any:
      break;
  }
  return "a value";
}

}  // namespace zmuon

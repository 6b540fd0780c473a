#include "bench/step/step_tables.hpp"

#include "plan/ownership.hpp"

namespace zmuon::bench {

std::vector<param_spec> make_table(const std::string& name) {
  std::vector<param_spec> t;
  auto add = [&](std::string n, std::vector<int64_t> shape, param_group g) {
    t.push_back(param_spec{std::move(n), std::move(shape), g, 0});
  };
  if (name == "gpt2-124m") {  // q, k, v, o, fc, proj per layer: 72 Muon matrices
    add("wte", {50257, 768}, param_group::adamw);
    add("wpe", {1024, 768}, param_group::adamw);
    for (int l = 0; l < 12; ++l) {
      const std::string p = "h" + std::to_string(l) + ".";
      for (const char* m : {"q", "k", "v", "o"})
        add(p + m, {768, 768}, param_group::muon);
      add(p + "fc", {3072, 768}, param_group::muon);
      add(p + "proj", {768, 3072}, param_group::muon);
      add(p + "ln1", {768}, param_group::adamw);
      add(p + "ln2", {768}, param_group::adamw);
      add(p + "fc.bias", {3072}, param_group::adamw);
    }
    add("ln_f", {768}, param_group::adamw);
  } else if (name == "llama-1b") {  // q, k, v, o, gate, up, down per layer: 112 Muon matrices
    add("embed", {128256, 2048}, param_group::adamw);
    for (int l = 0; l < 16; ++l) {
      const std::string p = "l" + std::to_string(l) + ".";
      add(p + "q", {2048, 2048}, param_group::muon);
      add(p + "k", {512, 2048}, param_group::muon);
      add(p + "v", {512, 2048}, param_group::muon);
      add(p + "o", {2048, 2048}, param_group::muon);
      add(p + "gate", {8192, 2048}, param_group::muon);
      add(p + "up", {8192, 2048}, param_group::muon);
      add(p + "down", {2048, 8192}, param_group::muon);
      add(p + "norm1", {2048}, param_group::adamw);
      add(p + "norm2", {2048}, param_group::adamw);
    }
    add("norm", {2048}, param_group::adamw);
  } else if (name == "moe" || name == "moe-unstacked") {
    // 4 MoE layers of 8 experts, each expert's up [8192, 2048] and down [2048, 8192]: one 3-D
    // expert stack per layer and projection ("moe"), or the same matrices one by one.
    const bool stacked = name == "moe";
    for (int l = 0; l < 4; ++l) {
      const std::string p = "l" + std::to_string(l) + ".";
      add(p + "q", {2048, 2048}, param_group::muon);
      add(p + "kv", {1024, 2048}, param_group::muon);
      add(p + "o", {2048, 2048}, param_group::muon);
      for (const char* m : {"up", "down"}) {
        const std::vector<int64_t> shape = std::string(m) == "up"
                                               ? std::vector<int64_t>{8192, 2048}
                                               : std::vector<int64_t>{2048, 8192};
        if (stacked) {
          add(p + "experts." + m, {8, shape[0], shape[1]}, param_group::muon);
          continue;
        }
        for (int e = 0; e < 8; ++e)
          add(p + "experts." + std::to_string(e) + "." + m, shape, param_group::muon);
      }
      add(p + "norm", {2048}, param_group::adamw);
    }
  } else if (name == "tiny") {
    add("embed", {1000, 64}, param_group::adamw);
    for (int l = 0; l < 2; ++l) {
      add("w" + std::to_string(l), {64, 256}, param_group::muon);
      add("u" + std::to_string(l), {256, 64}, param_group::muon);
    }
  }
  return t;
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

expected<int64_t> add_table(engine& eng, const std::vector<param_spec>& table, tensor_map& grads) {
  int64_t total = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    int64_t n = 1;
    for (auto d : table[i].shape)
      n *= d;
    total += n;
    if (auto err = eng.add_parameter(table[i], random_floats(n, 100 + i, 0.04f)))
      return err;
    grads[table[i].name] = random_floats(n, 900 + i, 2e-3f);
  }
  return total;
}

std::map<std::string, int64_t> plan_bytes(const plan& pl, int rank, int gas, int muon_elem) {
  const int w = pl.world;
  std::map<std::string, int64_t> out;
  if (w == 1)
    return out;
  int64_t reduce = 0, gather = 0, scatter = 0;
  for (const auto& b : pl.buckets)
    reduce += b.shard_len * (w - 1);
  for (const auto& p : pl.params) {
    if (!p.muon)
      continue;
    for (const auto& b : p.blocks) {            // each NS block's own owner (experts, split blocks)
      const auto block = block_elements(p, b);  // not a structured binding: the lambda reads it
      auto part = [&](int q) {
        auto [first, last] = shard_part(p, q, block.first, block.second);
        return last - first;
      };
      if (b.owner != rank) {
        gather += part(rank);
      } else {
        for (int q = 0; q < w; ++q)
          if (q != rank)
            scatter += part(q);
      }
    }
  }
  out["reduce_scatter"] = int64_t{gas} * reduce * static_cast<int64_t>(sizeof(float));
  out["vote"] = (w - 1) * 2 * static_cast<int64_t>(sizeof(double));  // flag, sum of squares
  if (gather > 0)
    out["gather"] = gather * muon_elem;
  if (scatter > 0)
    out["scatter"] = scatter * muon_elem;
  return out;
}

double deepspeed_muon_bytes(const plan& pl, int elem) {
  double muon = 0;
  for (const auto& p : pl.params)
    if (p.muon)
      muon += static_cast<double>(p.numel);
  return 4.0 * muon * (pl.world - 1) / pl.world * elem;
}

}  // namespace zmuon::bench

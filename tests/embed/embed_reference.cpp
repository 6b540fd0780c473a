// The C++ engine's answer for the Python binding's test: runs a job given as files through the
// C++ API (engine::create(engine_options from the config), add_parameter, reduce(tensor_map),
// step, parameters) and writes the final parameters.
//
//   embed_reference CONFIG.json IN.safetensors OUT.safetensors
//
// IN holds "param/<name>" (initial values and shapes, in registration order) and
// "grad/<step>/<rank>/<micro>/<name>" (steps from 1; a missing gradient counts as zero); its
// metadata may set "group/<name>" = muon | adamw and "heads/<name>" = H. OUT holds
// "param/<name>" after the last step.
#include <cstdio>
#include <map>
#include <string>

#include "checkpoint/safetensors.hpp"
#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "embed_reference: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zmuon;
  if (argc != 4)
    return fail("usage: embed_reference CONFIG.json IN.safetensors OUT.safetensors");
  auto cfg = load_config_file(argv[1]);
  if (!cfg)
    return fail(cfg.err().to_string());
  std::map<std::string, std::string> meta;
  auto in = read_safetensors(argv[2], &meta);
  if (!in)
    return fail(in.err().to_string());
  auto eng = engine::create(cfg->engine);
  if (!eng)
    return fail(eng.err().to_string());

  std::vector<named_tensor> params;
  // grads[step][rank][micro] = tensor_map
  std::map<int, std::map<int, std::map<int, tensor_map>>> grads;
  for (auto& t : *in) {
    if (t.name.rfind("param/", 0) == 0) {
      param_spec spec{t.name.substr(6), t.shape};
      if (auto g = meta.find("group/" + spec.name); g != meta.end())
        spec.group = g->second == "muon" ? param_group::muon : param_group::adamw;
      if (auto h = meta.find("heads/" + spec.name); h != meta.end())
        spec.heads = std::stoll(h->second);
      if (auto err = (*eng)->add_parameter(spec, t.data))
        return fail(err.to_string());
      params.push_back(std::move(t));
    } else if (t.name.rfind("grad/", 0) == 0) {
      int step = 0, rank = 0, micro = 0, used = 0;
      if (std::sscanf(t.name.c_str(), "grad/%d/%d/%d/%n", &step, &rank, &micro, &used) != 3)
        return fail("bad gradient name '" + t.name + "'");
      grads[step][rank][micro][t.name.substr(used)] = std::move(t.data);
    } else {
      return fail("unexpected tensor '" + t.name + "'");
    }
  }
  for (auto& [step, by_rank] : grads) {
    int micros = static_cast<int>(by_rank.begin()->second.size());
    for (int k = 0; k < micros; ++k)  // micro-batch by micro-batch, every rank, like a host
      for (auto& [rank, by_micro] : by_rank)
        if (auto err = (*eng)->reduce(rank, by_micro[k]))
          return fail(err.to_string());
    auto info = (*eng)->step();
    if (!info)
      return fail(info.err().to_string());
  }
  auto final_params = (*eng)->parameters();
  if (!final_params)
    return fail(final_params.err().to_string());
  for (auto& p : params)
    p = {"param/" + p.name.substr(6), p.shape, final_params->at(p.name.substr(6))};
  if (auto err = write_safetensors(argv[3], params))
    return fail(err.to_string());
  return 0;
}

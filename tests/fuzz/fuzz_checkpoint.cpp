// libFuzzer target: the checkpoint reader's parsers, on arbitrary bytes: the safetensors shard
// parser (checkpoint/safetensors.cpp) and the manifest parser (checkpoint/checkpoint.cpp). Both
// must return a value or an error naming what is wrong; never crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> metadata;
  auto tensors = zmuon::parse_safetensors(bytes, "fuzz.safetensors", &metadata);
  if (tensors) {
    // What parsed must encode again (the writer's checks accept the reader's output).
    std::vector<zmuon::named_tensor> copy = *tensors;
    (void)zmuon::encode_safetensors(copy, metadata);
  }
  auto manifest = zmuon::parse_manifest(bytes, "fuzz/manifest.json");
  if (manifest)
    (void)zmuon::manifest_text(*manifest);
  return 0;
}

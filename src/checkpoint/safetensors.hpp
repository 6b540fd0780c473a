// Reading and writing fp32 tensors in the safetensors format (huggingface/safetensors):
//   [u64 little-endian N][N bytes of JSON header, space padded][raw little-endian tensor data]
// The header maps each name to {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}
// (offsets relative to the start of the data) and may hold "__metadata__": {string: string}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "zmuon/status.hpp"
#include "zmuon/tensor.hpp"

namespace zmuon {

/// Writes `tensors` in the given order, atomically: the file is written to
/// `path + ".tmp.<pid>"`, flushed and fsynced, renamed over `path`, and the directory fsynced, so
/// `path` holds either the old file or the complete new one. Fails with invalid_argument for an
/// empty, reserved ("__metadata__") or duplicate name, or a shape whose product is not the data
/// size; with io_error when the file cannot be written (the temporary file is then removed).
error write_safetensors(const std::string& path, const std::vector<named_tensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

/// A tensor the streaming writer reads where it is: `size` fp32 values at `data` (not owned; they
/// must stay valid during the call).
struct safetensors_view {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  size_t size = 0;
};

/// Writes `tensors` as write_safetensors does, straight from the caller's memory (no copy of the
/// data is made), and hands every piece written, in file order, to `observe` when given (a
/// checksum of the file, without reading it back). Returns the file's size in bytes.
expected<uint64_t> write_safetensors_views(
    const std::string& path, const std::vector<safetensors_view>& tensors,
    const std::map<std::string, std::string>& metadata = {},
    const std::function<void(const void* data, size_t bytes)>& observe = {});

/// Reads every tensor of the file, in the order of their data. Validates strictly and names what
/// is wrong: a missing or short file, a header length past the end of the file, a header that is
/// not JSON or not of the expected form, a dtype other than F32, a shape that does not match its
/// data_offsets, offsets out of order, overlapping, leaving gaps or pointing past the end of the
/// file, bytes after the last tensor. All are io_error. `metadata`, when given, receives
/// "__metadata__" (empty when the file has none).
expected<std::vector<named_tensor>> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

/// One tensor of a safetensors file: its shape and where its values lie in the file.
struct safetensors_entry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of its first byte, from the start of the file
  uint64_t count = 0;   // fp32 values
};

/// A safetensors file's tensors and metadata, from its header alone.
struct safetensors_index {
  std::vector<safetensors_entry> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

/// Reads only the length field and the header of the file at `path` and checks them, and the
/// layout of the data against the file's size, as read_safetensors does (every problem an
/// io_error naming the file, in the same words). The values stay on disk: checkpoints read the
/// ranges they need straight into a rank's state.
expected<safetensors_index> read_safetensors_index(const std::string& path);

/// The same checks on a file's bytes already in memory (checkpoints verify a checksum first; the
/// fuzz target feeds arbitrary bytes). `path` only names the file in error messages.
expected<std::vector<named_tensor>> parse_safetensors(
    const std::string& bytes, const std::string& path,
    std::map<std::string, std::string>* metadata = nullptr);

/// The bytes write_safetensors would write (the same checks), for callers that checksum them.
expected<std::string> encode_safetensors(const std::vector<named_tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

/// The whole content of a regular file of at most `most` bytes (invalid_argument naming the file
/// when larger, io_error when it is not a regular file), refused before it is read.
expected<std::string> read_file(const std::string& path, uint64_t most = UINT64_MAX);

/// Writes `bytes` to `path` atomically, as write_safetensors does.
error write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace zmuon

// safetensors I/O: bit-exact round trips, the on-disk layout, and a named error for every way a
// file can be broken or a write can fail.
#define BOOST_TEST_MODULE test_safetensors
#include <boost/test/unit_test.hpp>

#include <sys/stat.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "support/scratch_dir.hpp"

namespace fs = std::filesystem;
using zmuon::named_tensor;
using zmuon::test::scratch_dir;

namespace {

std::vector<named_tensor> sample_tensors() {
  float tiny = std::numeric_limits<float>::denorm_min();
  float nan_payload;
  uint32_t bits = 0x7fc12345u;
  std::memcpy(&nan_payload, &bits, sizeof bits);
  std::vector<named_tensor> tensors = {
      {"embed.weight", {2, 3}, {1.5f, -0.0f, tiny, INFINITY, -INFINITY, nan_payload}},
      {"mlp.fc1.bias", {5}, {}},
      {"scalar", {}, {3.25f}},
      {"empty", {0, 4}, {}},
      {"block.weight", {2, 2, 2}, {}},
  };
  for (int i = 0; i < 5; ++i)
    tensors[1].data.push_back(std::sin(0.3f * i) * 1e-3f);
  for (int i = 0; i < 8; ++i)
    tensors[4].data.push_back(std::numeric_limits<float>::max() / (i + 1));
  return tensors;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A hand-made file: the length field, `header` as is, then `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_bytes(path, bytes + header + std::string(data_bytes, '\0'));
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return n;
}

/// Reading `path` fails with io_error, and the message names the file and `problem`.
void expect_read_error(const std::string& path, const std::string& problem) {
  auto result = zmuon::read_safetensors(path);
  BOOST_TEST_REQUIRE(!result, "reading " << path << " succeeded; expected: " << problem);
  const zmuon::error& e = result.err();
  BOOST_TEST_MESSAGE(e.to_string());
  BOOST_TEST((e.code() == zmuon::errc::io_error));
  BOOST_TEST(e.message().find(path) != std::string::npos, e.message());
  BOOST_TEST(e.message().find(problem) != std::string::npos,
             "'" << e.message() << "' does not say '" << problem << "'");
  // The header-only reader (checkpoints) checks the same, in the same words.
  auto index = zmuon::read_safetensors_index(path);
  BOOST_TEST_REQUIRE(!index, "read_safetensors_index(" << path << ") succeeded");
  BOOST_TEST(index.err().to_string() == e.to_string());
}

/// A good file written by write_safetensors, and its bytes.
struct good_file {
  scratch_dir dir;
  std::string path = dir.file("model.safetensors");
  std::string bytes;
  good_file() {
    BOOST_TEST_REQUIRE(!zmuon::write_safetensors(path, sample_tensors(), {{"step", "12"}}));
    bytes = read_bytes(path);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact_and_keeps_order_and_metadata) {
  scratch_dir dir;
  std::string path = dir.file("a.safetensors");
  std::vector<named_tensor> tensors = sample_tensors();
  std::map<std::string, std::string> metadata = {{"step", "12"}, {"format", "pt"}};
  BOOST_TEST_REQUIRE(!zmuon::write_safetensors(path, tensors, metadata));
  std::map<std::string, std::string> read_metadata;
  auto read = zmuon::read_safetensors(path, &read_metadata);
  BOOST_TEST_REQUIRE(static_cast<bool>(read), (read ? "" : read.err().to_string()));
  BOOST_TEST(read_metadata == metadata);
  BOOST_TEST_REQUIRE(read->size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const named_tensor& got = (*read)[i];
    BOOST_TEST(got.name == tensors[i].name);
    BOOST_TEST(got.shape == tensors[i].shape);
    BOOST_TEST_REQUIRE(got.data.size() == tensors[i].data.size());
    // (memcmp of an empty vector's null data() is undefined: UBSan, .ci/sanitize asan)
    BOOST_TEST(
        (got.data.empty()
         || std::memcmp(got.data.data(), tensors[i].data.data(), got.data.size() * sizeof(float))
                == 0),
        tensors[i].name << " differs bitwise");
  }
  // No metadata written: none read back, and nothing left over from the writes.
  BOOST_TEST_REQUIRE(!zmuon::write_safetensors(path, tensors));
  read = zmuon::read_safetensors(path, &read_metadata);
  BOOST_TEST_REQUIRE(static_cast<bool>(read));
  BOOST_TEST(read_metadata.empty());
  BOOST_TEST(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

// The streaming writer (what checkpoints use: no copy of the state) writes the bytes the
// in-memory encoder makes, hands exactly those bytes to its observer in file order, and
// returns the file's size.
BOOST_AUTO_TEST_CASE(views_write_the_encoded_bytes_and_observe_them_in_order) {
  scratch_dir dir;
  const std::string path = dir.file("v.safetensors");
  const std::vector<named_tensor> tensors = sample_tensors();
  const std::map<std::string, std::string> metadata = {{"rank", "3"}};
  std::vector<zmuon::safetensors_view> views;
  for (const named_tensor& t : tensors)
    views.push_back({t.name, t.shape, t.data.data(), t.data.size()});
  std::string observed;
  auto size = zmuon::write_safetensors_views(path, views, metadata, [&](const void* p, size_t n) {
    observed.append(static_cast<const char*>(p), n);
  });
  BOOST_TEST_REQUIRE(static_cast<bool>(size), (size ? "" : size.err().to_string()));
  auto encoded = zmuon::encode_safetensors(tensors, metadata);
  BOOST_TEST_REQUIRE(static_cast<bool>(encoded));
  const std::string on_disk = read_bytes(path);
  BOOST_TEST(on_disk.size() == *size);
  BOOST_TEST((on_disk == *encoded), "the file differs from encode_safetensors' bytes");
  BOOST_TEST((observed == on_disk), "the observer saw other bytes than the file holds");
  // A view that claims values it does not point to is refused before anything is written.
  const std::string bad = dir.file("bad.safetensors");
  auto refused = zmuon::write_safetensors_views(bad, {{"w", {2}, nullptr, 2}});
  BOOST_TEST_REQUIRE(!refused);
  BOOST_TEST((refused.err().code() == zmuon::errc::invalid_argument));
  BOOST_TEST(refused.err().message().find("'w' has no data for its 2 values") != std::string::npos,
             refused.err().message());
  BOOST_TEST(!fs::exists(bad));
}

// The header-only reader says where each tensor's values lie: the file's bytes there are the
// values read_safetensors gives, bit for bit, in the same order, with the same metadata.
BOOST_AUTO_TEST_CASE(index_locates_every_tensor_in_the_file) {
  good_file f;
  auto whole = zmuon::read_safetensors(f.path);
  BOOST_TEST_REQUIRE(static_cast<bool>(whole));
  auto index = zmuon::read_safetensors_index(f.path);
  BOOST_TEST_REQUIRE(static_cast<bool>(index), (index ? "" : index.err().to_string()));
  BOOST_TEST((index->metadata == std::map<std::string, std::string>{{"step", "12"}}));
  BOOST_TEST_REQUIRE(index->tensors.size() == whole->size());
  for (size_t i = 0; i < whole->size(); ++i) {
    const zmuon::safetensors_entry& t = index->tensors[i];
    const named_tensor& want = (*whole)[i];
    BOOST_TEST(t.name == want.name);
    BOOST_TEST(t.shape == want.shape);
    BOOST_TEST_REQUIRE(t.count == want.data.size());
    BOOST_TEST_REQUIRE(t.offset + t.count * sizeof(float) <= f.bytes.size());
    BOOST_TEST(
        (t.count == 0
         || std::memcmp(f.bytes.data() + t.offset, want.data.data(), t.count * sizeof(float)) == 0),
        t.name << " is not where the index says");
  }
}

BOOST_AUTO_TEST_CASE(header_is_padded_json_with_contiguous_offsets) {
  good_file f;
  uint64_t n = header_length(f.bytes);
  BOOST_TEST(n % 8 == 0);
  BOOST_TEST_REQUIRE(8 + n <= f.bytes.size());
  nlohmann::json header = nlohmann::json::parse(f.bytes.substr(8, n));
  BOOST_TEST(header["__metadata__"]["step"] == "12");
  uint64_t offset = 0;
  for (const named_tensor& t : sample_tensors()) {
    const nlohmann::json& entry = header.at(t.name);
    BOOST_TEST(entry["dtype"] == "F32");
    BOOST_TEST(entry["shape"].get<std::vector<int64_t>>() == t.shape);
    uint64_t end = offset + t.data.size() * sizeof(float);
    BOOST_TEST(entry["data_offsets"] == nlohmann::json({offset, end}), t.name);
    BOOST_TEST((t.data.empty()
                || std::memcmp(f.bytes.data() + 8 + n + offset, t.data.data(), end - offset) == 0));
    offset = end;
  }
  BOOST_TEST(f.bytes.size() == 8 + n + offset);
}

BOOST_AUTO_TEST_CASE(missing_and_short_files) {
  scratch_dir dir;
  expect_read_error(dir.file("absent.safetensors"), "No such file");
  write_bytes(dir.file("short"), "abcde");
  expect_read_error(dir.file("short"), "shorter than the 8-byte header length");
  expect_read_error(dir.path().string(), "not a regular file");
}

BOOST_AUTO_TEST_CASE(header_length_past_the_end_is_a_truncated_file) {
  good_file f;
  write_bytes(f.path, f.bytes.substr(0, 8 + header_length(f.bytes) - 3));
  expect_read_error(f.path, "truncated file");
}

BOOST_AUTO_TEST_CASE(truncated_data_is_named) {
  good_file f;
  write_bytes(f.path, f.bytes.substr(0, f.bytes.size() - 4));
  expect_read_error(f.path, "past the end of the file");
  expect_read_error(f.path, "truncated data");
  expect_read_error(f.path, "block.weight");
}

BOOST_AUTO_TEST_CASE(trailing_bytes_are_named) {
  good_file f;
  write_bytes(f.path, f.bytes + "tail");
  expect_read_error(f.path, "4 trailing bytes");
}

BOOST_AUTO_TEST_CASE(invalid_json_is_named) {
  good_file f;
  std::string corrupt = f.bytes;
  corrupt[8] = '#';  // the opening brace
  write_bytes(f.path, corrupt);
  expect_read_error(f.path, "not valid JSON");
  write_raw(f.path, "[1, 2]  ", 0);
  expect_read_error(f.path, "not a JSON object");
  write_raw(f.path, "", 0);
  expect_read_error(f.path, "not valid JSON");
  // Nested past any real header: refused before it is built (a stack overflow before).
  write_raw(f.path, R"({"w": )" + std::string(100000, '[') + std::string(100000, ']') + "}", 0);
  expect_read_error(f.path, "header nests deeper than 100 levels");
}

BOOST_AUTO_TEST_CASE(malformed_entries_are_named) {
  scratch_dir dir;
  std::string path = dir.file("bad.safetensors");
  write_raw(path, R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path, "dtype F16");
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_read_error(path, "does not match data_offsets");
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8);
  expect_read_error(path, "out of order");
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}})", 8);
  expect_read_error(path, "data_offsets is not a pair");
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
  expect_read_error(path, "shape [-2]");
  write_raw(path, R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", 8);
  expect_read_error(path, "shape");
  write_raw(path, R"({"w": 3})", 0);
  expect_read_error(path, "'w'");
  write_raw(path, R"({"__metadata__": {"step": 12}})", 0);
  expect_read_error(path, "__metadata__ value of 'step'");
  write_raw(path,
            R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            8);
  expect_read_error(path, "'w' twice");
}

BOOST_AUTO_TEST_CASE(overlaps_and_gaps_are_named) {
  scratch_dir dir;
  std::string path = dir.file("bad.safetensors");
  write_raw(path,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            12);
  expect_read_error(path, "overlaps tensor 'a'");
  write_raw(path,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
            20);
  expect_read_error(path, "gap of 4 bytes before tensor 'b'");
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  expect_read_error(path, "gap of 4 bytes before tensor 'a'");
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4);
  expect_read_error(path, "truncated data");
}

BOOST_AUTO_TEST_CASE(bad_tensors_are_refused_before_writing) {
  scratch_dir dir;
  std::string path = dir.file("w.safetensors");
  std::vector<named_tensor> twice = {{"w", {1}, {1.0f}}, {"w", {1}, {2.0f}}};
  zmuon::error e = zmuon::write_safetensors(path, twice);
  BOOST_TEST((e.code() == zmuon::errc::invalid_argument));
  BOOST_TEST(e.message().find("'w' is given twice") != std::string::npos, e.message());
  e = zmuon::write_safetensors(path, {{"v", {2, 3}, {1.0f, 2.0f}}});
  BOOST_TEST((e.code() == zmuon::errc::invalid_argument));
  BOOST_TEST(e.message().find("'v' has shape [2, 3] but 2 values") != std::string::npos,
             e.message());
  e = zmuon::write_safetensors(path, {{"__metadata__", {1}, {1.0f}}});
  BOOST_TEST((e.code() == zmuon::errc::invalid_argument));
  BOOST_TEST(!fs::exists(path));
  BOOST_TEST(fs::is_empty(dir.path()));
}

BOOST_AUTO_TEST_CASE(writing_into_a_missing_directory_fails_cleanly) {
  scratch_dir dir;
  std::string path = dir.file("no/such/dir/w.safetensors");
  zmuon::error e = zmuon::write_safetensors(path, sample_tensors());
  BOOST_TEST_MESSAGE(e.to_string());
  BOOST_TEST((e.code() == zmuon::errc::io_error));
  BOOST_TEST(e.message().find(path) != std::string::npos, e.message());
  BOOST_TEST(fs::is_empty(dir.path()));
}

// The write renames over `path`: a directory or a device there is refused before a temporary
// file is made, and left as it was: a rename over /dev/full would replace the device with a
// regular file, and a non-empty directory would fail only at the rename.
BOOST_AUTO_TEST_CASE(writing_over_what_is_not_a_regular_file_is_refused) {
  scratch_dir dir;
  const std::string fifo = dir.file("pipe"), sub = dir.file("sub");
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  fs::create_directory(sub);
  for (const auto& [path, what] :
       {std::pair{fifo, "is not a regular file"}, std::pair{sub, "is a directory"}}) {
    zmuon::error e = zmuon::write_safetensors(path, sample_tensors());
    BOOST_TEST((e.code() == zmuon::errc::invalid_argument), e.to_string());
    BOOST_TEST(e.message().find("'" + path + "' " + what) != std::string::npos, e.message());
  }
  BOOST_TEST(fs::is_fifo(fifo));
  BOOST_TEST(fs::is_directory(sub));
  BOOST_TEST(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
}

BOOST_AUTO_TEST_CASE(an_interrupted_write_leaves_the_existing_file_alone) {
  good_file f;
  // A writer that died between creating its temporary file and renaming it.
  std::string leftover = f.path + ".tmp.999999";
  write_bytes(leftover, f.bytes.substr(0, 100));
  BOOST_TEST(read_bytes(f.path) == f.bytes);
  BOOST_TEST(static_cast<bool>(zmuon::read_safetensors(f.path)));
  // The next write replaces the file whole and does not trip over the leftover.
  std::vector<named_tensor> next = {{"only", {2}, {7.0f, 8.0f}}};
  BOOST_TEST_REQUIRE(!zmuon::write_safetensors(f.path, next));
  auto read = zmuon::read_safetensors(f.path);
  BOOST_TEST_REQUIRE(static_cast<bool>(read));
  BOOST_TEST_REQUIRE(read->size() == 1u);
  BOOST_TEST((*read)[0].data == next[0].data);
  BOOST_TEST(read_bytes(leftover) == f.bytes.substr(0, 100));
}

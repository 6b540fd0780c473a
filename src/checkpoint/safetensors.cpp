// safetensors I/O for fp32 tensors: an atomic writer and a strict reader.
#include "checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "base/json_text.hpp"

namespace zmuon {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies host memory as is");

using header_json = nlohmann::ordered_json;  // keeps the header in data order

const char* const metadata_key = "__metadata__";

/// Closes the descriptor it owns.
class file_descriptor {
public:
  explicit file_descriptor(int fd) : fd_(fd) {}
  ~file_descriptor() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Gives the descriptor up (the caller closes it).
  int release() { return std::exchange(fd_, -1); }
  /// Closes now, reporting the error that a deferred write may only show here.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

private:
  int fd_;
};

std::string in_quotes(const std::string& text) {
  return "'" + text + "'";
}

error io_failure(const std::string& what, const std::string& path) {
  return {errc::io_error, what + " " + in_quotes(path) + ": " + std::strerror(errno)};
}

error bad_file(const std::string& path, const std::string& what) {
  return {errc::io_error, in_quotes(path) + ": " + what};
}

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

/// Reads exactly `size` bytes at `offset`; false on an error or an early end of file.
bool read_all(int fd, void* data, size_t size, uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

/// Opens `path` for reading and gives its size; io_error naming the file when it cannot be
/// opened or is not a regular file. Opened without blocking: a FIFO planted there is refused,
/// not waited on. The caller owns the returned descriptor.
expected<int> open_regular(const std::string& path, uint64_t& size) {
  file_descriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid())
    return io_failure("cannot open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return io_failure("cannot stat", path);
  if (!S_ISREG(st.st_mode))
    return bad_file(path, "not a regular file");
  size = static_cast<uint64_t>(st.st_size);
  return fd.release();
}

/// Product of the dimensions, or false when one is negative or the product overflows u64.
bool element_count(const std::vector<int64_t>& shape, uint64_t& count) {
  count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count))
      return false;
  }
  return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string directory_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::vector<safetensors_view> views_of(const std::vector<named_tensor>& tensors) {
  std::vector<safetensors_view> views;
  views.reserve(tensors.size());
  for (const named_tensor& t : tensors)
    views.push_back({t.name, t.shape, t.data.data(), t.data.size()});
  return views;
}

/// The 8-byte little-endian length that starts the file.
std::string length_field(uint64_t length) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>(length >> (8 * i));
  return bytes;
}

/// Checks the tensors and builds the header, padded with spaces to a multiple of 8 bytes.
expected<std::string> make_header(const std::vector<safetensors_view>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  header_json header = header_json::object();
  if (!metadata.empty())
    header[metadata_key] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const safetensors_view& t : tensors) {
    if (t.name.empty() || t.name == metadata_key)
      return error{errc::invalid_argument, "tensor name " + in_quotes(t.name) + " is reserved"};
    if (!names.insert(t.name).second)
      return error{errc::invalid_argument, "tensor " + in_quotes(t.name) + " is given twice"};
    uint64_t count = 0;
    if (!element_count(t.shape, count) || count != t.size)
      return error{errc::invalid_argument, "tensor " + in_quotes(t.name) + " has shape "
                                               + shape_string(t.shape) + " but "
                                               + std::to_string(t.size) + " values"};
    if (t.size > 0 && t.data == nullptr)
      return error{errc::invalid_argument, "tensor " + in_quotes(t.name) + " has no data for its "
                                               + std::to_string(t.size) + " values"};
    uint64_t end = offset + count * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a name or metadata
    return error{errc::invalid_argument, std::string("cannot encode the header: ") + e.what()};
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

using observer = std::function<void(const void*, size_t)>;

/// Writes the whole file to an open descriptor, each piece also to `observe`, and syncs it.
error write_contents(int fd, const std::string& tmp_path, const std::string& header,
                     const std::vector<safetensors_view>& tensors, const observer& observe) {
  const auto put = [&](const void* data, size_t bytes) {
    if (!write_all(fd, data, bytes))
      return false;
    if (observe)
      observe(data, bytes);
    return true;
  };
  const std::string length = length_field(header.size());
  if (!put(length.data(), length.size()) || !put(header.data(), header.size()))
    return io_failure("cannot write", tmp_path);
  for (const safetensors_view& t : tensors)
    if (!put(t.data, t.size * sizeof(float)))
      return io_failure("cannot write tensor " + in_quotes(t.name) + " to", tmp_path);
  if (::fsync(fd) != 0)
    return io_failure("cannot fsync", tmp_path);
  return {};
}

/// One tensor's header entry, checked against the format.
struct entry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

expected<entry> parse_entry(const std::string& path, const std::string& name,
                            const header_json& value) {
  auto bad = [&](const std::string& what) {
    return bad_file(path, "tensor " + in_quotes(name) + ": " + what);
  };
  if (!value.is_object())
    return bad("header entry is not a JSON object");
  auto dtype = value.find("dtype");
  auto shape = value.find("shape");
  auto offsets = value.find("data_offsets");
  if (dtype == value.end() || !dtype->is_string())
    return bad("missing or non-string dtype");
  if (*dtype != "F32")
    return bad("dtype " + dtype->get<std::string>() + " is not supported (only F32)");
  if (shape == value.end() || !shape->is_array())
    return bad("missing or non-array shape");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2
      || !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    return bad("data_offsets is not a pair of non-negative integers");
  entry e;
  e.name = name;
  for (const header_json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return bad("shape " + shape->dump() + " holds something other than a dimension");
    e.shape.push_back(d.get<int64_t>());
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  if (e.begin > e.end)
    return bad("data_offsets " + offsets->dump() + " are out of order");
  uint64_t count = 0;
  if (!element_count(e.shape, count) || count > UINT64_MAX / sizeof(float)
      || count * sizeof(float) != e.end - e.begin)
    return bad("shape " + shape->dump() + " does not match data_offsets " + offsets->dump() + " ("
               + std::to_string(e.end - e.begin) + " bytes)");
  return e;
}

/// Parses the header into tensor entries sorted by offset, and the metadata.
expected<std::vector<entry>> parse_header(const std::string& path, const std::string& text,
                                          std::map<std::string, std::string>& metadata) {
  // The DOM keeps only the last of repeated keys; the callback sees every top-level key.
  std::string repeated;
  std::set<std::string> seen;
  auto watch_keys = [&](int depth, header_json::parse_event_t event, header_json& parsed) {
    if (depth == 1 && event == header_json::parse_event_t::key && repeated.empty()
        && !seen.insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  if (json_too_deep_at(text) != std::string::npos)  // before anything walks it recursively
    return bad_file(path, "header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  header_json header;
  try {
    header = header_json::parse(text, watch_keys);
  } catch (const nlohmann::json::exception& e) {
    return bad_file(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object())
    return bad_file(path, "header is not a JSON object");
  if (!repeated.empty())
    return bad_file(path, "header names " + in_quotes(repeated) + " twice");
  std::vector<entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == metadata_key) {
      if (!value.is_object())
        return bad_file(path, "__metadata__ is not a JSON object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string())
          return bad_file(path, "__metadata__ value of " + in_quotes(key) + " is not a string");
        metadata[key] = text_value.get<std::string>();
      }
      continue;
    }
    expected<entry> e = parse_entry(path, name, value);
    if (!e)
      return e.err();
    entries.push_back(std::move(*e));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  return entries;
}

/// The data must be covered exactly: no gap, no overlap, nothing past the end, nothing after.
error check_layout(const std::string& path, const std::vector<entry>& entries, uint64_t data_size) {
  uint64_t covered = 0;
  const entry* previous = nullptr;
  for (const entry& e : entries) {
    std::string where = "tensor " + in_quotes(e.name) + " at data bytes [" + std::to_string(e.begin)
                        + ", " + std::to_string(e.end) + ")";
    if (e.begin < covered)
      return bad_file(path, where + " overlaps tensor " + in_quotes(previous->name) + " ending at "
                                + std::to_string(covered));
    if (e.begin > covered)
      return bad_file(path,
                      "gap of " + std::to_string(e.begin - covered) + " bytes before " + where);
    if (e.end > data_size)
      return bad_file(path, where + " points past the end of the file, which holds "
                                + std::to_string(data_size) + " data bytes (truncated data)");
    covered = e.end;
    previous = &e;
  }
  if (covered < data_size)
    return bad_file(path,
                    std::to_string(data_size - covered) + " trailing bytes after the last tensor");
  return {};
}

/// A file's tensors (offsets within its data), metadata and where the data starts.
struct file_index {
  std::vector<entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

/// Reads and checks the length field and header of a file of `file_size` bytes, whose bytes
/// [offset, offset + n) `bytes_at(offset, n)` gives, and the layout of its data.
template <class BytesAt>
expected<file_index> index_of(const std::string& path, uint64_t file_size, BytesAt&& bytes_at) {
  if (file_size < 8)
    return bad_file(path, "file is " + std::to_string(file_size)
                              + " bytes, shorter than the 8-byte header length");
  expected<std::string> length = bytes_at(0, 8);
  if (!length)
    return length.err();
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= static_cast<uint64_t>(static_cast<unsigned char>((*length)[i])) << (8 * i);
  if (header_size > file_size - 8)
    return bad_file(path, "header length " + std::to_string(header_size) + " exceeds the "
                              + std::to_string(file_size - 8)
                              + " bytes after the length field (truncated file)");
  expected<std::string> header = bytes_at(8, header_size);
  if (!header)
    return header.err();
  file_index index;
  expected<std::vector<entry>> entries = parse_header(path, *header, index.metadata);
  if (!entries)
    return entries.err();
  index.entries = std::move(*entries);
  index.data_start = 8 + header_size;
  if (error err = check_layout(path, index.entries, file_size - index.data_start))
    return err;
  return index;
}

/// Writes `path` through `path + ".tmp.<pid>"`: `fill` writes and fsyncs the temporary file,
/// which is then renamed over `path`, and the directory fsynced, so `path` holds either the old
/// file or the complete new one. The temporary file is removed on failure.
template <class Fill>
error write_atomically(const std::string& path, Fill&& fill) {
  // The rename would replace whatever `path` is: only a regular file (or nothing) may be.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return {errc::invalid_argument,
            in_quotes(path) + " is " + (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file")
                + ": a safetensors file is written by replacing it, so it must be a regular "
                  "file or not exist"};
  // A new file, never one planted there: a symbolic link at the name is refused, not followed.
  std::string tmp_path = path + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp_path.c_str());  // a stale one of an earlier process with this pid
  file_descriptor fd(
      ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid())
    return io_failure("cannot create", tmp_path);
  error err = fill(fd.get(), tmp_path);
  if (!err && fd.close() != 0)
    err = io_failure("cannot close", tmp_path);
  if (!err && ::rename(tmp_path.c_str(), path.c_str()) != 0)
    err = io_failure("cannot rename " + in_quotes(tmp_path) + " to", path);
  if (err) {
    ::unlink(tmp_path.c_str());
    return err;
  }
  // The rename is durable only once the directory entry is.
  std::string dir = directory_of(path);
  file_descriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid() || ::fsync(dir_fd.get()) != 0)
    return io_failure("cannot fsync directory", dir);
  return {};
}

}  // namespace

expected<uint64_t> write_safetensors_views(const std::string& path,
                                           const std::vector<safetensors_view>& tensors,
                                           const std::map<std::string, std::string>& metadata,
                                           const observer& observe) {
  expected<std::string> header = make_header(tensors, metadata);
  if (!header)
    return header.err();
  uint64_t size = 8 + header->size();
  for (const safetensors_view& t : tensors)
    size += t.size * sizeof(float);
  if (error err = write_atomically(path, [&](int fd, const std::string& tmp_path) {
        return write_contents(fd, tmp_path, *header, tensors, observe);
      }))
    return err;
  return size;
}

error write_safetensors(const std::string& path, const std::vector<named_tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  expected<uint64_t> written = write_safetensors_views(path, views_of(tensors), metadata);
  return written ? error{} : written.err();
}

expected<std::string> encode_safetensors(const std::vector<named_tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  expected<std::string> header = make_header(views_of(tensors), metadata);
  if (!header)
    return header.err();
  std::string bytes = length_field(header->size()) + *header;
  for (const named_tensor& t : tensors)
    bytes.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
  return bytes;
}

expected<std::vector<named_tensor>> parse_safetensors(
    const std::string& bytes, const std::string& path,
    std::map<std::string, std::string>* metadata) {
  expected<file_index> index =
      index_of(path, bytes.size(), [&](uint64_t offset, uint64_t n) -> expected<std::string> {
        return bytes.substr(offset, n);
      });
  if (!index)
    return index.err();
  std::vector<named_tensor> tensors;
  tensors.reserve(index->entries.size());
  for (const entry& e : index->entries) {
    named_tensor t{e.name, e.shape, std::vector<float>((e.end - e.begin) / sizeof(float))};
    if (e.end > e.begin)
      std::memcpy(t.data.data(), bytes.data() + index->data_start + e.begin, e.end - e.begin);
    tensors.push_back(std::move(t));
  }
  if (metadata)
    *metadata = std::move(index->metadata);
  return tensors;
}

expected<std::string> read_file(const std::string& path, uint64_t most) {
  uint64_t size = 0;
  expected<int> opened = open_regular(path, size);
  if (!opened)
    return opened.err();
  file_descriptor fd(*opened);
  if (size > most)
    return bad_file(path, "holds " + std::to_string(size) + " bytes, more than the "
                              + std::to_string(most) + " it may");
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!read_all(fd.get(), bytes.data(), bytes.size(), 0))
    return io_failure("cannot read", path);
  return bytes;
}

expected<std::vector<named_tensor>> read_safetensors(const std::string& path,
                                                     std::map<std::string, std::string>* metadata) {
  expected<std::string> bytes = read_file(path);
  if (!bytes)
    return bytes.err();
  return parse_safetensors(*bytes, path, metadata);
}

expected<safetensors_index> read_safetensors_index(const std::string& path) {
  uint64_t size = 0;
  expected<int> opened = open_regular(path, size);
  if (!opened)
    return opened.err();
  file_descriptor fd(*opened);
  expected<file_index> index =
      index_of(path, size, [&](uint64_t offset, uint64_t n) -> expected<std::string> {
        std::string bytes(static_cast<size_t>(n), '\0');
        if (!read_all(fd.get(), bytes.data(), bytes.size(), offset))
          return io_failure("cannot read", path);
        return bytes;
      });
  if (!index)
    return index.err();
  safetensors_index out;
  out.metadata = std::move(index->metadata);
  for (const entry& e : index->entries)
    out.tensors.push_back(
        {e.name, e.shape, index->data_start + e.begin, (e.end - e.begin) / sizeof(float)});
  return out;
}

error write_file_atomically(const std::string& path, const std::string& bytes) {
  return write_atomically(path, [&](int fd, const std::string& tmp_path) -> error {
    if (!write_all(fd, bytes.data(), bytes.size()))
      return io_failure("cannot write", tmp_path);
    if (::fsync(fd) != 0)
      return io_failure("cannot fsync", tmp_path);
    return {};
  });
}

}  // namespace zmuon

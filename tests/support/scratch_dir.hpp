// A fresh temporary directory for a test's files, removed with everything in it at the end of
// the test (real files: checkpoints, safetensors, timelines).
#pragma once

#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <string>
#include <system_error>

namespace zmuon::test {

class scratch_dir {
public:
  scratch_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "zmuon_test_XXXXXX").string();
    BOOST_TEST_REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
  std::filesystem::path path_;
};

}  // namespace zmuon::test

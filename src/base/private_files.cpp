#include "base/private_files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zmuon {

namespace {

std::string why() {
  return std::strerror(errno);
}

error write_all(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return {errc::io_error, "cannot write '" + path + "': " + why()};
    done += static_cast<size_t>(n);
  }
  return {};
}

std::string random_suffix() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

}  // namespace

expected<std::string> make_private_dir(const std::string& prefix, const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string templ = base + "/" + prefix + "XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return error{errc::io_error, "cannot make a private directory in '" + base + "': " + why()};
  return templ;  // mkdtemp makes it 0700
}

error write_new_file(const std::string& path, const std::string& text, unsigned mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        static_cast<mode_t>(mode));
  if (fd < 0)
    return {errc::io_error, "cannot create '" + path + "' (it must not exist yet): " + why()};
  error failed = write_all(fd, text, path);
  if (!failed && ::fsync(fd) != 0)
    failed = {errc::io_error, "cannot write '" + path + "': " + why()};
  ::close(fd);
  if (failed)
    ::unlink(path.c_str());
  return failed;
}

error replace_file(const std::string& path, const std::string& text, unsigned mode) {
  const std::string tmp = path + ".tmp." + random_suffix();
  if (auto err = write_new_file(tmp, text, mode))
    return err;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error failed{errc::io_error, "cannot rename '" + tmp + "' to '" + path + "': " + why()};
    ::unlink(tmp.c_str());
    return failed;
  }
  return {};
}

expected<std::string> read_regular_file(const std::string& path, size_t most,
                                        const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return error{errc::io_error, "cannot open " + what + ": " + why()};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return error{errc::io_error, "cannot read " + what + ": " + why()};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return error{errc::invalid_argument, what + " is not a regular file"};
  }
  if (static_cast<unsigned long long>(st.st_size) > most) {
    ::close(fd);
    return error{errc::invalid_argument, what + " holds " + std::to_string(st.st_size)
                                             + " bytes, more than the " + std::to_string(most)
                                             + " it may"};
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      ::close(fd);
      return error{errc::io_error, "cannot read " + what + ": " + why()};
    }
    if (n == 0)
      break;  // shrank while read
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

void remove_private_dir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..")
        ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace zmuon

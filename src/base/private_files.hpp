// Files that another user of the machine must not redirect, read or block on: a private
// directory, files created only if new (never through a symbolic link), and a reader that refuses
// what is not a regular file or is larger than expected, before it reads a byte.
#pragma once

#include <cstddef>
#include <string>

#include "zmuon/status.hpp"

namespace zmuon {

/// A new directory `parent`/`prefix`XXXXXX (mkdtemp) that only this user can enter (0700).
/// `parent` empty: $TMPDIR, else /tmp.
expected<std::string> make_private_dir(const std::string& prefix, const std::string& parent = {});

/// Writes `text` to `path`, which must not exist yet: O_CREAT | O_EXCL | O_NOFOLLOW, mode `mode`.
/// A planted file or symbolic link is an error, never overwritten or followed.
error write_new_file(const std::string& path, const std::string& text, unsigned mode = 0600);

/// Writes `text` to `path` atomically: a new temporary file next to it (write_new_file, a random
/// name), then rename. A reader never sees half of it; a link at the temporary name is refused.
error replace_file(const std::string& path, const std::string& text, unsigned mode = 0644);

/// The bytes of the regular file at `path`, at most `most` of them. Opened without blocking (a
/// FIFO never hangs the reader) and refused before reading when it is not a regular file or is
/// larger than `most`. Errors name `what` ("checkpoint pointer 'DIR/latest'").
expected<std::string> read_regular_file(const std::string& path, size_t most,
                                        const std::string& what);

/// Removes `dir` and the files directly in it (no recursion into subdirectories).
void remove_private_dir(const std::string& dir);

}  // namespace zmuon

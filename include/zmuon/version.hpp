// The library's version: the CMake project's, e.g. "0.1.0" (zmuon_version() in the C ABI, the
// tools' --version).
#pragma once

namespace zmuon {

const char* version();

}  // namespace zmuon

#include "zmuon/version.hpp"

namespace zmuon {

const char* version() {
  return ZMUON_VERSION_STRING;  // the CMake project's version (src/base/CMakeLists.txt)
}

}  // namespace zmuon

# Finds Debian's CAF 0.17 (libcaf-dev), which ships no CMake package, no pkg-config file and no
# caf-config script. Defines CAF::core, CAF::io and CAF::openssl (upstream CAF >= 0.18 uses the same names).
include(FindPackageHandleStandardArgs)

find_path(CAF_INCLUDE_DIR NAMES caf/all.hpp)
find_library(CAF_CORE_LIBRARY NAMES caf_core)
find_library(CAF_IO_LIBRARY NAMES caf_io)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _zm_caf_line REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE ".*CAF_VERSION ([0-9]+).*" "\\1" _zm_caf_num "${_zm_caf_line}")
  math(EXPR _zm_major "${_zm_caf_num} / 10000")
  math(EXPR _zm_minor "(${_zm_caf_num} / 100) % 100")
  math(EXPR _zm_patch "${_zm_caf_num} % 100")
  set(CAF_VERSION "${_zm_major}.${_zm_minor}.${_zm_patch}")
endif()

foreach(_zm_comp IN LISTS CAF_FIND_COMPONENTS)
  string(TOUPPER "${_zm_comp}" _zm_upper)
  if(CAF_${_zm_upper}_LIBRARY)
    set(CAF_${_zm_comp}_FOUND TRUE)
  endif()
endforeach()

find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)

if(CAF_FOUND)
  find_package(Threads REQUIRED)
  if(NOT TARGET CAF::core)
    add_library(CAF::core SHARED IMPORTED)
    set_target_properties(CAF::core PROPERTIES
      IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
  if(CAF_IO_LIBRARY AND NOT TARGET CAF::io)
    add_library(CAF::io SHARED IMPORTED)
    set_target_properties(CAF::io PROPERTIES
      IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
  if(CAF_OPENSSL_LIBRARY AND NOT TARGET CAF::openssl)
    add_library(CAF::openssl SHARED IMPORTED)
    set_target_properties(CAF::openssl PROPERTIES
      IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)

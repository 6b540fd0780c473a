# Unit tests of the compute backends' kernels against double-precision references.
zmuon_add_test(test_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_kernels.cpp LIBS zmuon_kernels)
zmuon_add_test(test_ns_variants SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ns_variants.cpp
  LIBS zmuon_kernels)

# GPU tests of the CUDA backend (label `gpu`). Without a usable GPU the executable exits with 77
# before running anything, which ctest reports as "Skipped", not "Passed".
if(TARGET zmuon_cuda)
  zmuon_add_test(test_cuda_kernels
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_kernels.cpp
    LIBS zmuon_kernels
    LABEL gpu)
  set_tests_properties(test_cuda_kernels PROPERTIES SKIP_RETURN_CODE 77)
endif()

# The whole engine on CUDA against the host backend, and the core contract's tests on CUDA.
if(TARGET zmuon_cuda)
  zmuon_add_test(test_engine_cuda
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_cuda.cpp
    LIBS zmuon_train
    LABEL gpu)
  set_tests_properties(test_engine_cuda PROPERTIES SKIP_RETURN_CODE 77)
endif()

# GPU tests of the CUDA backend (label `gpu`). Without a usable GPU each executable exits with 77
# before running anything, which ctest reports as "Skipped", not "Passed".
# Further sources of the same executable follow `lib`.
function(zmuon_add_gpu_test name lib)
  list(TRANSFORM ARGN PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/ OUTPUT_VARIABLE more)
  zmuon_add_test(${name} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/${name}.cpp ${more} LIBS ${lib}
                 LABEL gpu)
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
endfunction()

if(TARGET zmuon_cuda)
  # every kernel against the host backend
  zmuon_add_gpu_test(test_cuda_kernels zmuon_kernels test_cuda_newton_schulz.cpp)
  zmuon_add_gpu_test(test_engine_cuda "zmuon_train;zmuon_node" test_engine_cuda_handover.cpp
                     test_engine_cuda_trace.cpp)
  # the engine on CUDA vs host, the core contract, the hand-over of device gradients, a node
  # Newton-Schulz on its own (zmuon::orthogonalizer) on device memory vs the host, through libzmuon
  zmuon_add_gpu_test(test_orthogonalize_cuda "zmuon;CUDA::cudart")
  target_include_directories(test_orthogonalize_cuda PRIVATE ${PROJECT_SOURCE_DIR})
endif()

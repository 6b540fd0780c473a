# The optional CUDA backend (src/kernels/cuda/): included from the top-level CMakeLists.txt before
# add_subdirectory(src). ZMUON_CUDA is AUTO (build it when nvcc is found), ON (required) or
# OFF. The build needs no GPU; only the tests labelled `gpu` do, and they skip themselves
# without one. Sets ZMUON_HAVE_CUDA_BUILD and defines the targets zmuon_cuda and NCCL::nccl.

set(ZMUON_HAVE_CUDA_BUILD OFF)
string(TOUPPER "${ZMUON_CUDA}" _zmuon_cuda_mode)
if(NOT _zmuon_cuda_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "ZMUON_CUDA must be AUTO, ON or OFF (got '${ZMUON_CUDA}')")
endif()
if(_zmuon_cuda_mode MATCHES "^(OFF|FALSE|NO|0)$")
  message(STATUS "zmuon: CUDA backend off (ZMUON_CUDA=${ZMUON_CUDA})")
  return()
endif()
set(_zmuon_cuda_required OFF)
if(NOT _zmuon_cuda_mode STREQUAL "AUTO")
  set(_zmuon_cuda_required ON)
endif()

# Where nvcc is: an explicit CMAKE_CUDA_COMPILER, else the toolkit's standard place, else PATH.
if(NOT CMAKE_CUDA_COMPILER)
  find_program(ZMUON_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME ENV CUDA_PATH
               PATH_SUFFIXES bin)
  if(ZMUON_NVCC)
    set(CMAKE_CUDA_COMPILER "${ZMUON_NVCC}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()
if(NOT CMAKE_CUDA_COMPILER)
  if(_zmuon_cuda_required)
    message(FATAL_ERROR "ZMUON_CUDA=${ZMUON_CUDA} but nvcc was not found "
                        "(looked in /usr/local/cuda/bin, $CUDA_HOME and PATH)")
  endif()
  message(STATUS "zmuon: nvcc not found, CUDA backend off")
  return()
endif()

# A fat binary: SASS for the common architectures and PTX for the newest, so that every device
# nvcc 13.0 knows (compute_75 to compute_121) runs it. SASS runs on later minor revisions of its
# major one (sm_80 on 8.7, sm_86 on 8.8, sm_100 on 10.3, sm_120 on 12.1), PTX is compiled by the
# driver for any later device. tests/packaging/cuda_archs_check.py checks the binary against
# `nvcc --list-gpu-arch`. The own Hopper GEMM is built for sm_90a on its own whatever this says
# (src/kernels/cuda/CMakeLists.txt). Developers on one GPU may build for it alone, e.g.
# -DZMUON_CUDA_ARCHS=90-real (CMake's CUDA_ARCHITECTURES syntax: NN-real SASS, NN-virtual PTX,
# NN both). The runtime is the shared libcudart, like cuBLAS and NCCL.
set(ZMUON_CUDA_ARCHS_DEFAULT "75-real;80-real;86-real;89-real;90-real;100-real;110-real;120")
set(ZMUON_CUDA_ARCHS "${ZMUON_CUDA_ARCHS_DEFAULT}" CACHE STRING
    "CUDA architectures of the CUDA backend (CMake CUDA_ARCHITECTURES syntax)")
set(CMAKE_CUDA_ARCHITECTURES "${ZMUON_CUDA_ARCHS}")
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# NCCL ships inside this toolkit (include/nccl.h, lib/libnccl.so); elsewhere it may sit in the
# system's directories or under NCCL_HOME.
find_path(ZMUON_NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
  PATH_SUFFIXES include)
find_library(ZMUON_NCCL_LIBRARY nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/lib" ENV NCCL_HOME
  PATH_SUFFIXES lib lib64)
if(NOT ZMUON_NCCL_INCLUDE_DIR OR NOT ZMUON_NCCL_LIBRARY)
  if(_zmuon_cuda_required)
    message(FATAL_ERROR "ZMUON_CUDA=${ZMUON_CUDA} but NCCL was not found "
                        "(nccl.h: ${ZMUON_NCCL_INCLUDE_DIR}, libnccl: ${ZMUON_NCCL_LIBRARY})")
  endif()
  message(STATUS "zmuon: NCCL not found, CUDA backend off")
  return()
endif()
if(NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl SHARED IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${ZMUON_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZMUON_NCCL_INCLUDE_DIR}")
endif()

set(ZMUON_HAVE_CUDA_BUILD ON)
message(STATUS "zmuon: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "archs ${CMAKE_CUDA_ARCHITECTURES} and sm_90a, NCCL ${ZMUON_NCCL_LIBRARY})")
# src/kernels/CMakeLists.txt adds src/kernels/cuda when ZMUON_HAVE_CUDA_BUILD is ON.

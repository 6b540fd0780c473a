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

# Hopper only (the H200), one real architecture: no PTX for other targets, which keeps the
# compile on CI's two cores short. The runtime is the shared libcudart, like cuBLAS and NCCL.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
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
               "sm_${CMAKE_CUDA_ARCHITECTURES}, NCCL ${ZMUON_NCCL_LIBRARY})")
# src/kernels/CMakeLists.txt adds src/kernels/cuda when ZMUON_HAVE_CUDA_BUILD is ON.

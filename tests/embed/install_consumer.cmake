# Run by ctest (cmake -P): installs this build into a fresh temporary prefix, then configures,
# builds and runs examples/cpp_host_loop against it as an outside project would
# (find_package(zmuon) -> zmuon::zmuon). Each example checks its own loss and exits 1 on failure.
# Inputs: BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR; PYTHON (optional): the installed Python
# package must find the installed libzmuon by itself.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_consumer.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/zmuon/zmuon.h include/zmuon/engine.hpp lib/cmake/zmuon/zmuonConfig.cmake
          lib/zmuon/python/zmuon/__init__.py bin/zmuon-launch bin/zmuon-trace)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()
# The installed tools run from the prefix.
run("${prefix}/bin/zmuon-launch" --version)
run("${prefix}/bin/zmuon-trace" --version)
# The package asks for nothing the public headers do not need: no CAF, no BLAS.
file(READ "${prefix}/lib/cmake/zmuon/zmuonConfig.cmake" config)
if(config MATCHES "find_dependency")
  message(FATAL_ERROR "zmuonConfig.cmake asks for dependencies the public headers do not need")
endif()
# The installed headers must not reach into the source tree (plan/, actors/, ...).
file(GLOB headers "${prefix}/include/zmuon/*")
foreach(h ${headers})
  file(STRINGS "${h}" includes REGEX "#include \"")
  foreach(line ${includes})
    if(NOT line MATCHES "#include \"zmuon/")
      message(FATAL_ERROR "installed header ${h} includes a non-public header: ${line}")
    endif()
  endforeach()
endforeach()
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/cpp_host_loop" -B "${WORK_DIR}/build"
    -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/cpp_host_loop")
run("${WORK_DIR}/build/c_host_loop")
if(PYTHON)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=ZMUON_LIBRARY "PYTHONPATH=${prefix}/lib/zmuon/python"
            ${PYTHON} -c "import zmuon, zmuon._capi as c; print(zmuon.version(), c._find_library())"
    RESULT_VARIABLE rc OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT found MATCHES "${prefix}/lib/libzmuon.so$")
    message(FATAL_ERROR "the installed Python package did not load ${prefix}/lib/libzmuon.so "
                        "(rc ${rc}, found '${found}')")
  endif()
  message(STATUS "installed Python package: zmuon ${found}")
endif()

# The embedding API: the C ABI compiled as C against the C++ engine, the installed CMake package
# used by an outside project, and the Python binding (Debian's python3 + python3-numpy).
enable_language(C)
add_library(c_api_checks STATIC ${CMAKE_CURRENT_SOURCE_DIR}/c_api_checks.c)
set_target_properties(c_api_checks PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_include_directories(c_api_checks PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
zmuon_add_test(test_c_api SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_c_api.cpp
  LIBS c_api_checks zmuon)
target_include_directories(test_c_api PRIVATE ${PROJECT_SOURCE_DIR})
# Newton-Schulz on its own (zmuon_orthogonalize, zmuon::orthogonalizer) against a double NS5.
zmuon_add_test(test_orthogonalize SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_orthogonalize.cpp
  LIBS zmuon LABEL embed)
target_include_directories(test_orthogonalize PRIVATE ${PROJECT_SOURCE_DIR})

# One step of a job (params, gradients per rank and micro-batch) through the C++ engine; the
# Python test compares the binding's result with this program's, bit for bit.
add_executable(embed_reference ${CMAKE_CURRENT_SOURCE_DIR}/embed_reference.cpp)
target_link_libraries(embed_reference PRIVATE zmuon_core zmuon_example)

# Debian's interpreter on purpose: the python3 first on PATH may be a separate build without numpy.
find_program(ZMUON_TEST_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)

add_test(NAME test_install_consumer
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_consumer -DGENERATOR=${CMAKE_GENERATOR}
          -DPYTHON=${ZMUON_TEST_PYTHON}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/install_consumer.cmake)
set_tests_properties(test_install_consumer PROPERTIES TIMEOUT 300 LABELS embed)

if(ZMUON_TEST_PYTHON)
  add_test(NAME test_python_binding
    COMMAND ${ZMUON_TEST_PYTHON} -m unittest -v test_binding
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(test_python_binding PROPERTIES TIMEOUT 300 LABELS embed
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;ZMUON_LIBRARY=$<TARGET_FILE:zmuon>;ZMUON_REFERENCE=$<TARGET_FILE:embed_reference>;PYTHONDONTWRITEBYTECODE=1")
  # Bad arguments to zmuon.Muon: each named, nothing changed.
  add_test(NAME test_python_binding_errors
    COMMAND ${ZMUON_TEST_PYTHON} -m unittest -v test_binding_errors
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(test_python_binding_errors PROPERTIES TIMEOUT 300 LABELS embed
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;ZMUON_LIBRARY=$<TARGET_FILE:zmuon>;PYTHONDONTWRITEBYTECODE=1")
  # zmuon.newton_schulz against a float64 numpy NS5, and its errors.
  add_test(NAME test_python_newton_schulz
    COMMAND ${ZMUON_TEST_PYTHON} -m unittest -v test_newton_schulz
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(test_python_newton_schulz PROPERTIES TIMEOUT 120 LABELS embed
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;ZMUON_LIBRARY=$<TARGET_FILE:zmuon>;PYTHONDONTWRITEBYTECODE=1")
  # zmuon.Muon in two processes of one job (nodes=, node_rank=, master=).
  add_test(NAME test_python_nodes
    COMMAND ${ZMUON_TEST_PYTHON} -m unittest -v test_nodes
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(test_python_nodes PROPERTIES TIMEOUT 300 LABELS embed
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;ZMUON_LIBRARY=$<TARGET_FILE:zmuon>;PYTHONDONTWRITEBYTECODE=1")
endif()

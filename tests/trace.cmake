# The message trace: a traced engine run passes `zmuon-trace check`, altered traces fail it with
# the right message, the Perfetto JSON matches the records; zmuon-launch --trace.
zmuon_add_test(test_trace SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace.cpp LIBS zmuon_core zmuon_trace_tool)
target_compile_definitions(test_trace PRIVATE
  ZMUON_TRACE_TOOL="$<TARGET_FILE:zmuon-trace>"
  ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_trace zmuon-trace zmuon-launch)

# The message trace: a traced engine run passes `zmuon-trace check`, altered traces fail it with
# the right message, the Perfetto JSON matches the records; zmuon-launch --trace.
zmuon_add_test(test_trace SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace.cpp LIBS zmuon_core zmuon_trace_tool)
target_compile_definitions(test_trace PRIVATE
  ZMUON_TRACE_TOOL="$<TARGET_FILE:zmuon-trace>"
  ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_trace zmuon-trace zmuon-launch)
# zmuon-trace on bad input: missing or torn rank files, bad fields, bad arguments.
zmuon_add_test(test_trace_input SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace_input.cpp
               LIBS zmuon_core zmuon_trace_tool)
target_compile_definitions(test_trace_input PRIVATE ZMUON_TRACE_TOOL="$<TARGET_FILE:zmuon-trace>")
add_dependencies(test_trace_input zmuon-trace)
# The compute backend's calls as trace spans: each inside its handler with its step, as many as
# the backend counted; check, summary and perfetto on them; the recorder's step attribution.
zmuon_add_test(test_trace_compute SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace_compute.cpp
               LIBS zmuon_core zmuon_trace_tool)
target_compile_definitions(test_trace_compute PRIVATE ZMUON_TRACE_TOOL="$<TARGET_FILE:zmuon-trace>")
add_dependencies(test_trace_compute zmuon-trace)

# Engine-level tests: the real actors, the caf comm backend and the host backend together.
zmuon_add_test(test_plan SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plan.cpp LIBS zmuon_base)
zmuon_add_test(test_engine_numerics
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_numerics.cpp LIBS zmuon_train)
zmuon_add_test(test_engine_memory
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_memory.cpp LIBS zmuon_core)
zmuon_add_test(test_engine_call_times
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_call_times.cpp LIBS zmuon_core)
zmuon_add_test(test_engine_errors
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_errors.cpp LIBS zmuon_core)
zmuon_add_test(test_launch SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_launch.cpp
  ${PROJECT_SOURCE_DIR}/launch/exe/local_nodes.cpp LIBS zmuon_example)
target_compile_definitions(test_launch PRIVATE ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_launch zmuon-launch)
# Several zmuon-launch processes on 127.0.0.1 (rendezvous, caf comm between processes, failures).
zmuon_add_test(test_multinode SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_multinode.cpp
  LIBS zmuon_example)
target_compile_definitions(test_multinode PRIVATE ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_multinode zmuon-launch)
# The rendezvous actor alone (CAF's testing scheduler) and the launch's helpers.
zmuon_add_test(test_rendezvous SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_rendezvous.cpp
  LIBS zmuon_node LABEL actor_unit)
# engine::reduce's pool of host buffers for packed buckets.
zmuon_add_test(test_host_buckets
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_host_buckets.cpp LIBS zmuon_core)
# engine::reduce's bound on the reduce buckets in flight, read from the message trace.
zmuon_add_test(test_reduce_window
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_reduce_window.cpp LIBS zmuon_core)
# The node supervisor on a real scheduler sized as a node's (heartbeats beside computing ranks).
zmuon_add_test(test_node_supervisor SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_node_supervisor.cpp
  LIBS zmuon_node)

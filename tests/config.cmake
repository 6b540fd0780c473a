# The job config: the schema's checks, --set overrides, the example file and zmuon-launch --config.
zmuon_add_test(test_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.cpp LIBS zmuon_example)
target_compile_definitions(test_config PRIVATE
  ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>"
  ZMUON_EXAMPLE_CONFIG="${PROJECT_SOURCE_DIR}/examples/zmuon_config.json")
add_dependencies(test_config zmuon-launch)
# User JSON that once crashed or hung the config path (nesting, huge numbers, odd files, bounds).
zmuon_add_test(test_config_json SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config_json.cpp
               LIBS zmuon_example)
target_compile_definitions(test_config_json PRIVATE ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_config_json zmuon-launch)

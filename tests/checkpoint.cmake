# Checkpoints and fault injection: save/load/reshard/corruption and injected non-finite steps
# through the engine; resume of zmuon-launch in new processes, killed mid-save and mid-run.
zmuon_add_test(test_checkpoint SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_checkpoint.cpp LIBS zmuon_core)
set_tests_properties(test_checkpoint PROPERTIES TIMEOUT 300)
zmuon_add_test(test_resume SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_resume.cpp LIBS zmuon_io)
target_compile_definitions(test_resume PRIVATE ZMUON_LAUNCH="$<TARGET_FILE:zmuon-launch>")
add_dependencies(test_resume zmuon-launch)
set_tests_properties(test_resume PROPERTIES TIMEOUT 300)

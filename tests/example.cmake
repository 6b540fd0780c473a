# The example model (gradients, data determinism) and the safetensors reader/writer.
zmuon_add_test(test_model SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_model.cpp LIBS zmuon_example)
zmuon_add_test(test_safetensors
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors.cpp LIBS zmuon_example)

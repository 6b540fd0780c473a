# The Muon phase's bf16 transport (zmuon.muon_transport): bf16 vs fp32, world 4 vs world 1, the
# trace's byte counts of the gather and scatter against the plan.
zmuon_add_test(test_muon_transport
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_muon_transport.cpp LIBS zmuon_train)

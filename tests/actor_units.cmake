# Per-actor unit tests: each actor alone under CAF's testing scheduler, its peers replaced by
# recording test doubles (tests/actor_fixture.hpp). Plain Boost checks (no CAF test DSL), so a
# failing check never aborts the module: one ctest entry per executable.
foreach(actor reducer partition_store loss_scaler muon_coordinator caf_comm)
  zmuon_add_test(test_${actor}
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_${actor}.cpp
    LIBS zmuon_core
    LABEL actor_unit)
  # Everything runs on the test thread: a test that takes a minute is hung.
  set_tests_properties(test_${actor} PROPERTIES TIMEOUT 120)
endforeach()

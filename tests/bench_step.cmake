# zmuon-bench-step's trace figures: bytes by collective kind against the plan (world 2 and 4),
# the phase cut of real steps, and the plumbing figure on a synthetic trace.
zmuon_add_test(test_bench_step SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_step.cpp
               LIBS zmuon_core zmuon_bench_step zmuon_trace_tool)

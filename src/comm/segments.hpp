// Two lists of segments holding the same elements cut differently (a rank's sends to itself and
// its receives from itself): the stretches where they meet, for the comms' copies to self.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "messages/messages.hpp"

namespace zmuon {

/// Calls `run(from_segment, from_offset, to_segment, to_offset, n)` for each stretch of n > 0
/// elements where the elements of `from` (in order) meet those of `to` (in order), up to the
/// shorter list's total.
template <class Run>
void for_each_stretch(const std::vector<segment>& from, const std::vector<segment>& to, Run&& run) {
  size_t i = 0, j = 0;
  int64_t in_from = 0, in_to = 0;  // elements of from[i] and to[j] already passed
  while (i < from.size() && j < to.size()) {
    const int64_t n = std::min(from[i].size - in_from, to[j].size - in_to);
    if (n > 0)
      run(from[i], in_from, to[j], in_to, n);
    in_from += n;
    in_to += n;
    if (in_from == from[i].size) {
      ++i;
      in_from = 0;
    }
    if (in_to == to[j].size) {
      ++j;
      in_to = 0;
    }
  }
}

}  // namespace zmuon

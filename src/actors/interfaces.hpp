// The narrow interfaces through which the actors of one rank see each other. Each actor's full
// interface (in its own header) contains these, so its handle converts to them; tests replace a
// peer by a test actor that implements only the narrow interface.
#pragma once

#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/messages.hpp"

namespace zmuon {

/// What the reducer needs from the store.
using store_accumulate_actor = caf::typed_actor<caf::replies_to<accumulate>::with<ack>>;

/// What the loss scaler needs from the store.
using store_scan_actor = caf::typed_actor<caf::replies_to<scan_grads>::with<grad_scan>>;

/// What the coordinator needs from the store: the step's element-wise phases.
using store_step_actor = caf::typed_actor<
    caf::replies_to<discard_grads>::with<ack>, caf::replies_to<unscale_clip>::with<ack>,
    caf::replies_to<muon_momentum>::with<ack>, caf::replies_to<apply_muon>::with<ack>,
    caf::replies_to<adamw_step>::with<ack>, caf::replies_to<finish_step>::with<ack>,
    caf::replies_to<qk_clip_scale>::with<ack>, caf::replies_to<normuon_step>::with<ack>>;

/// What the coordinator needs from the reducer.
using reducer_flush_actor = caf::typed_actor<caf::replies_to<flush>::with<flush_done>>;

/// What the coordinator needs from the loss scaler.
using scaler_check_actor = caf::typed_actor<caf::replies_to<check_overflow>::with<overflow_report>>;

}  // namespace zmuon

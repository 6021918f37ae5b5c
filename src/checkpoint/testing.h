// Test-only hooks into checkpoint saves. Not on a public header; nothing but tests sets
// them. Process-wide: set one before the save it should see, and clear it (empty function)
// after. Tests that kill a rank mid-save set it in that rank's process only.
#pragma once

#include <functional>
#include <string_view>

// In ferry::checkpoint, not a nested `testing` namespace, which would hide ferry::testing
// (the test helpers) from tests written inside ferry::checkpoint.
namespace ferry::checkpoint {

// Called with each phase of a save as this process completes it ("shards", "manifest",
// "node_marker", "committed", "latest"), on the saving thread.
using SavePhaseHook = std::function<void(std::string_view phase)>;
void set_save_phase_hook_for_testing(SavePhaseHook hook);

}  // namespace ferry::checkpoint

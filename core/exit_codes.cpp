// stopped_exit_code (see exit_codes.h).
#include "core/exit_codes.h"

#include <string>

#include "core/environment.h"
#include "core/error.h"

namespace spotrain {

int stopped_exit_code() {
  const std::string& s = launcher_settings().stop_exit_code;
  if (s.empty()) return kExitResumable;
  const bool number = !s.empty() && s.size() <= 3 && s.find_first_not_of("0123456789") == std::string::npos;
  SPOTRAIN_CHECK(number && std::stoi(s) <= 255, kStopExitCodeEnv, "='", s,
                 "' is not an exit code (0-255)");
  return std::stoi(s);
}

}  // namespace spotrain

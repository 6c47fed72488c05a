// stopped_exit_code (see exit_codes.h).
#include "core/exit_codes.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace spotrain {

int stopped_exit_code() {
  const char* v = std::getenv(kStopExitCodeEnv);
  if (!v) return kExitResumable;
  const std::string s(v);
  const bool number = !s.empty() && s.size() <= 3 && s.find_first_not_of("0123456789") == std::string::npos;
  SPOTRAIN_CHECK(number && std::stoi(s) <= 255, kStopExitCodeEnv, "='", s,
                 "' is not an exit code (0-255)");
  return std::stoi(s);
}

}  // namespace spotrain

// spotrain::Error and the one generic check macro the per-library checks wrap.
// Library code throws Error with what failed and what to do; the CLI prints it as
// one `error:` line. Destructors use the *_WARN variants, which only print.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace spotrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds a message from stream pieces: throw Error(str("bad size ", n)).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace spotrain

#define SPOTRAIN_THROW(...) throw ::spotrain::Error(::spotrain::str(__VA_ARGS__))

// Checks an invariant of our own code or of the caller's input.
#define SPOTRAIN_CHECK(cond, ...)                                              \
  do {                                                                         \
    if (!(cond)) SPOTRAIN_THROW(__VA_ARGS__);                                  \
  } while (0)

// Generic library check: `ok` says whether `status` is success, `msg` turns it into text.
#define SPOTRAIN_LIB_CHECK(lib, call, ok, msg)                                 \
  do {                                                                         \
    auto spotrain_status_ = (call);                                            \
    if (!(ok(spotrain_status_)))                                               \
      SPOTRAIN_THROW(lib, " call failed: ", #call, " at ", __FILE__, ":",      \
                     __LINE__, ": ", msg(spotrain_status_));                   \
  } while (0)

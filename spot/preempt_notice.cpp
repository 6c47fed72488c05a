// Preemption notices (see preempt_notice.h).
#include "spot/preempt_notice.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef SPOTRAIN_WITH_CURL
#include <curl/curl.h>
#endif

#include "spot/preemption.h"
#include "core/error.h"

namespace spotrain {

namespace {

struct HttpAnswer {
  long status = 0;  // 0: no answer
  std::string body, error;
};

#ifdef SPOTRAIN_WITH_CURL
// Keeps the first 64 KiB of an answer (a notice is a few hundred bytes); the rest is read and
// dropped, so an endpoint that answers megabytes costs no memory.
size_t collect(char* p, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  constexpr size_t kKeep = 64 << 10;
  if (body->size() < kKeep) body->append(p, std::min(size * n, kKeep - body->size()));
  return size * n;
}

// One request with short timeouts (a metadata service answers in milliseconds, or never).
HttpAnswer http(const std::string& url, const std::vector<std::string>& headers,
                bool put = false) {
  static const bool init = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  HttpAnswer a;
  CURL* c = init ? curl_easy_init() : nullptr;
  if (!c) {
    a.error = "libcurl could not start";
    return a;
  }
  curl_slist* h = nullptr;
  for (const auto& line : headers) h = curl_slist_append(h, line.c_str());
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &a.body);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // from a thread: no SIGALRM for timeouts
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");  // metadata services are never behind a proxy
  if (put) curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  else
    a.error = curl_easy_strerror(rc);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return a;
}
#else
HttpAnswer http(const std::string&, const std::vector<std::string>&, bool = false) {
  HttpAnswer a;
  a.error = "this build has no libcurl";
  return a;
}
#endif

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// What a notice's text looks like in the log: trimmed, one line, at most 200 characters.
std::string excerpt(const std::string& body) {
  std::string t = trim(body);
  const size_t whole = t.size();
  if (t.size() > 200) t = t.substr(0, 200);
  for (char& c : t)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return whole > 200 ? t + "... (" + std::to_string(whole) + "+ bytes)" : t;
}

// A JSON field that should be a string, or "?" when it is missing or of another type.
std::string string_field(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "?";
}

}  // namespace

void validate_preempt_notice(const std::string& s) {
  const bool http_form = s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0;
  const bool known = s == "aws" || s == "gcp" || s == "azure" || http_form || s.rfind("file:", 0) == 0;
  SPOTRAIN_CHECK(known, "unknown --preempt-notice '", s,
                 "'; use aws, gcp, azure, http://HOST/PATH or file:PATH");
#ifndef SPOTRAIN_WITH_CURL
  SPOTRAIN_CHECK(s.rfind("file:", 0) == 0, "--preempt-notice ", s,
                 " needs HTTP, and this build has no libcurl (install libcurl4-openssl-dev and "
                 "rebuild); file:PATH works without it");
#endif
}

std::string check_preempt_notice(const std::string& s, std::string* error) {
  if (error) error->clear();
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return std::string();
  };
  if (s.rfind("file:", 0) == 0) {
    std::ifstream f(s.substr(5));
    if (!f) return "";
    std::string text(4096, '\0');  // a notice's first 4 KiB say what it is
    f.read(&text[0], std::streamsize(text.size()));
    text.resize(size_t(f.gcount()));
    std::string body = excerpt(text);
    return "file " + s.substr(5) + (body.empty() ? "" : ": " + body);
  }
  if (s == "aws") {
    // IMDSv2: a session token first (IMDSv1, where still allowed, answers without one).
    HttpAnswer t = http("http://169.254.169.254/latest/api/token",
                        {"X-aws-ec2-metadata-token-ttl-seconds: 300"}, /*put=*/true);
    std::vector<std::string> h;
    if (t.status == 200) h.push_back("X-aws-ec2-metadata-token: " + t.body);
    HttpAnswer a = http("http://169.254.169.254/latest/meta-data/spot/instance-action", h);
    if (a.status == 404) return "";
    if (a.status != 200) return fail(a.error.empty() ? "HTTP " + std::to_string(a.status) : a.error);
    auto j = nlohmann::json::parse(a.body, nullptr, false);
    if (j.is_object())
      return "aws spot instance-action " + excerpt(string_field(j, "action")) + " at " +
             excerpt(string_field(j, "time"));
    return "aws spot instance-action: " + excerpt(a.body);
  }
  if (s == "gcp") {
    HttpAnswer a = http("http://metadata.google.internal/computeMetadata/v1/instance/preempted",
                        {"Metadata-Flavor: Google"});
    if (a.status != 200) return fail(a.error.empty() ? "HTTP " + std::to_string(a.status) : a.error);
    return trim(a.body) == "TRUE" ? "gcp instance preempted" : "";
  }
  if (s == "azure") {
    HttpAnswer a = http("http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
                        {"Metadata: true"});
    if (a.status != 200) return fail(a.error.empty() ? "HTTP " + std::to_string(a.status) : a.error);
    auto j = nlohmann::json::parse(a.body, nullptr, false);
    if (!j.is_object() || !j.contains("Events") || !j["Events"].is_array()) return "";
    for (const auto& e : j["Events"])
      if (string_field(e, "EventType") == "Preempt")
        return "azure scheduled event Preempt, not before " + excerpt(string_field(e, "NotBefore"));
    return "";
  }
  HttpAnswer a = http(s, {});
  if (a.status == 200) return "notice at " + s + (trim(a.body).empty() ? "" : ": " + excerpt(a.body));
  if (a.status == 0) return fail(a.error);
  return "";
}

PreemptionWatcher::PreemptionWatcher(const std::string& source, double poll_seconds)
    : source_(source), poll_(poll_seconds) {
  validate_preempt_notice(source_);
  thread_ = std::thread([this] { loop(); });
}

PreemptionWatcher::~PreemptionWatcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PreemptionWatcher::loop() {
  bool warned = false;
  for (;;) {
    std::string error;
    const std::string notice = check_preempt_notice(source_, &error);
    if (!notice.empty()) {
      std::fprintf(stderr, "preemption notice (%s): stopping after this step with a checkpoint\n",
                   notice.c_str());
      std::fflush(stderr);
      request_stop("a preemption notice (" + notice + ")");
      return;
    }
    if (!error.empty() && !warned) {  // said once: the source may come up later
      std::fprintf(stderr, "warning: --preempt-notice %s cannot be read (%s); still polling\n",
                   source_.c_str(), error.c_str());
      warned = true;
    }
    std::unique_lock<std::mutex> lk(mu_);
    if (cv_.wait_for(lk, std::chrono::duration<double>(poll_), [this] { return quit_; })) return;
  }
}

}  // namespace spotrain

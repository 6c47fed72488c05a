// Our offline HTML pages (report, plan) in headless Chromium: the DOM after the page's script
// ran, and the JSON its <pre id="selfcheck"> holds (what it drew, what it fetched).
#pragma once
#include <regex>
#include <string>

#include "run_command.h"

inline bool chromium_installed() { return run_command("command -v chromium").code == 0; }

// Chromium without a display, a sandbox or the network, given 8 s of page time.
inline const std::string kHeadlessChromium =
    "chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "
    "--disable-background-networking --virtual-time-budget=8000 ";

// The page's DOM after its script ran (file://PAGE, `fragment` such as "#x=wall" appended).
inline CommandResult headless_dom(const std::string& page, const std::string& fragment = "") {
  return run_command(kHeadlessChromium + "--dump-dom 'file://" + page + fragment + "' 2>/dev/null");
}

// The text of <pre id="selfcheck"> with its HTML entities undone; empty when the page's script
// did not get that far.
inline std::string selfcheck_text(const std::string& dom) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex(R"(<pre id="selfcheck"[^>]*>([^<]+)</pre>)"))) return "";
  std::string text = m[1];
  for (auto [from, to] : {std::pair<std::string, std::string>{"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}})
    for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), to);
  return text;
}

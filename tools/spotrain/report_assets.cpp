// The files `spotrain report` and `spotrain plan` embed in every page, built into the binary:
// the page templates (report_page.html, plan_page.html), the style and script they share
// (page_style.css, page_script.js) and Chart.js from Debian's libjs-chart.js, found at
// configure time. A build without Chart.js still writes CSV exports and says what to install
// for pages.
#include "tools/spotrain/report_assets.h"

#include "core/error.h"

#define SPOTRAIN_INCBIN(sym, path)                                                   \
  __asm__(".section .rodata\n.global " #sym "\n.balign 16\n" #sym ":\n.incbin \"" path \
          "\"\n.global " #sym "_end\n" #sym "_end:\n.byte 0\n.previous\n");          \
  extern "C" const char sym[], sym##_end[];

SPOTRAIN_INCBIN(spotrain_report_page, SPOTRAIN_REPORT_PAGE_PATH)
SPOTRAIN_INCBIN(spotrain_plan_page, SPOTRAIN_PLAN_PAGE_PATH)
SPOTRAIN_INCBIN(spotrain_page_style, SPOTRAIN_PAGE_STYLE_PATH)
SPOTRAIN_INCBIN(spotrain_page_script, SPOTRAIN_PAGE_SCRIPT_PATH)
#if SPOTRAIN_HAVE_CHARTJS
SPOTRAIN_INCBIN(spotrain_chartjs, SPOTRAIN_CHARTJS_PATH)
#endif

namespace spotrain::cli {

std::string_view report_page_template() {
  return {spotrain_report_page, size_t(spotrain_report_page_end - spotrain_report_page)};
}

std::string_view plan_page_template() {
  return {spotrain_plan_page, size_t(spotrain_plan_page_end - spotrain_plan_page)};
}

std::string_view chartjs_source() {
#if SPOTRAIN_HAVE_CHARTJS
  return {spotrain_chartjs, size_t(spotrain_chartjs_end - spotrain_chartjs)};
#else
  return {};
#endif
}

namespace {
void replace_once(std::string& s, const std::string& marker, std::string_view with) {
  const size_t at = s.find(marker);
  SPOTRAIN_CHECK(at != std::string::npos, "internal: the page template lacks ", marker);
  s.replace(at, marker.size(), with.data(), with.size());
}
}  // namespace

std::string fill_page(std::string_view page_template, const std::string& json_data) {
  // Inside <script> the HTML parser, not JavaScript, decides where the element ends: "</script"
  // ends it and "<!--<script" keeps it open past its end tag. In JSON, '<', '>' and '&' occur
  // only inside strings, where \u003c, \u003e and \u0026 mean the same characters.
  std::string safe;
  safe.reserve(json_data.size());
  for (char c : json_data) {
    if (c == '<') safe += "\\u003c";
    else if (c == '>') safe += "\\u003e";
    else if (c == '&') safe += "\\u0026";
    else safe += c;
  }
  std::string page(page_template);
  // The data last: what it holds cannot be taken for a marker.
  replace_once(page, "/*@STYLE@*/", {spotrain_page_style, size_t(spotrain_page_style_end - spotrain_page_style)});
  replace_once(page, "/*@SCRIPT@*/", {spotrain_page_script, size_t(spotrain_page_script_end - spotrain_page_script)});
  replace_once(page, "/*@CHARTJS@*/", chartjs_source());
  replace_once(page, "/*@DATA@*/", safe);
  return page;
}

}  // namespace spotrain::cli

// The files `spotrain report` embeds in every page, built into the binary: the page template
// (report_page.html) and Chart.js from Debian's libjs-chart.js, found at configure time. A
// build without Chart.js still writes CSV exports and says what to install for pages.
#include "tools/spotrain/report_assets.h"

#define SPOTRAIN_INCBIN(sym, path)                                                   \
  __asm__(".section .rodata\n.global " #sym "\n.balign 16\n" #sym ":\n.incbin \"" path \
          "\"\n.global " #sym "_end\n" #sym "_end:\n.byte 0\n.previous\n");          \
  extern "C" const char sym[], sym##_end[];

SPOTRAIN_INCBIN(spotrain_report_page, SPOTRAIN_REPORT_PAGE_PATH)
#if SPOTRAIN_HAVE_CHARTJS
SPOTRAIN_INCBIN(spotrain_chartjs, SPOTRAIN_CHARTJS_PATH)
#endif

namespace spotrain::cli {

std::string_view report_page_template() {
  return {spotrain_report_page, size_t(spotrain_report_page_end - spotrain_report_page)};
}

std::string_view chartjs_source() {
#if SPOTRAIN_HAVE_CHARTJS
  return {spotrain_chartjs, size_t(spotrain_chartjs_end - spotrain_chartjs)};
#else
  return {};
#endif
}

}  // namespace spotrain::cli

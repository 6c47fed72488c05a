// The page templates and the charting library that `spotrain report` and `spotrain plan` put
// into each HTML file (report_assets.cpp embeds them at build time).
#pragma once
#include <string>
#include <string_view>

namespace spotrain::cli {

std::string_view report_page_template();
std::string_view plan_page_template();
// Chart.js (minified, with its licence header); empty when the build did not find it.
std::string_view chartjs_source();

// A page: `page_template` with the shared style (page_style.css) and script (page_script.js),
// Chart.js and `json_data` (a JSON text) put in at its /*@STYLE@*/, /*@SCRIPT@*/, /*@CHARTJS@*/
// and /*@DATA@*/ markers, the data made safe to stand inside <script>.
std::string fill_page(std::string_view page_template, const std::string& json_data);

}  // namespace spotrain::cli

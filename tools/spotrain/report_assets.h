// The page template and the charting library that `spotrain report` puts into each HTML file
// (report_assets.cpp embeds them at build time).
#pragma once
#include <string_view>

namespace spotrain::cli {

std::string_view report_page_template();
// Chart.js (minified, with its licence header); empty when the build did not find it.
std::string_view chartjs_source();

}  // namespace spotrain::cli

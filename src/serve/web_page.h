// The web page at GET / (src/serve/web/index.html): one self-contained HTML file, compiled into
// the binary (src/serve/CMakeLists.txt generates its definition), so the server needs no files.
#pragma once

#include <string_view>

namespace paraflow::serve {

std::string_view web_page_html();

}  // namespace paraflow::serve

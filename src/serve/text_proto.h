// A protobuf text file's message (TF Serving's config files), its first parse error named with
// where it comes from and its line and column.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace paraflow::serve {

// Throws InputError "<source>:<line>:<column>: <what is wrong>".
void parse_text_proto(const std::string& text, google::protobuf::Message& message, const std::string& source);

}  // namespace paraflow::serve

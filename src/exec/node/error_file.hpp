// torchrun's error files.  torchrun gives every worker TORCHELASTIC_ERROR_FILE; torch's
// `@record` decorator (torch.distributed.elastic.multiprocessing.errors) writes the uncaught
// exception there as JSON, {"message": {"message": "ValueError: ...", "extraInfo": {...}}}
// (an older form has the text as "message" itself), and the launcher names it in its report.
#pragma once

#include <string>

namespace pe {

// The exception's text in such a file's contents; "" if there is none or it is not that JSON.
std::string error_file_message(const std::string& json);

// Reads and removes the error file at `path` (the first MiB of it); its message as above.
std::string take_error_file(const std::string& path);

}  // namespace pe

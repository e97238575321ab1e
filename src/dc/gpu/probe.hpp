// What the GPU path finds at run time: the CUDA runtime and driver, the GPUs visible to this
// process, and the NCCL library actually loaded (its version and file), so that a program or a
// test can say precisely why it cannot use GPUs.  Needs no GPU.  Threads: any.
#pragma once

#include <string>

namespace pytorch_exec::dc::gpu {

struct Probe {
  int devices = 0;           // GPUs visible to this process
  std::string no_gpu;        // why none can be used ("" when devices > 0)
  int runtime_version = 0;   // CUDART_VERSION style: 13020 for 13.2
  int driver_version = 0;    // 0: no driver
  int nccl_version = 0;      // ncclGetVersion of the loaded library: 23007 for 2.30.7
  int nccl_header = 0;       // NCCL_VERSION_CODE this library was compiled against
  std::string nccl_library;  // the file the loaded ncclGetVersion comes from
};

Probe probe();

// "2.30.7" from 23007 (NCCL's codes since 2.9), "13.2" from a CUDA version.
std::string nccl_version_string(int code);
std::string cuda_version_string(int code);

}  // namespace pytorch_exec::dc::gpu

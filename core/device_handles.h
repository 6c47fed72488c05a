// Opaque handles of a device's work queue and of a point in it, for the interfaces that pass
// them between kernels/ and comm/ without a device header: on CUDA a DeviceStream* is a
// cudaStream_t and a DeviceEvent* a cudaEvent_t, converted (reinterpret_cast) only where one
// is made and where it is used; nullptr where there is no device queue (the CPU).
#pragma once

namespace spotrain {

struct DeviceStream;
struct DeviceEvent;

}  // namespace spotrain

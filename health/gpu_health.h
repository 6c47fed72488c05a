// The GPU's own health as NVML reports it, for `spotrain doctor`: uncorrected ECC errors,
// retired pages or remapped rows waiting for a reset, clocks held down by heat or power, and a
// PCIe link below its generation or width. Read through NVML's C API opened at run time (no
// CUDA toolkit needed to build); where NVML or a call is missing, the check says so.
#pragma once
#include <functional>
#include <string>

namespace spotrain::health {

// Each finding: its name, its verdict (0 ok, 1 warn, 2 fail), the figure and the limit.
using GpuFinding = std::function<void(const std::string& name, int verdict, const std::string& figure,
                                      const std::string& limit)>;

// Memory health, read at rest: ECC errors, retired pages, remapped rows.
void check_gpu_health(const std::string& pci_bus_id, const GpuFinding& out);
// Read just after work (an idle GPU lowers its link and clocks on purpose): why the clocks are
// held down, and the PCIe link's generation and width against the most it can run.
void check_gpu_health_under_load(const std::string& pci_bus_id, const GpuFinding& out);

}  // namespace spotrain::health

"""Where and how a run computes: devices, resources, the Ray environment, out of memory, throughput, progress, provenance, errors."""

"""Device backends: declarative profiles (cpu, cuda, npu) and the selection of the active one."""

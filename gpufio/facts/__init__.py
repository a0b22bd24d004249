"""Facts about the host and its devices (CPU, kernel, drives, PCIe links), read from
/proc and sysfs. The lowest band: it imports nothing of gpufio's."""

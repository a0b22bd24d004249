"""NVMe, one package, split as SPDK splits lib/nvme:

- ``spec``: the specification: the 64-byte command and 16-byte completion, registers, admin
  commands, PRPs; the one I/O command encoder and the one status decoder.
- ``passthru``: the 128-byte io_uring passthrough entry, built around ``spec``'s command.
- ``controller``: the Controller / QueuePair / Memory interfaces every controller meets.
- transports: ``vfio`` (vfio-pci from user space) and ``pcie_vfio`` (the host driver of a
  drive over it); the software controllers ``model`` (Python) and ``compiled`` (C), with
  ``shared`` (their shared file as a device) and ``memory``; ``qemu`` (hw/nvme over
  qtest); ``emulated`` (a session over any of those three).
- ``session``: a job's controller shared by its workers; ``guardian``: a taken drive given
  back if the process dies; ``cpu_channel``: the CPU's queue-pair channel.
- ``drives``: published drive rates the software controllers can be held to.

The sysfs readings of NVMe namespaces stay in facts/ (facts/nvme.py, nvme_generic.py):
facts is the band below io that doctor, targets and the job's facts read without loading a
driver, and what they read is the machine, not a controller gpufio drives.
Nothing here imports io/gio: the GPU side (io/gio/backends/nvme.py) registers this
package's memory with CUDA itself."""

"""NVMe, one package: the controllers gpufio drives besides a drive over vfio-pci (the
compiled software controller, QEMU's hw/nvme over qtest) and the adapters that let the host
driver (io/nvme_driver.py) drive any of them. The older NVMe modules of io/ join it later."""

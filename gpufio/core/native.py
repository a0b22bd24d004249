"""Where io/nvme/ finds the C builder until it imports gpufio.native.build itself (the NVMe
package is moving on another branch): the builder is native/build.py."""

from gpufio.native.build import library

__all__ = ["library"]

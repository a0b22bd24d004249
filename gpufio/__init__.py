"""gpufio: fio for the path from storage into GPU memory."""

__version__ = "0.1.0"

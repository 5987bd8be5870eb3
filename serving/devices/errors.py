"""The project's own device errors.

Vendor errors (NVML, torch, psutil) are translated into these few classes with
``raise ... from e`` so callers never import a vendor library to handle a failure.
"""

from __future__ import annotations


class DeviceError(Exception):
    """Base class of every error raised by :mod:`serving.devices`."""


class DeviceNotFoundError(DeviceError):
    """The requested device does not exist on this machine."""


class DeviceNotSupportedError(DeviceError):
    """The device or its driver cannot do this (a metric or a knob)."""


class DevicePermissionError(DeviceError):
    """The driver refused the operation for lack of privileges (changing GPU knobs needs root)."""


class DeviceLostError(DeviceError):
    """The device fell off the bus or otherwise became unreachable."""


class DeviceValueError(DeviceError, ValueError):
    """A value is outside the bounds the device accepts, or a device spec is malformed."""

    @classmethod
    def out_of_range(cls, what: str, value: float, low: float, high: float, unit: str) -> DeviceValueError:
        """Build the standard message, e.g. ``power limit 900 W is outside [200, 700] W``."""
        return cls(f"{what} {value:g} {unit} is outside [{low:g}, {high:g}] {unit}")

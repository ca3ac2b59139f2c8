"""The driver's bind address from Horovod's ``nics`` argument, shared by ``kolo.spark.run``
and ``kolo.ray.RayExecutor``."""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Any, Optional

from kolo.exceptions import ConfigError

_SIOCGIFADDR = 0x8915


def interface_ip(name: str) -> Optional[str]:
    """The IPv4 address of network interface ``name``, or None when it has none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        sock.close()


def nics_ip(nics: Any) -> Optional[str]:
    """The address of the first of ``nics`` (a name or a list of names) that has one; None
    when ``nics`` is empty; a :class:`ConfigError` when none of them has an address.

    Example::

        nics_ip(["lo"])  # '127.0.0.1'
    """
    if not nics:
        return None
    names = [nics] if isinstance(nics, str) else list(nics)
    for name in names:
        ip = interface_ip(str(name))
        if ip is not None:
            return ip
    raise ConfigError(
        f"nics={nics!r}: no such network interface with an IPv4 address on the driver; "
        "pass interface names as `ip addr` lists them (e.g. ['eth0'])"
    )

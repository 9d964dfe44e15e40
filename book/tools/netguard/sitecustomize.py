"""Refuse outbound network connections in notebooks run by the chapter runner.

book/tools/run_chapters.py puts this directory first on PYTHONPATH and sets
NN_KERNELS_NO_NETWORK=1, so every Python process it starts (papermill and the
notebook's kernel) imports this module at start-up. Connections to loopback and Unix
sockets (the kernel's own channels) stay allowed; anything else raises before a single
packet is sent, so a chapter that silently downloads data fails loudly in CI.
"""

from __future__ import annotations

import ipaddress
import os
import socket

if os.environ.get("NN_KERNELS_NO_NETWORK") == "1":

    class NetworkAccessBlocked(OSError):
        """Raised when code run under the chapter runner tries to reach the network."""

    def _is_local(host: object) -> bool:
        if not isinstance(host, str):
            return True  # AF_UNIX paths and other families are local
        if host in ("localhost", ""):
            return True
        try:
            return ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            return False  # a host name other than localhost

    def _guard(address: object) -> None:
        host = address[0] if isinstance(address, tuple) else address
        if not _is_local(host):
            raise NetworkAccessBlocked(
                f"network access to {address!r} is blocked: chapters must run offline in the "
                "default profile (NN_KERNELS_NO_NETWORK=1, set by book/tools/run_chapters.py)"
            )

    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex
    _getaddrinfo = socket.getaddrinfo

    def connect(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _guard(address)
        return _connect(self, address)

    def connect_ex(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _guard(address)
        return _connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host is not None:
            _guard(host if isinstance(host, str) else host.decode())
        return _getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
    socket.NetworkAccessBlocked = NetworkAccessBlocked  # type: ignore[attr-defined]

"""Processes and sockets the serve and score tests look at, from psutil: what a command
started (process trees), whether it is still running (a zombie has exited), names and
command lines, and the TCP ports those processes listen on."""

from __future__ import annotations

import socket
import time

import psutil

from bertfuse.ray_cluster import alive


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (zombies count as gone)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    return alive({p.pid for p in kids})


def wait_gone(pids: set[int], timeout: float = 60.0) -> set[int]:
    """Waits up to `timeout` s for `pids` to end; those still running."""
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def process_name(pid: int) -> str:
    """The process's name as the kernel keeps it (15 characters); '?' once it is gone."""
    try:
        return psutil.Process(pid).name()[:15]
    except psutil.Error:
        return "?"


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces; '?' once it is gone."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "?"


def listeners(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN that one of `pids` holds (psutil's
    table of the host's sockets; the address as /proc/net/tcp writes it, hex, so that the
    loopback checks read one form for IPv4 and IPv6)."""
    out = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((_hex_address(conn.laddr.ip), conn.laddr.port, conn.pid))
    return out


def _hex_address(ip: str) -> str:
    """An address as the kernel's socket tables print it (each 32-bit word little-endian)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    raw = socket.inet_pton(family, ip)
    return "".join(raw[i:i + 4][::-1].hex().upper() for i in range(0, len(raw), 4))

"""Closing HAProxy's listening socket without resetting a connection it has not accepted yet
(SIGTERM's drain, api.Served.drain).

HAProxy's soft stop (SIGUSR1) closes its listening socket. A connection whose handshake the
kernel has completed, but that HAProxy has not accept()ed yet, waits in that socket's accept
queue, and close() resets it: its client connected, sent its request and reads ECONNRESET
(tests/hostile/test_serve_network.py's SIGTERM test saw one in 3,324 requests, on a loaded
2-core machine, where HAProxy's threads wait longer for a CPU between accepts). So before the
soft stop, drain() calls:

    hold(scratch, port)  a copy of HAProxy's listening socket on `port`, from its admin socket
                         (`_getsocks`: Serve's config exposes its listeners there for its own
                         seamless reloads). The copy keeps the socket open, listening, after
                         HAProxy closes its own descriptor.
    quiet(held)          a socket filter on it drops new SYNs (handshakes under way finish), then
                         waits until HAProxy has accepted everything queued or handshaking.

Then SIGUSR1: HAProxy closes its descriptor, finishes what it accepted and exits; no new
connection can complete meanwhile. Closing the copy then closes the socket with nothing
queued: a client whose SYN was dropped retransmits it (after 1 s) and is refused, as after any
stop; none is reset. Linux only (so is the HAProxy ingress); anything that fails here leaves
drain() as it was (SIGUSR1 alone).
"""

from __future__ import annotations

import ctypes
import glob
import os
import socket
import struct
import time

import psutil

SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>
MAX_SEND_FD = 253      # HAProxy's _getsocks sends descriptors in batches of this many
ADMIN_SOCKET = "admin.sock"  # ingress.ingress_env's RAY_SERVE_HAPROXY_SOCKET_PATH


class _Insn(ctypes.Structure):  # struct sock_filter
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Insn))]


# Classic BPF, run on each packet for the listening socket with the TCP header at offset 0:
# a SYN without ACK (a new connection) is dropped, anything else (the ACK that completes a
# handshake already under way, its data) is kept.
_DROP_SYN = [(0x30, 0, 0, 13),           # ldb [13]          the TCP flags
             (0x54, 0, 0, 0x12),         # and #(SYN|ACK)
             (0x15, 0, 1, 0x02),         # jeq #SYN, drop, keep
             (0x06, 0, 0, 0),            # drop: ret #0
             (0x06, 0, 0, 0xFFFFFFFF)]   # keep: ret #-1


def hold(scratch: str, port: int, timeout_s: float = 2.0) -> list[socket.socket]:
    """Copies of the TCP sockets listening on `port` that the HAProxy whose admin socket is
    under `scratch` holds; [] when there is none or it does not answer."""
    held: list[socket.socket] = []
    for path in glob.glob(os.path.join(scratch, "**", ADMIN_SOCKET), recursive=True):
        try:
            fds = _getsocks(path, timeout_s)
        except OSError:
            continue
        for fd in fds:
            os.set_inheritable(fd, False)
            s = socket.socket(fileno=fd)
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM \
                    and s.getsockname()[1] == port \
                    and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                held.append(s)
            else:  # its stats, metrics and admin listeners: not ours to keep open
                s.close()
    return held


def _getsocks(path: str, timeout_s: float) -> list[int]:
    """HAProxy's `_getsocks` (the client side of its seamless reload, sock_get_old_sockets):
    the number of descriptors, then batches of them, each acknowledged."""
    fds: list[int] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        s.sendall(b"_getsocks\n")
        head = s.recv(4, socket.MSG_WAITALL)
        count = struct.unpack("i", head)[0] if len(head) == 4 else 0
        try:
            while len(fds) < count:
                data, got, _, _ = socket.recv_fds(s, 65536, MAX_SEND_FD)
                fds += got
                if not data and not got:
                    break
                s.sendall(struct.pack("i", 0))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
    return fds


def quiet(held: list[socket.socket], timeout_s: float = 2.0) -> bool:
    """Stops new connections on the held sockets, then waits up to timeout_s until none is
    queued for accept() or half-way through its handshake. False if some still are (HAProxy
    not accepting: at its maxconn, say): the soft stop goes ahead, as before."""
    insns = (_Insn * len(_DROP_SYN))(*(_Insn(*i) for i in _DROP_SYN))
    prog = bytes(_Prog(len(_DROP_SYN), insns))  # points into insns, alive for the calls
    for s in held:
        s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
    ports = {s.getsockname()[1] for s in held}
    deadline = time.monotonic() + timeout_s
    while True:
        busy = sum(_accept_queue(s) for s in held) + _handshaking(ports)
        if not busy or time.monotonic() > deadline:
            return not busy
        time.sleep(0.005)


def _accept_queue(s: socket.socket) -> int:
    """Connections waiting for accept(): a listening socket's TCP_INFO tcpi_unacked."""
    return struct.unpack_from("I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 24)[0]


def _handshaking(ports: set[int]) -> int:
    """Connections in SYN_RECV on `ports` (psutil's table of the host's TCP sockets): their
    ACK still lands in the accept queue. 0 where the table cannot be read."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return 0
    return sum(c.status == psutil.CONN_SYN_RECV and c.laddr.port in ports for c in conns)

"""A socket filter that makes a listening TCP socket ignore new connections (Linux).

Closing a listening socket resets every connection the kernel completed but nobody
accepted yet, and one whose handshake completes between the last ``accept`` and the
``close`` cannot be accepted at all. At shutdown the listener is first made to drop new
SYNs (only those: the ACKs that complete handshakes already under way still pass), the
handshakes under way get a moment to complete, and only then is the backlog taken and
the socket closed. A client whose SYN was dropped sends it again about a second later
and finds the port closed (refused) or another front (``--http-workers``) listening:
never a reset after it sent its request.

The filter is classic BPF (``SO_ATTACH_FILTER``, no privilege needed). The kernel runs a
listener's filter on each segment addressed to it with the segment's data at the TCP
header, so byte 13 holds its flags. A connection the listener completes after the filter
is attached inherits the filter; on an established connection it drops only SYNs
without ACK, which TCP has no use for there.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import sys

#: ``SO_ATTACH_FILTER`` (asm-generic/socket.h); Python's ``socket`` module does not name it.
SO_ATTACH_FILTER = 26

#: Where a TCP header keeps its flags, and the two the program reads.
_TCP_FLAGS_BYTE = 13
_SYN, _ACK = 0x02, 0x10

#: Classic BPF opcodes (linux/bpf_common.h).
_LD_B_ABS = 0x30  # BPF_LD | BPF_B | BPF_ABS
_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


def _program() -> ctypes.Array[_Instruction]:
    """``flags & (SYN|ACK) == SYN ? drop : keep all``."""
    return (_Instruction * 5)(
        _Instruction(_LD_B_ABS, 0, 0, _TCP_FLAGS_BYTE),
        _Instruction(_ALU_AND_K, 0, 0, _SYN | _ACK),
        _Instruction(_JEQ_K, 0, 1, _SYN),
        _Instruction(_RET_K, 0, 0, 0),  # drop
        _Instruction(_RET_K, 0, 0, 0xFFFFFFFF),  # keep the whole segment
    )


def drop_new_connections(listener: socket.socket) -> bool:
    """Make ``listener`` (a listening TCP socket) drop new SYNs; False where the platform
    cannot (not Linux, or the filter refused): the caller then closes as before."""
    if not sys.platform.startswith("linux") or listener.type != socket.SOCK_STREAM:
        return False
    if listener.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    program = _program()
    fprog = struct.pack("@HP", len(program), ctypes.addressof(program))
    try:
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True

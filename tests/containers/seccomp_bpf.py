"""The seccomp filters a process runs under, read back from the kernel and evaluated here.

A Docker seccomp profile is compiled by runc into classic BPF. To compare two profiles' behaviour
(ours against the daemon's own default) the lane reads the compiled programs of a process in
each container (ptrace PTRACE_SECCOMP_GET_FILTER: host root, tracee stopped) and runs them on the
same inputs (seccomp_data for each syscall number and architecture, with several argument
vectors). Stdlib only: ctypes for ptrace, a small interpreter for the instructions seccomp allows.
"""

import ctypes
import errno
import os
import re
import struct

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_SECCOMP_GET_FILTER = 0x420C
WALL = 0x40000000

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000

SECCOMP_RET_ACTION_FULL = 0xFFFF0000
SECCOMP_RET_DATA = 0x0000FFFF
ACTIONS = {
    0x80000000: "kill_process",
    0x00000000: "kill_thread",
    0x00030000: "trap",
    0x00050000: "errno",
    0x7FC00000: "user_notif",
    0x7FF00000: "trace",
    0x7FFC0000: "log",
    0x7FFF0000: "allow",
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _ptrace(request, pid, addr, data):
    result = _libc.ptrace(request, pid, addr, data)
    if result == -1:
        number = ctypes.get_errno()
        if number:
            raise OSError(number, f"ptrace({request:#x}, {pid}): {os.strerror(number)}")
    return result


def read_filters(pid, max_filters=16, max_instructions=65536):
    """The programs (lists of (code, jt, jf, k)) attached to pid, newest first. Root only."""
    _ptrace(PTRACE_SEIZE, pid, None, None)
    try:
        _ptrace(PTRACE_INTERRUPT, pid, None, None)
        os.waitpid(pid, WALL)
        programs = []
        for index in range(max_filters):
            try:
                count = _ptrace(PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(index), None)
            except OSError as error:
                if error.errno == errno.ENOENT:
                    break
                raise
            if count <= 0 or count > max_instructions:
                raise OSError(errno.E2BIG, f"filter {index} of pid {pid}: {count} instructions")
            buffer = ctypes.create_string_buffer(8 * count)
            _ptrace(PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(index), buffer)
            programs.append([struct.unpack_from("<HBBI", buffer.raw, 8 * i) for i in range(count)])
        return programs
    finally:
        _ptrace(PTRACE_DETACH, pid, None, None)


def seccomp_data(arch, nr, args, ip=0):
    return struct.pack("<iIQ6Q", nr, arch, ip, *[a & 0xFFFFFFFFFFFFFFFF for a in args])


def run(program, data, max_steps=1 << 20):
    """The 32-bit return value of one classic BPF program on a seccomp_data buffer."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    mask = 0xFFFFFFFF
    for _ in range(max_steps):
        code, jt, jf, k = program[pc]
        cls = code & 0x07
        if cls == 0x00 or cls == 0x01:  # LD, LDX
            mode = code & 0xE0
            if mode == 0x00:
                value = k
            elif mode == 0x20:  # ABS (seccomp: 32-bit loads, aligned, inside seccomp_data)
                if k % 4 or k + 4 > len(data):
                    raise ValueError(f"load outside seccomp_data at {k}")
                value = struct.unpack_from("<I", data, k)[0]
            elif mode == 0x60:
                value = mem[k]
            elif mode == 0x80:
                value = len(data)
            else:
                raise ValueError(f"instruction {code:#x} not allowed in seccomp")
            if cls == 0x00:
                a = value
            else:
                x = value
        elif cls == 0x02:  # ST
            mem[k] = a
        elif cls == 0x03:  # STX
            mem[k] = x
        elif cls == 0x04:  # ALU
            operand = x if code & 0x08 else k
            op = code & 0xF0
            if op == 0x00:
                a = (a + operand) & mask
            elif op == 0x10:
                a = (a - operand) & mask
            elif op == 0x20:
                a = (a * operand) & mask
            elif op == 0x30:
                a = a // operand if operand else 0
            elif op == 0x40:
                a |= operand
            elif op == 0x50:
                a &= operand
            elif op == 0x60:
                a = (a << (operand & 31)) & mask
            elif op == 0x70:
                a >>= operand & 31
            elif op == 0x80:
                a = (-a) & mask
            elif op == 0x90:
                a = a % operand if operand else 0
            elif op == 0xA0:
                a ^= operand
            else:
                raise ValueError(f"ALU instruction {code:#x}")
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            if op == 0x00:
                pc += 1 + k
                continue
            operand = x if code & 0x08 else k
            if op == 0x10:
                taken = a == operand
            elif op == 0x20:
                taken = a > operand
            elif op == 0x30:
                taken = a >= operand
            elif op == 0x40:
                taken = (a & operand) != 0
            else:
                raise ValueError(f"JMP instruction {code:#x}")
            pc += 1 + (jt if taken else jf)
            continue
        elif cls == 0x06:  # RET
            source = code & 0x18
            return a if source == 0x10 else (x if source == 0x08 else k)
        else:  # MISC
            if code & 0xF8 == 0x80:
                a = x
            else:
                x = a
        pc += 1
    raise ValueError("program did not return")


def decide(programs, data):
    """What the kernel does for this seccomp_data: the most restrictive filter's answer, as
    (action name, errno or data)."""
    def precedence(value):
        action = value & SECCOMP_RET_ACTION_FULL
        # Lower action values take precedence (the kernel compares them as signed for KILL_PROCESS).
        return -1 if action == 0x80000000 else action

    best = None
    for program in programs:
        value = run(program, data)
        if best is None or precedence(value) < precedence(best):
            best = value
    action = best & SECCOMP_RET_ACTION_FULL
    return ACTIONS.get(action, f"{action:#x}"), best & SECCOMP_RET_DATA


def syscall_names(header, x32_bit=0):
    """{number: name} from a kernel uapi unistd header (asm/unistd_64.h and friends; x32's
    numbers are written `(__X32_SYSCALL_BIT + N)`)."""
    names = {}
    pattern = re.compile(r"#define __NR_(\w+)\s+\(?(?:__X32_SYSCALL_BIT\s*\+\s*)?(\d+)\)?\s*$")
    with open(header) as file:
        for line in file:
            match = pattern.match(line)
            if match:
                names[int(match.group(2)) | x32_bit] = match.group(1)
    return names

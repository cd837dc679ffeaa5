// The contract between the runtime and rlm-sandbox-init. Both sides include this header, so the
// flag names and the report's keys cannot drift apart. No dependencies: init includes it too.
//
// Command line:
//   rlm-sandbox-init [--report-fd N] [--grace-ms G] [--rlimit NAME=SOFT:HARD]... [--chdir DIR]
//                    [--seccomp-fd N [--seccomp-notify-fd M]] [--guard-signals] [--pid1] -- ARGV...
// The payload's environment is init's own (the envp the runtime gave it); ARGV[0] is looked up
// in its PATH. NAME is one of cpu, as, fsize, nofile, core, nproc, data, stack; SOFT and HARD
// are numbers or "unlimited", and are only ever lowered (clamped to the current hard limit).
//
// --seccomp-fd N: a sealed memfd holding a classic-BPF program (struct sock_filter[]); init reads
// and closes it, and the payload installs it as its last step before execvp. --seccomp-notify-fd M:
// the same policy with its kill actions compiled as SECCOMP_RET_USER_NOTIF; the payload installs
// this one instead, with SECCOMP_FILTER_FLAG_NEW_LISTENER, and hands the listener to init, which
// kills the whole tree on the first notification and reports the syscall number. If the kernel
// refuses a listener, the payload falls back to N (kills by SIGSYS, no syscall number).
// --guard-signals (needs --seccomp-fd): the payload may signal only itself and processes started
// after it (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, kill(0)/kill(-1)/kill(-pgid),
// F_SETOWN), and set the limits (prlimit64) only of those; pidfd_send_signal, F_SETOWN_EX and
// FIOSETOWN/SIOCSPGRP fail with EPERM. Init adds the guard to the program (M if given, else N),
// installs it with a listener and decides each held call; when the kernel refuses a listener
// the payload does not start (setup_errno, step "guard"). Sessions use it: a cell must not touch
// its checkpoints (worker/init/signal_guard.hpp).
// --pid1: init is PID 1 of a PID namespace (also assumed when getpid() == 1): it stops the tree
// with kill(-1) instead of walking /proc, and makes itself non-dumpable so the payload (same uid)
// cannot ptrace it or write its memory through /proc/1/mem.
//
// Report: init writes exactly one line of JSON to the report fd, then exits:
//   {"exit_code":3,"cpu_us":1200}           the payload's main process exited
//   {"signal":9,"cpu_us":1000000}           it was killed by a signal
//   {"exec_errno":2,"path":"foo"}           execvp(ARGV[0]) failed
//   {"setup_errno":2,"step":"chdir","path":"/x"}   chdir/setrlimit failed before exec
//   {"init_error":"message"}                init itself could not do its job
// plus "seccomp_violation":NR (the native syscall number) when a notify-mode filter caught the
// payload and init killed the tree for it, and "terminated":true when init tore the tree down
// because it received SIGTERM, plus "terminated_by_payload":true when that SIGTERM came from inside
// the sandbox (the kernel names no sender outside init's PID namespace; without one, a sender
// outside init's process tree; a queued or SIGIO signal, whose sender the kernel does not vouch
// for, counts as the payload's). cpu_us is the main process's own CPU time (it is what RLIMIT_CPU
// measures). Without --report-fd init only mirrors the payload in its exit status (the code, or
// 128+N for signal N).
//
// Await mode (warm sandboxes, docs/pools-and-server.md):
//   rlm-sandbox-init [--report-fd N] [--grace-ms G] [--seccomp-fd N [--seccomp-notify-fd M]]
//                    [--pid1] [--hold-after-report] --await-payload FD
// FD is a unix stream socket to the host. Init does everything above up to starting the payload
// (signals, filters loaded, non-dumpable, subreaper), then waits on FD for ONE payload message
// (below). EOF (or SIGTERM) before a whole message: init reports init_error and exits without
// starting anything; so does a malformed message. After the payload has started, init keeps FD:
// when the host's end closes (the host died), init SIGKILLs the whole tree at once, without
// grace, and reports "terminated":true. The host never writes to FD after the message.
// --hold-after-report: once its report is written (every other process dead and reaped), init
// does not exit but waits for the host to close FD or kill it. A pool's sandboxes are built so:
// the teardown of the namespaces (init's exit, about half a millisecond of CPU) then happens when
// the pool destroys the used sandbox, after a burst of runs, not beside the next run. Only for a
// host that does not wait for init's exit to finish a run (it reads the report's line).
//
// The payload message, all integers little-endian u32:
//   magic kPayloadMagic, body_bytes, argc (>= 1), envc, nlimits, ninherit, flags, grace_ms,
//   then body_bytes of NUL-terminated strings, in this order and nothing after them:
//   workdir ("" keeps the current directory), nlimits rlimits as "NAME=SOFT:HARD" (as --rlimit),
//   ninherit fd numbers in decimal (>= 4, distinct), argc argv strings, envc "NAME=value" strings.
// flags: kPayloadGuardSignals (as --guard-signals), kPayloadStdio (three fds come with it).
// SCM_RIGHTS on the message's first byte: with kPayloadStdio, the payload's stdin, stdout and
// stderr, then the ninherit fds the payload inherits under the numbers listed (in that order);
// any other count is malformed. The payload runs with exactly argv and envp (ARGV[0] is looked up
// in envp's PATH); without kPayloadStdio it inherits init's stdio.
//
// Signals to init: SIGTERM stops the whole tree (SIGTERM + SIGCONT to every descendant, SIGKILL
// after the grace); SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 are forwarded to the payload.
#pragma once

namespace rlm::init_protocol {

inline constexpr const char* kBinaryName = "rlm-sandbox-init";

inline constexpr const char* kReportFdFlag = "--report-fd";
inline constexpr const char* kGraceFlag = "--grace-ms";
inline constexpr const char* kRlimitFlag = "--rlimit";
inline constexpr const char* kChdirFlag = "--chdir";
inline constexpr const char* kSeccompFdFlag = "--seccomp-fd";
inline constexpr const char* kSeccompNotifyFdFlag = "--seccomp-notify-fd";
inline constexpr const char* kPid1Flag = "--pid1";
inline constexpr const char* kGuardSignalsFlag = "--guard-signals";
inline constexpr const char* kAwaitPayloadFlag = "--await-payload";
inline constexpr const char* kHoldAfterReportFlag = "--hold-after-report";

// The payload message (await mode).
inline constexpr unsigned kPayloadMagic = 0x314d4c52;  // "RLM1"
inline constexpr unsigned kPayloadHeaderWords = 8;
inline constexpr unsigned kPayloadGuardSignals = 1u << 0;
inline constexpr unsigned kPayloadStdio = 1u << 1;
// Bounds init enforces on a message (the kernel's ARG_MAX is smaller than the body bound).
inline constexpr unsigned kPayloadMaxBodyBytes = 8u << 20;
inline constexpr unsigned kPayloadMaxStrings = 1u << 18;
inline constexpr unsigned kPayloadMaxLimits = 16;
inline constexpr unsigned kPayloadMaxInherited = 4;
inline constexpr unsigned kPayloadMaxGraceMs = 3'600'000;

// The fd number the runtime hands the report pipe on (0-2 are the payload's stdio).
inline constexpr int kReportFd = 3;

// The payload's file-creation mask, whatever the host process's was: init sets it, and the
// namespace backend's child sets it before it builds the root filesystem.
inline constexpr unsigned kPayloadUmask = 022;

// Init's exit status when it could not do its job (bad usage, setup failure).
inline constexpr int kInitFailureExit = 125;

// Report keys.
inline constexpr const char* kExitCodeKey = "exit_code";
inline constexpr const char* kSignalKey = "signal";
inline constexpr const char* kCpuKey = "cpu_us";
inline constexpr const char* kExecErrnoKey = "exec_errno";
inline constexpr const char* kSetupErrnoKey = "setup_errno";
inline constexpr const char* kStepKey = "step";
inline constexpr const char* kPathKey = "path";
inline constexpr const char* kInitErrorKey = "init_error";
inline constexpr const char* kTerminatedKey = "terminated";
inline constexpr const char* kTerminatedByPayloadKey = "terminated_by_payload";
inline constexpr const char* kSeccompViolationKey = "seccomp_violation";

}  // namespace rlm::init_protocol

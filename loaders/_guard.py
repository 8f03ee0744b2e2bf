"""Run one command (LibreOffice) so that it dies with its caller, has no network and leaves no files.

    python -I _guard.py PARENT_PID WORKDIR TIMEOUT_S COMMAND...

Started by path (stdlib only, nothing from the package) by loaders/legacy.py in a loader worker.

NOTE (guard protocol):
- Setup: cut the network (unshare CLONE_NEWNET; else CLONE_NEWUSER|CLONE_NEWNET with identity id
  maps; else run with it), lift RLIMIT_AS's soft limit to the hard one (the worker's cap is not
  LibreOffice's), become a session leader (terminal signals miss us), a child subreaper (orphaned
  soffice.bin becomes our child), and ask for SIGTERM when PARENT_PID dies (PR_SET_PDEATHSIG, set
  last because credential changes clear it; checked against getppid for the race). The signal
  comes when the parent's *thread* that started us ends: legacy.py starts us from the thread that
  runs the task (pebble's main thread) and closes our stdin before that task returns.
- COMMAND runs as our child in a session and process group of its own (soffice -> oosplash ->
  soffice.bin all stay in it), its output and errors in WORKDIR/soffice.log.
- Verdict: when COMMAND ends, or after TIMEOUT_S, we kill its group and print one line, the exit
  status we will end with: COMMAND's own status, TIMEOUT (124), or FAILED (127: it could not start).
- Then we wait for stdin to close (the caller has read the output from WORKDIR, or has died). On
  that EOF, on SIGTERM (INTERRUPTED, 143: the parent died or a caller gave up) or any error we kill
  the group with SIGKILL, reap every descendant, remove WORKDIR (profile included) and exit.
"""
from __future__ import annotations

import ctypes
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

TIMEOUT, FAILED, INTERRUPTED = 124, 127, 143
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
POLL_S = 0.05           # how often the command, stdin and SIGTERM are looked at
REAP_S = 5.0            # at most this long to reap the killed group
_TERM: list[int] = []   # signals received; the handler only records them


def cut_network(libc: ctypes.CDLL) -> str:
    """Move this process into a new, empty network namespace; how it went ("netns", "userns+netns", "kept")."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return "kept"
    # The namespace's owner may always map its own ids, once each; then files keep their owner.
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    return "userns+netns"


def lift_memory_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def caller_gone(wait_s: float) -> bool:
    """True once SIGTERM came or stdin is at EOF; waits up to `wait_s` for either."""
    if not _TERM:
        ready, _, _ = select.select([0], [], [], wait_s)
        if ready and not os.read(0, 4096):
            return True
    return bool(_TERM)


def kill_and_reap(proc: subprocess.Popen | None) -> None:
    """SIGKILL the command's process group and reap every descendant (we are their subreaper)."""
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    deadline = time.monotonic() + REAP_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(POLL_S)
        except ChildProcessError:
            return


def convert(command: list[str], workdir: Path, timeout_s: float, log: BinaryIO) -> tuple[int, subprocess.Popen | None]:
    """Run `command` until it ends, `timeout_s` passes or the caller goes: (exit status, its process)."""
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir,
                                start_new_session=True)
    except OSError as exc:
        log.write(f"guard: error: cannot start {command[0]}: {exc}\n".encode())
        return FAILED, None
    deadline = time.monotonic() + timeout_s
    while (status := proc.poll()) is None:
        if caller_gone(POLL_S):
            return INTERRUPTED, proc
        if time.monotonic() > deadline:
            return TIMEOUT, proc
    return status, proc


def run(parent: int, workdir: Path, timeout_s: float, command: list[str]) -> int:
    """The protocol above; returns the exit status."""
    proc = None
    try:
        os.setsid()
        lift_memory_limit()
        network = "kept"
        if sys.platform == "linux":                         # elsewhere: no namespaces, no death signal
            libc = ctypes.CDLL(None)
            network = cut_network(libc)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:                          # it died before the death signal was set
            return INTERRUPTED
        with (workdir / "soffice.log").open("ab") as log:
            log.write(f"guard: network {network}\n".encode())
            log.flush()
            status, proc = convert(command, workdir, timeout_s, log)
        kill_and_reap(proc)
        proc = None
        if status != INTERRUPTED:
            print(status, flush=True)
            while not caller_gone(1.0):
                pass
        return status
    finally:
        kill_and_reap(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda signum, frame: _TERM.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, workdir, timeout_s, command = int(argv[1]), Path(argv[2]), float(argv[3]), argv[4:]
    return run(parent, workdir, timeout_s, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Did MSCCL run? Reads NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV;
msccl-xml.md §12.2); torch-free."""

from __future__ import annotations

import os
import re
from pathlib import Path

_SETUP = re.compile(r"MSCCL: Setup Kernel finished")
_ALGO_DIR = re.compile(r"Using MSCCL Algo files from\s*(\S*)")
_CONNECTED = re.compile(r"Connected (\d+) MSCCL algorithms")
_PARSED = re.compile(r"Parsed MSCCL Algorithm (\S+) successfully")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def check_runtime(log_text: str) -> tuple[bool, str]:
    """Reads NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV; msccl-xml.md §12.2) and
    says whether MSCCL ran: the executor and RCCL print "MSCCL: Setup Kernel finished" on every
    launch of an MSCCL algorithm; legacy MSCCL prints "Connected N MSCCL algorithms" at init (it
    has no per-launch line, so that proves loading, not use)."""
    launches = len(_SETUP.findall(log_text))
    dirs = sorted(set(_ALGO_DIR.findall(log_text)))
    connected = [int(x) for x in _CONNECTED.findall(log_text)]
    versions = sorted(set(_VERSION.findall(log_text)))
    ver = f" (NCCL {', '.join(versions)})" if versions else ""
    if "MSCCL doesn't support multiple GPUs in one process" in log_text:
        return False, ("MSCCL did not run: it turns itself off when one process drives several GPUs; use one "
                       "process per GPU (torchrun --nproc_per_node=N)" + ver)
    if launches:
        src = f" from {dirs[0]}" if dirs else ""
        return True, f"MSCCL ran: {launches} kernel launches of MSCCL algorithms{src}{ver}"
    if connected and max(connected) > 0:
        return True, (f"legacy MSCCL loaded {max(connected)} algorithms{ver}; it prints no per-launch line, so "
                      f"this proves loading, not that a call used one")
    if dirs or connected:
        where = f" from {dirs[0]}" if dirs else ""
        return False, (f"MSCCL did not run: the runtime looked for algorithms{where} but no launch used one "
                       f"(check coll, ngpus = world size, minBytes..maxBytes, the in-place flags and that "
                       f"nchunksperloop divides the element count){ver}")
    if not log_text.strip() or "NCCL INFO" not in log_text:
        return False, ("MSCCL did not run, or the log does not show it: no NCCL INFO lines (set NCCL_DEBUG=INFO "
                       "NCCL_DEBUG_SUBSYS=INIT,ENV before the process starts)")
    return False, ("MSCCL did not run: NCCL logged no MSCCL line; the libnccl in use is not MSCCL-enabled "
                   f"(LD_PRELOAD the executor's build/lib/libnccl.so.2; check torch.cuda.nccl.version()){ver}")


def own_log_path() -> str | None:
    """This process's NCCL_DEBUG_FILE, with NCCL's %h (host) and %p (pid) expanded."""
    import socket
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    return pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())) if pattern else None


def read_logs(directory: str) -> str:
    out = []
    for f in sorted(Path(directory).glob("nccl.*.log")):
        try:
            out.append(f.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(out)

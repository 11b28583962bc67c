"""A child process's own peak memory, for the hostile-file tests.

getrusage's and wait4's `ru_maxrss` keep, across exec, the peak of the process image that
exec replaced: on Linux that is the forked (or vforked) copy of pytest, gigabytes late in a
full suite, whatever the child itself used. `VmHWM` in /proc/self/status is the peak of the
child's own address space, read from that file by hand: psutil has no peak (its memory_info()
and memory_full_info() give the current rss, vms, uss, pss and swap only). A child run
through `WRAPPER` writes it (kB) to the file named by $BERTFUSE_TEST_PEAK_FILE as it exits
(atexit: normal ends, sys.exit and uncaught errors; a child killed by a signal writes
nothing, and `peak_kb` says None).
"""

from __future__ import annotations

from pathlib import Path

ENV = "BERTFUSE_TEST_PEAK_FILE"

WRAPPER = """
import atexit, os, re, runpy, sys
def _peak():
    with open('/proc/self/status') as f:
        kb = re.search(r'VmHWM:\\s*(\\d+)', f.read()).group(1)
    with open(os.environ['BERTFUSE_TEST_PEAK_FILE'], 'w') as f:
        f.write(kb)
atexit.register(_peak)
args = sys.argv[1:]
if args[0] == '-m':
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name='__main__', alter_sys=True)
elif args[0] == '-c':
    sys.argv = ['-c', *args[2:]]
    exec(compile(args[1], '<string>', 'exec'), {'__name__': '__main__'})
else:
    raise SystemExit('peak_rss.WRAPPER takes -m MODULE or -c CODE')
"""


def wrapped(args: list) -> list:
    """`python ARGS` (ARGS: -m MODULE ... or -c CODE ...) as arguments after the interpreter."""
    return ["-c", WRAPPER, *map(str, args)]


def peak_kb(path: Path) -> int | None:
    """The peak the child wrote, or None where it wrote none (killed by a signal)."""
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return None

"""A rank for the zygote tests: reports what a fresh `python -u` would have seen, then does
what its first argument says (exit N, raise, answer SIGTERM, sleep)."""

import sys

PRELOADED = "torch" in sys.modules  # before this script's own imports: forked warm or not

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from trainyard.plugins.files import write_atomic  # noqa: E402


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    facts = {"preloaded": PRELOADED, "name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
             "path0": sys.path[0], "rank": os.environ.get("RANK"), "threads": torch.get_num_threads(),
             "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid()}
    if mode == "term":  # before the facts: the test sends SIGTERM as soon as it reads them
        terms: list[float] = []

        def on_term(*_: object) -> None:
            terms.append(time.time())
            if len(terms) == 1:  # a second SIGTERM, if any, arrives while this one is handled
                time.sleep(1.0)
                Path(f"{out}.terms").write_text(str(len(terms)))
                sys.exit(43)

        signal.signal(signal.SIGTERM, on_term)
    write_atomic(out, json.dumps(facts))  # whole or absent: the test reads it at once
    print("probe started", flush=True)
    if mode == "raise":
        raise RuntimeError("probe failed on purpose")
    if mode in ("term", "sleep"):
        time.sleep(120)
        return 0
    return int(mode)


if __name__ == "__main__":
    sys.exit(main())

"""What this CPU can read from memory, for the bandwidth column of the decode benchmarks.

A read of a buffer far larger than the last-level cache by every method the C++ probe has (load width:
64-bit scalar, AVX2, AVX-512, AVX-512 non-temporal; pattern: 1 MiB chunks from a shared counter, one slice
per thread, one slice read as 4 interleaved streams; 1 to all of the pool's threads). The best method is the
roofline: a decode step that reads its weights at that rate cannot go faster.

    python benchmarks/read_probe.py [--gib 1] [--reps 5]   # the sweep as a table

Benchmarks sweep once (`ReadProbe.sweep`), then re-measure the best method around each of their runs
(`ReadProbe.gb_per_s`), since memory bandwidth on a shared machine drifts.
"""
from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from shrike import _C

PATTERNS = ("chunks", "slices", "streams4")


class ReadProbe:
    def __init__(self, gib: float = 1.0, max_threads: int | None = None):
        """max_threads: the most threads a method uses (default: all of the kernel pool's)."""
        self.max_threads = min(max_threads or _C.num_threads(), _C.num_threads())
        nbytes = int(gib * (1 << 30)) // 4096 * 4096
        raw = np.ones(nbytes + 64, dtype=np.uint8)
        offset = -raw.ctypes.data % 64  # the non-temporal loads need 64-byte alignment
        self._buffer = raw[offset:offset + nbytes]
        self.best: dict | None = None  # the fastest method of the last sweep: width, pattern, threads, gb_per_s

    def read_gb_per_s(self, width: str, pattern: str, threads: int, reps: int) -> float:
        """Best of reps (as STREAM reports) after one unmeasured read."""
        _C.read_bandwidth_probe(self._buffer, width, pattern, threads)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            _C.read_bandwidth_probe(self._buffer, width, pattern, threads)
            best = min(best, time.perf_counter() - start)
        return self._buffer.nbytes / best / 1e9

    def sweep(self, reps: int = 3) -> list[dict]:
        """Every method once; remembers the fastest. Rows fastest first."""
        rows = [{"width": w, "pattern": p, "threads": t, "gb_per_s": self.read_gb_per_s(w, p, t, reps)}
                for w, p, t in itertools.product(_C.read_widths(), PATTERNS, range(1, self.max_threads + 1))]
        rows.sort(key=lambda row: -row["gb_per_s"])
        self.best = rows[0]
        return rows

    def gb_per_s(self, reps: int = 5) -> float:
        """The best method of the sweep (sweeping first if none ran), measured now."""
        if self.best is None:
            self.sweep()
        return self.read_gb_per_s(self.best["width"], self.best["pattern"], self.best["threads"], reps)

    def describe(self) -> str:
        b = self.best
        return f"{b['width']} loads, {b['pattern']}, {b['threads']} thread(s)" if b else "not swept"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="buffer size in GiB (default 1)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    probe = ReadProbe(args.gib)
    print(f"{'width':<15}{'pattern':<10}{'threads':>8}{'GB/s':>8}")
    for row in probe.sweep(args.reps):
        print(f"{row['width']:<15}{row['pattern']:<10}{row['threads']:>8}{row['gb_per_s']:>8.1f}")
    print(f"best: {probe.describe()}")


if __name__ == "__main__":
    main()

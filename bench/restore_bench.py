"""Restoring one multi-GB blob from the local cache against its parts: a plain copy and a sha256 pass.

    python bench/restore_bench.py [--gb 1.3] [--runs 3]

`restore_streamed` is the same restore with copy_file_range disabled (every byte read into Python and
written back, hashed on the way): the baseline before this change. Each run restores into a fresh directory (what a fresh OUT sees), with the page cache as the previous
step left it: all figures are medians of runs done side by side, same file, same disk. Also reports the
peak RSS of this process, which must stay far below the blob's size (streamed, never read whole).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ctxbuild.cache import LocalStore  # noqa: E402
from ctxbuild.cache import files  # noqa: E402
from ctxbuild.cache.files import hash_file  # noqa: E402


def timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.3)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxbuild-restorebench-", dir="/tmp") as tmp:
        d = Path(tmp)
        src = d / "model_ctx_qnn.bin"
        with open(src, "wb") as f:  # incompressible, written in 64 MB pieces
            for _ in range(int(args.gb * 1024 / 64)):
                f.write(os.urandom(64 << 20))
        store = LocalStore(d / "cache")  # the copy path (the default; a linked restore copies nothing)
        put_s = timed(lambda: store.put("a" * 64, {"bin": src}, None, {}))
        record = store.get_record("a" * 64)
        assert record is not None
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        times: dict[str, list[float]] = {"restore": [], "restore_streamed": [], "cp": [], "sha256": []}
        kernel_copy = files._kernel_copy
        for i in range(args.runs):
            dest = d / f"out{i}"
            times["restore"].append(timed(lambda: store.restore(record, {"bin": dest / src.name})))
            shutil.rmtree(dest)
            files._kernel_copy = lambda fin, fout: False  # the baseline: bytes through Python, hashed on the way
            times["restore_streamed"].append(timed(lambda: store.restore(record, {"bin": dest / src.name})))
            files._kernel_copy = kernel_copy
            times["cp"].append(timed(lambda: subprocess.run(["cp", str(src), str(d / f"cp{i}")], check=True)))
            times["sha256"].append(timed(lambda: hash_file(src)))
            shutil.rmtree(dest)
            (d / f"cp{i}").unlink()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        med = {k: round(statistics.median(v), 3) for k, v in times.items()}
        result = {"gb": args.gb, "runs": args.runs, "store_seconds": round(put_s, 3), "median_seconds": med,
                  "restore_over_cp_plus_sha256": round(med["restore"] / (med["cp"] + med["sha256"]), 2),
                  "peak_rss_mb": peak // 1024, "rss_growth_mb": (peak - rss_before) // 1024}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "restore_bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Is eager host time a property of the machine? (session 15, third H200 lease)

Session 15's first lease measured 1.85 ms of host time per eager decoder layer (forward +
backward, `measure_h200_ops.py` host section), the third lease's blind set ran a 32-layer
decoder at 0.9 ms per layer. This script runs, on one machine: the CPU's identity, the host
section again (twice), and the host-bound training steps of both leases (`host_check.jsonl`,
`probe.jsonl`). Run: `python benchmarks/measure_h200_host.py [--smoke]`.
"""

from __future__ import annotations

import json
import os
import platform
import time

from harness import h200_kit as ops

RUNS = (
    ("set3-14", dict(L=32, h=1024, nh=8, nkv=8, ffn=2816, V=32000), 2048, 1, False, 8),
    ("acc8L", dict(L=8, h=2048, nh=16, nkv=16, ffn=5632, V=32000), 512, 1, False, 32),
    ("tiny1b", dict(L=16, h=2048, nh=16, nkv=16, ffn=5632, V=32000), 512, 1, False, 1),
    ("tiny1b", dict(L=16, h=2048, nh=16, nkv=16, ffn=5632, V=32000), 2048, 1, False, 1),
    ("tiny1b", dict(L=16, h=2048, nh=16, nkv=16, ffn=5632, V=32000), 2048, 1, True, 1),
)


def main() -> None:
    with open("/proc/cpuinfo") as fh:
        info = fh.read()
    mhz = [float(ln.split(":")[1]) for ln in info.splitlines() if ln.startswith("cpu MHz")]
    flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    ops.emit({"kind": "cpu", "machine": platform.node(), "cpu_mhz": mhz[:4],
              "avx512": "avx512f" in flags, "amx": "amx_tile" in flags,
              "load": os.getloadavg()})
    ops.meta()
    for _ in range(2):
        ops.host_section(1e9)
    f = open(os.path.join(ops.OUT, "host_check.jsonl"), "a")  # noqa: SIM115
    ops.TRAIN_MODELS.update({name: cfg for name, cfg, *_ in RUNS})
    for name, _cfg, seq, mbs, rc, nmb in RUNS:
        saved = ops.TRAIN_RUNS
        ops.TRAIN_RUNS = ((name, seq, mbs, rc, nmb),)
        t0 = time.time()
        ops.train_section(1e9)
        ops.TRAIN_RUNS = saved
        f.write(json.dumps({"run": name, "seq": seq, "mbs": mbs, "rc": rc, "m": nmb,
                            "wall_s": time.time() - t0}) + "\n")
    f.close()
    ops.emit({"kind": "cpu", "after": True, "load": os.getloadavg()})


if __name__ == "__main__":
    main()

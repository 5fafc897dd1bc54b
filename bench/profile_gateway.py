"""Where does the gateway spend its CPU under load? py-spy on a Pointsman gateway driven by loadgen.

Starts the fake upstream (core 0) and a passthrough Pointsman gateway (core 1, the same config as
``proxy_overhead.py``), drives it with ``c`` closed-loop workers (core 0), samples the gateway with
``py-spy record --nonblocking`` (core 0, so sampling does not steal the gateway's core) and prints the
top functions by own time and by inclusive time. The raw py-spy output (collapsed stacks, one line
per stack) is kept so it can be fed to a flamegraph tool.

Needs ``py-spy`` (``pip install py-spy``). Run:
``.venv/bin/python bench/profile_gateway.py [-c 16 --seconds 8 --raw bench/results/gateway.raw]``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import _procs
import proxy_overhead


def layer_of(frame: str) -> str:
    """The package a py-spy frame ``func (pkg/module.py:123)`` belongs to (``uuid`` for ``uuid.py``)."""
    location = frame.rpartition(" (")[2].rstrip(")")
    path = location.rpartition(":")[0] or location
    head = path.split("/", 1)[0]
    return head.removesuffix(".py") or "?"


def summarize(raw_path: Path, top: int) -> str:
    """Own time by package, then the top frames by own and by inclusive samples (py-spy raw output)."""
    own: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        layers[layer_of(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "own time by package:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in layers.most_common(15)]
    lines += ["", "own time (the function itself):"]
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "inclusive time (the function and what it calls):"]
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in inclusive.most_common(top * 2)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Start upstream + gateway, load it, profile it, print the summary."""
    parser = argparse.ArgumentParser(description="profile the Pointsman gateway under load with py-spy")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0, help="profiled seconds")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--native", action="store_true", help="include native (C) frames")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    pin = _procs.cpu_count() >= 2
    side, gateway_cpus = ({0}, {1}) if pin else (None, None)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp_dir:
        tmp = Path(tmp_dir)
        up_port = _procs.free_port()
        upstream = _procs.start(
            [sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(up_port)],
            tmp / "upstream.log",
            cpus=side,
        )
        gateway: subprocess.Popen[bytes] | None = None
        load: subprocess.Popen[bytes] | None = None
        try:
            target, log = proxy_overhead.start_pointsman(tmp, up_port, gateway_cpus)
            gateway = target.proc
            _procs.wait_http(f"http://127.0.0.1:{up_port}/v1/models", upstream, 15)
            body = {"model": proxy_overhead.MODEL, "messages": [{"role": "user", "content": "hi"}]}
            _procs.wait_http(target.url, gateway, 60, body=body, log_path=log)
            assert gateway is not None
            load = _procs.start(
                [
                    sys.executable,
                    str(_procs.BENCH_DIR / "loadgen.py"),
                    "--url",
                    target.url,
                    "-c",
                    str(args.concurrency),
                    "--duration",
                    str(args.seconds + 2),
                    "--warmup",
                    "1",
                ],
                tmp / "loadgen.log",
                cpus=side,
            )
            raw = args.raw or tmp / "gateway.raw"
            raw.parent.mkdir(parents=True, exist_ok=True)
            spy_cmd = [
                py_spy,
                "record",
                "-p",
                str(gateway.pid),
                "-d",
                str(int(args.seconds)),
                "-r",
                str(args.rate),
                "-f",
                "raw",
                "-o",
                str(raw),
                "--nonblocking",
            ]
            if args.native:
                spy_cmd.append("--native")
            subprocess.run(["sleep", "1.5"], check=True)  # past the load generator's warmup
            spy = _procs.start(spy_cmd, tmp / "py-spy.log", cpus=side)
            spy.wait(args.seconds + 30)
            load.wait(args.seconds + 30)
            print((tmp / "loadgen.log").read_text().strip())
            if not raw.exists():
                print((tmp / "py-spy.log").read_text(), file=sys.stderr)
                return 1
            print(summarize(raw, args.top))
            if args.raw:
                print(f"\nraw stacks kept in {args.raw}")
        finally:
            _procs.stop(load)
            _procs.stop(gateway)
            _procs.stop(upstream)
    return 0


if __name__ == "__main__":
    sys.exit(main())

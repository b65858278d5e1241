"""One optimizer step of the mini model on CPU: PyTorch's default Adam (a Python loop over the parameters on CPU),
`foreach` and `fused` (what `make_optimizer` uses). Random gradients; the step does not depend on their values.

    python benchmarks/throughput/adam_cpu.py

Results go to benchmarks/results/adam_cpu.json (one entry per command).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.encoder.model import Encoder
from alignlab.platform.presets import Preset


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=8000, help="the bundled corpus's vocabulary size")
    p.add_argument("--steps", type=int, default=100)
    bench_args.add_flags(p, rounds=3, threads=2, out="adam_cpu.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    command = bench_args.command("throughput/adam_cpu.py", argv).rstrip()
    model = Encoder(Preset.named("mini").pretrain.model, a.vocab)
    params = list(model.parameters())
    for p_ in params:
        p_.grad = torch.randn_like(p_)
    variants = {"default (loop)": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    optimizers = {name: torch.optim.Adam(params, lr=1e-3, **kw) for name, kw in variants.items()}
    times: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for name, opt in optimizers.items():
            opt.step()  # warm
            t0 = time.perf_counter()
            for _ in range(a.steps):
                opt.step()
            times.setdefault(name, []).append(1000 * (time.perf_counter() - t0) / a.steps)
    print(f"# {command}\n# the mini encoder (no heads): {len(params)} tensors, {sum(p_.numel() for p_ in params):,} "
          f"parameters, {a.threads} threads, torch {torch.__version__}")
    print("| Adam | ms/step |\n|---|---|")
    rows = []
    for name in variants:
        ms = statistics.median(times[name])
        rows.append({"adam": name, "ms": round(ms, 2)})
        print(f"| {name} | {ms:.2f} |")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "threads": a.threads, "rows": rows})


if __name__ == "__main__":
    main()

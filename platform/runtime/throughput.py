"""What a pretraining run cost and how well it used its devices: tokens/s, samples/s, MFU, device-hours.

Every pretraining run records these in its model's `final/eval.json` (under "throughput"), in TensorBoard
(`throughput/*`) and in the study report; `alignlab plan` estimates a study's device-hours from them. The
FLOP count (`batch_flops`, with the objectives' `head_flops`) and the peak table live here so that one definition
serves the record, MFU, the plan and the benchmarks.
docs/throughput.md explains the fields for users.
"""
from __future__ import annotations

import json
from pathlib import Path

# devices (torch) is imported inside `run_throughput`: the cost estimates (`alignlab plan`) load no torch.

PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    # Dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's datasheets, per GPU, in TFLOP/s. "fp32" is the
    # plain FP32 rate: PyTorch multiplies fp32 matrices without TF32 unless told to
    # (torch.backends.cuda.matmul.allow_tf32 is False by default). None: the GPU has no native bf16.
    # Order matters: the first key contained in the device's name wins ("H100 PCIe" before "H100", "A100"
    # before "A10").
    "H100 PCIe": {"bf16": 756.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H100": {"bf16": 989.0, "fp32": 67.0},  # SXM5 ("NVIDIA H100 80GB HBM3")
    "H200": {"bf16": 989.0, "fp32": 67.0},  # the H100 SXM's compute with more and faster memory
    "A100": {"bf16": 312.0, "fp32": 19.5},
    "A10G": {"bf16": 125.0, "fp32": 31.2},  # AWS's A10 variant: no own datasheet; the A10's figures
    "A10": {"bf16": 125.0, "fp32": 31.2},
    "L4": {"bf16": 121.0, "fp32": 30.3},
    "V100": {"bf16": None, "fp32": 15.7},
    "T4": {"bf16": None, "fp32": 8.1},
}
"""Peak TFLOP/s by device name and precision. A CPU has no entry: its peak depends on the model, the cores Ray
gave the worker, the vector units and the clock under load, and no figure here would be defensible, so a CPU
run's MFU is recorded as null."""


def peak_flops(device_name: str, precision: str) -> float | None:
    """The device's peak FLOP/s at `precision` ("bf16"/"fp32"), or None when unknown (CPUs, unlisted GPUs)."""
    for key, peaks in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            tf = peaks.get(precision)
            return None if tf is None else tf * 1e12
    return None


def matmul_flops(weights: float, items: float) -> float:
    """Training FLOPs of `weights` matrix weights applied to each of `items` tokens, rows or positions: 6 per weight
    and item (one multiply-add forward, two backward: the gradient of the input and of the weight)."""
    return 6.0 * weights * items


class TwoWayClsHeadFlops:
    """`Objective.head_flops` of a 2-way head on each row's [CLS] (the pooler, d x d, and the output), on every row:
    NSP's and PAD's, whose labels are under the objective's name."""

    def head_flops(self, model_cfg, batch, *, seq_len):
        return self.expected_head_flops(self.config, model_cfg, 0, seq_len=seq_len, rows=len(batch[self.name]),
                                        tokens=0)

    @classmethod
    def expected_head_flops(cls, config, model_cfg, vocab_size, *, seq_len, rows, tokens):
        d = model_cfg.hidden
        return matmul_flops(d * d + 2 * d, rows)


def encoder_flops_per_token(hidden: int, num_layers: int, ffn: int, seq_len: int) -> float:
    """Training FLOPs per token of the encoder: 6 N + 12 L d T (Chowdhery et al. 2022, PaLM, appendix B).

    N = L (4 d^2 + 2 d f) is the non-embedding parameter count of the encoder's matrices (Q, K, V, output
    projection; the two FFN matrices; biases and LayerNorms omitted), each used in one multiply-add forward and
    two backward: 6 FLOPs per parameter and token. 12 L d T is attention's own work (Q K^T and the weighted sum
    of V over T positions, forward and backward), with d = heads x head_dim = `hidden`. The objectives' heads are
    counted apart, per batch (`Objective.head_flops`): the MLM decoder runs on the predicted positions only."""
    n = num_layers * (4 * hidden * hidden + 2 * hidden * ffn)
    return matmul_flops(n, 1) + 12.0 * num_layers * hidden * seq_len


def batch_flops(model_cfg, seq_len: int, num_tokens: float, head_flops: float) -> float:
    """The one FLOP count of a training batch (docs/throughput.md#the-flop-count): the encoder's
    `encoder_flops_per_token` for each of its `num_tokens` real tokens at sequence length `seq_len`, plus its heads'
    `head_flops` (the sum of the objectives' `Objective.head_flops`: MLM's 6 (d^2 + d V) per predicted position,
    the small heads' per row or labelled token)."""
    fpt = encoder_flops_per_token(model_cfg.hidden, model_cfg.num_layers, model_cfg.ffn, seq_len)
    return fpt * num_tokens + head_flops


def summary(*, num_tokens: int, num_samples: int, num_flops: float, seconds: float, num_devices: int,
            device_name: str, precision: str, device_share: float = 1.0) -> dict:
    """The "throughput" record of a run: `num_tokens` real (non-padding) tokens and `num_samples` rows trained on,
    and `num_flops` (the sum of the batches' `batch_flops`), over all the workers, in `seconds` of training-loop
    wall time (summed over the run's lives, start-up and export excluded), on `num_devices` devices called
    `device_name`, each holding `device_share` of its device (a model packed K to a GPU holds 1/K: its
    device-hours are its share of the wall time, so that K such runs add up to the GPU's hours, not K times them)."""
    seconds = max(seconds, 1e-9)
    tps = num_tokens / seconds
    peak = peak_flops(device_name, precision)
    return {
        "tokens_per_s": round(tps, 1), "samples_per_s": round(num_samples / seconds, 2),
        "tokens_per_s_per_device": round(tps / num_devices, 1),
        "samples_per_s_per_device": round(num_samples / seconds / num_devices, 3),
        "mfu": None if peak is None else round(num_flops / seconds / (peak * num_devices), 4),
        "flops": float(num_flops), "flops_per_token": round(num_flops / max(num_tokens, 1), 1),
        "peak_flops_per_device": peak,
        "train_seconds": round(seconds, 2), "device_hours": round(seconds * num_devices * device_share / 3600, 5),
        "num_devices": num_devices, "device_share": device_share, "device": device_name, "precision": precision,
        "num_tokens": int(num_tokens), "num_samples": int(num_samples),
    }


MEASURED: dict[tuple[str, str], float] = {
    # (model size "hidden x layers", device) -> training samples/s per device at the preset's sequence length,
    # from committed benchmark logs; used by `plan` when no model at the storage root has run on that device.
    # The mini preset under Ray Train, 1 worker x 2 threads of a 2-core Xeon, bf16: 0.074 s per 32-row step
    # (benchmarks/results/pretrain_throughput_ray_mini.log).
    ("128x2", "cpu"): 432.0,
    # One bf16 Train worker on one GPU, global batch 256 at sequence length 128, MLM + NSP on full-length rows: the
    # samples/s its eval.json recorded (the whole loop, its waits for data included), from
    # benchmarks/results/gpu_pretrain_h100.json and gpu_pretrain_h200.json. The input path, not the GPU, sets
    # these rates (docs/throughput.md), so 128x2 is barely faster than 768x3.
    ("768x3", "NVIDIA H100 80GB HBM3"): 4884.6,
    ("128x2", "NVIDIA H100 80GB HBM3"): 5721.7,
    ("768x3", "NVIDIA H200"): 4805.2,
}


def measured_rates(models_root: Path) -> dict[tuple[str, str, str], float]:
    """(size, device, precision) -> the mean samples/s per device over the finished models under `models_root`
    whose eval.json records throughput: what `plan` estimates from first."""
    rates: dict[tuple[str, str, str], list[float]] = {}
    for ev_file in sorted(Path(models_root).glob("*/final/eval.json")):
        try:
            ev = json.loads(ev_file.read_text())
            cfg = json.loads((ev_file.parent / "model_config.json").read_text())["model"]
        except (OSError, ValueError, KeyError):
            continue
        tp = ev.get("throughput")
        if not tp or not tp.get("samples_per_s_per_device"):
            continue
        key = (f"{cfg['hidden']}x{cfg['num_layers']}", tp["device"], tp["precision"])
        rates.setdefault(key, []).append(tp["samples_per_s_per_device"])
    return {k: sum(v) / len(v) for k, v in rates.items()}


def same_device(wanted: str, recorded: str) -> bool:
    """Does a recorded device name ("NVIDIA H100 80GB HBM3", "cpu") match the device a user names ("H100")?"""
    if wanted.lower() == "cpu" or recorded == "cpu":
        return wanted.lower() == recorded
    return wanted.lower() in recorded.lower()


def estimate_device_hours(size: str, device: str, precision: str, num_samples: int,
                          rates: dict[tuple[str, str, str], float]) -> tuple[float | None, str]:
    """Device-hours to train a model of `size` on `num_samples` rows on `device`, and where the rate comes from:
    models at the storage root of the same size, device and precision, else of another precision, else the
    benchmark table `MEASURED`; None and why when there is no measurement."""
    for same_precision in (True, False):
        found = [r for (s, d, p), r in rates.items()
                 if s == size and same_device(device, d) and (p == precision) == same_precision]
        if found:
            r = sum(found) / len(found)
            where = "models at the storage root" + ("" if same_precision else ", other precision")
            return num_samples / r / 3600, f"{r:.1f} samples/s/device measured by {where}"
    for (s, d), r in MEASURED.items():
        if s == size and same_device(device, d):
            return num_samples / r / 3600, f"{r:.1f} samples/s/device from the benchmark table (throughput.MEASURED)"
    return None, f"no measured throughput of {size} on {device}: train one model there first"


def run_throughput(trainer, num_tokens: int | None = None, num_samples: int | None = None,
                   num_flops: float | None = None) -> dict:
    """A `Pretrainer`'s throughput record (`summary`) from this rank's counts, or from the counts summed over the
    ranks when given; a rank's own counts are scaled by the world size (every rank trains on the same number of
    rows a step, so this is exact for samples and close for tokens and FLOPs)."""
    from alignlab.platform.runtime.devices import device_name

    st, world = trainer.state, trainer.world
    return summary(num_tokens=st.num_tokens * world if num_tokens is None else num_tokens,
                   num_samples=st.num_samples * world if num_samples is None else num_samples,
                   num_flops=st.num_flops * world if num_flops is None else num_flops,
                   seconds=st.train_seconds, num_devices=world, device_name=device_name(trainer.device),
                   precision=trainer.precision,
                   device_share=trainer.cfg.gpus_per_worker if trainer.device.type == "cuda" else 1.0)

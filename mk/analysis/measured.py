"""The timing model held against what it did not make: XLA's own TPU cost model of the general stack, and the
general-stack steps and per-kernel costs measured on real devices (data/measured/), each row beside the model's step
for the same configuration (the steps measured on a TPU: mk.analysis.on_tpu)."""

from __future__ import annotations

import pandas as pd

from ..chips import get_chip
from ..config import get_config
from ..timing import kernel_cost, predict


def xla_comparison(model: str, chip: str, context: int = 1024, batch: int = 1) -> pd.DataFrame:
    """Per component of one step on ONE chip of ``chip``'s kind holding the whole model: XLA's TPU cost model
    on straight-line programs (mk.measure.xla_cost, compiled ahead of time by libtpu) beside the timing
    model's general-stack work for the same component (its kernels' bytes and matrix time, no per-kernel
    cost: XLA's model charges none) and the speed of light's bytes time, with the error model / XLA - 1."""
    from ..measure.xla_cost import per_step, xla_costs
    from ..sol import bytes_per_token

    cfg, one = get_config(model), get_chip(get_chip(chip).base)
    xla = per_step(xla_costs(cfg, chip, context, batch, progress=False), cfg).set_index("component")
    work = predict(cfg, one, context, batch, "general", kernel_s=0.0).components
    bc = bytes_per_token(cfg, context, batch).by_component
    kv = {"sliding_attention": "kv_sliding", "full_attention": "kv_full"}
    rows = []
    for component, xla_s in xla["optimal_s"].items():
        nbytes = bc.get(component, 0.0) + bc.get(kv.get(component, ""), 0.0)
        modelled = work.get(component, 0.0)
        rows.append(
            dict(
                model=model,
                chip=one.name,
                component=component,
                xla_ms=xla_s * 1e3,
                modelled_ms=modelled * 1e3,
                sol_ms=nbytes / one.hbm_bandwidth * 1e3,
                error=modelled / xla_s - 1,
            )
        )
    return pd.DataFrame(rows).assign(kind="modelled (mk.timing) vs modelled (XLA TPU cost model)")


def measured_comparison(paths=None) -> pd.DataFrame:
    """Every measured general-stack row in data/measured/ (bench.csv; gpu.csv when a GPU run wrote one)
    beside the model's form for it: its bytes at the bandwidth the run measured (the speed of light it
    reports) plus its kernels at the general stack's fitted per-kernel cost for GPUs, the error against the
    measured step, and the per-kernel cost the measurement implies ((step - bytes time) / kernels)."""
    from ..paths import MEASURED_DIR

    paths = paths or sorted(MEASURED_DIR.glob("*.csv"))
    c_gpu = kernel_cost("gpu")
    rows = []
    for path in paths:
        t = pd.read_csv(path)
        need = {"step_ms", "sol_tokens_per_s", "kernels_per_step", "engine"}
        if not need <= set(t.columns):
            continue
        for _, r in t[t.engine.isin(("reference", "transformers"))].iterrows():
            floor = 1e3 / r.sol_tokens_per_s
            modelled = floor + r.kernels_per_step * c_gpu * 1e3
            rows.append(
                dict(
                    file=path.name,
                    date=r.date,
                    device=r.device,
                    engine=r.engine,
                    model=r.model,
                    dtype=r["dtype"],
                    context=r.context,
                    batch=r.batch,
                    measured_ms=r.step_ms,
                    kernels=r.kernels_per_step,
                    bytes_floor_ms=floor,
                    modelled_ms=modelled,
                    error=modelled / r.step_ms - 1,
                    implied_kernel_us=(r.step_ms - floor) / r.kernels_per_step * 1e3,
                    fitted_gpu_kernel_us=c_gpu * 1e6,
                )
            )
    return pd.DataFrame(rows).assign(kind="measured vs modelled (mk.timing's general-stack form)")


def measured_kernel_costs(measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """The per-kernel cost the measured rows imply, by the hardware they ran on, never pooled across it: each GPU
    row on its own (its device and engine: the cost it implies beside the one fitted for GPUs, and the error of the
    model's form for it), the CPU rows together (a CPU's runtime is not a GPU's: their median, lowest and highest,
    and the median error of the model's form, which prices their kernels at the GPU cost too). ``measured``:
    :func:`measured_comparison`'s rows, when already read."""
    m = measured_comparison() if measured is None else measured
    columns = ["hardware", "device", "engine", "runs", "implied_kernel_us", "implied_low_us", "implied_high_us",
               "fitted_gpu_kernel_us", "implied_over_fitted", "error"]  # fmt: skip
    if m.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    hardware = m.device.str.split(":").str[0].str.strip()
    for r in m[hardware == "gpu"].itertuples():
        rows.append(
            dict(hardware="gpu", device=r.device, engine=r.engine, runs=1, implied_kernel_us=r.implied_kernel_us,
                 implied_low_us=r.implied_kernel_us, implied_high_us=r.implied_kernel_us,
                 fitted_gpu_kernel_us=r.fitted_gpu_kernel_us, error=r.error)
        )  # fmt: skip
    for kind, g in m[hardware != "gpu"].groupby(hardware[hardware != "gpu"]):
        rows.append(
            dict(hardware=kind, device="; ".join(sorted(set(g.device))), engine="; ".join(sorted(set(g.engine))),
                 runs=len(g), implied_kernel_us=g.implied_kernel_us.median(), implied_low_us=g.implied_kernel_us.min(),
                 implied_high_us=g.implied_kernel_us.max(), fitted_gpu_kernel_us=g.fitted_gpu_kernel_us.iloc[0],
                 error=g.error.median())
        )  # fmt: skip
    out = pd.DataFrame(rows)
    out["implied_over_fitted"] = out.implied_kernel_us / out.fitted_gpu_kernel_us
    return out[columns].assign(kind="measured (data/measured/) vs fitted (mk.timing, GPUs)")

"""The timing model held against what it did not make: XLA's own TPU cost model of the general stack, and the
general-stack steps and per-kernel costs measured on real devices (data/measured/), each row beside the model's step
for the same configuration (the steps measured on a TPU: mk.analysis.on_tpu)."""

from __future__ import annotations

import pandas as pd

from ..paths import MEASURED_DIR
from ..timing import kernel_cost


def measured_comparison(paths=None) -> pd.DataFrame:
    """Every measured general-stack row in data/measured/ (bench.csv; gpu.csv when a GPU run wrote one)
    beside the model's form for it: its bytes at the bandwidth the run measured (the speed of light it
    reports) plus its kernels at the general stack's fitted per-kernel cost for GPUs, the error against the
    measured step, and the per-kernel cost the measurement implies ((step - bytes time) / kernels)."""
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


def stored_runs(model: str, dtype: str, context: int, batch: int, engine: str = "reference") -> pd.DataFrame:
    """The runs of one configuration stored in data/measured/bench.csv (``python -m mk bench``): each its date,
    device, step with its 95% interval and fraction of its measured speed of light. Each is its own run of the
    machine it names, so a step measured now sits beside them, not in their place."""
    t = pd.read_csv(MEASURED_DIR / "bench.csv")
    same = (t.model == model) & (t["dtype"] == dtype) & (t.context == context) & (t.batch == batch)
    cols = ["date", "device", "step_ms", "step_low_ms", "step_high_ms", "fraction_of_sol"]
    return t[same & (t.engine == engine)][cols].reset_index(drop=True).assign(kind="measured (data/measured/bench.csv)")


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

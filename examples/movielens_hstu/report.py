"""What the MovieLens HSTU job leaves behind: the metric and cache tables it prints and the training-curve PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt


def metrics_table(metrics: Dict[str, float], k: int = 10) -> str:
    """Format model vs popularity as a small text table.

    Example::

        print(metrics_table({"hstu_hr": 0.2, "hstu_ndcg": 0.1, "popularity_hr": 0.1, "popularity_ndcg": 0.05}))
    """
    rows = [f"{'model':<12}{f'HR@{k}':>9}{f'NDCG@{k}':>10}"]
    for name, label in (("popularity", "popularity"), ("hstu", "HSTU")):
        rows.append(f"{label:<12}{metrics[f'{name}_hr']:>9.4f}{metrics[f'{name}_ndcg']:>10.4f}")
    return "\n".join(rows)


def cache_table(cache: Dict[str, float], hit_rates: List[Optional[float]]) -> str:
    """Format the item table's cache counters (summed over ranks) and the hit rate of the first and last epoch.

    Example::

        print(cache_table({"lookups": 10, "hits": 9, "evicted": 1, "swapped_out": 1, "swapped_in": 0,
                           "initialised": 2, "cache_rows": 4, "host_rows": 1, "disk_rows": 0}, [0.8, 0.9]))
    """
    known = [rate for rate in hit_rates if rate is not None]
    if not known:
        return "item table: no cache (the whole table is resident)"
    return "\n".join([
        f"item cache: hit rate {known[0]:.2%} in the first epoch, {known[-1]:.2%} in the last; "
        f"{cache['hits'] / cache['lookups']:.2%} overall ({int(cache['lookups'])} lookups)",
        f"rows: {int(cache['initialised'])} initialised, {int(cache['evicted'])} evicted from the cache, "
        f"{int(cache['swapped_out'])} written to host/disk, {int(cache['swapped_in'])} read back",
        f"at the end: {int(cache['cache_rows'])} cache rows, {int(cache['host_rows'])} rows in host memory, "
        f"{int(cache['disk_rows'])} on disk",
    ])


def plot_training(path: Path, losses: List[float], hit_rates: List[Optional[float]], steps_per_epoch: int) -> None:
    """Write the loss per step (with per-epoch means) and the item cache hit rate per epoch to a PNG.

    Args:
        path: output file.
        losses: training loss per step, averaged over ranks.
        hit_rates: item cache hit rate per epoch (hits / lookups over all ranks); ``None`` where the kernel has no
            cache (drawn as a note).
        steps_per_epoch: to draw the per-epoch means.

    Example::

        plot_training(Path("training.png"), [2.0, 1.5], [0.9], steps_per_epoch=2)
    """
    fig, (loss_ax, cache_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot(range(1, len(losses) + 1), losses, lw=0.6, alpha=0.5, label="per step")
    epoch_ends = range(steps_per_epoch, len(losses) + 1, steps_per_epoch)
    means = [sum(losses[end - steps_per_epoch : end]) / steps_per_epoch for end in epoch_ends]
    loss_ax.plot(list(epoch_ends), means, marker="o", ms=3, label="epoch mean")
    loss_ax.set(title="training loss (sampled softmax)", xlabel="step", ylabel="cross-entropy")
    loss_ax.legend()
    known = [(epoch, rate) for epoch, rate in enumerate(hit_rates, start=1) if rate is not None]
    if known:
        cache_ax.plot(*zip(*known), marker="o", ms=3)
        low = min(rate for _, rate in known)
        cache_ax.set_ylim(max(0.0, low - 0.05), 1.0)
    else:
        cache_ax.text(0.5, 0.5, "no cache: the fused kernel keeps\nthe whole item table resident",
                      ha="center", va="center", transform=cache_ax.transAxes)
    cache_ax.set(title="item table cache hit rate (all ranks)", xlabel="epoch", ylabel="hits / lookups")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""What the MovieLens HSTU job leaves behind: the metrics table it prints and the training-curve PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def metrics_table(metrics: Dict[str, float], k: int = 10) -> str:
    """Format model vs popularity as a small text table.

    Example::

        print(metrics_table({"hstu_hr": 0.2, "hstu_ndcg": 0.1, "popularity_hr": 0.1, "popularity_ndcg": 0.05}))
    """
    rows = [f"{'model':<12}{f'HR@{k}':>9}{f'NDCG@{k}':>10}"]
    for name, label in (("popularity", "popularity"), ("hstu", "HSTU")):
        rows.append(f"{label:<12}{metrics[f'{name}_hr']:>9.4f}{metrics[f'{name}_ndcg']:>10.4f}")
    return "\n".join(rows)


def plot_training(path: Path, losses: List[float], hit_rates: List[Optional[float]], steps_per_epoch: int) -> None:
    """Write the loss per step (with per-epoch means) and the item cache hit rate per step to a PNG.

    Args:
        path: output file.
        losses: training loss per step, averaged over ranks.
        hit_rates: item cache hit rate per step; ``None`` where the kernel has no cache (drawn as a note).
        steps_per_epoch: to draw the per-epoch mean.

    Example::

        plot_training(Path("training.png"), [2.0, 1.5], [None, None], steps_per_epoch=1)
    """
    fig, (loss_ax, cache_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot(range(1, len(losses) + 1), losses, lw=0.6, alpha=0.5, label="per step")
    epoch_ends = range(steps_per_epoch, len(losses) + 1, steps_per_epoch)
    means = [sum(losses[end - steps_per_epoch : end]) / steps_per_epoch for end in epoch_ends]
    loss_ax.plot(list(epoch_ends), means, marker="o", ms=3, label="epoch mean")
    loss_ax.set(title="training loss (sampled softmax)", xlabel="step", ylabel="cross-entropy")
    loss_ax.legend()
    known = [(step, rate) for step, rate in enumerate(hit_rates, start=1) if rate is not None]
    if known:
        cache_ax.plot(*zip(*known), lw=0.8)
        cache_ax.set_ylim(0, 1)
    else:
        cache_ax.text(0.5, 0.5, "no cache: the fused kernel keeps\nthe whole item table resident",
                      ha="center", va="center", transform=cache_ax.transAxes)
    cache_ax.set(title="item table cache hit rate", xlabel="step", ylabel="hit rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

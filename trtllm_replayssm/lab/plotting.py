"""matplotlib (headless Agg backend) for the PNG plots of the benchmark and compare reports."""
from __future__ import annotations

from pathlib import Path

PLOT_EXTRA = "pip install 'trtllm-replayssm[plot]'"


class PlotUnavailable(ImportError):
    """matplotlib is not installed; the message says which extra provides it."""


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed); PlotUnavailable without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"plot skipped: matplotlib is not installed ({PLOT_EXTRA})") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write ``fig`` as a PNG at ``path`` (parents created) and close it."""
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    pyplot().close(fig)
    return out

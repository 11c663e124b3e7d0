"""What the experiment scripts share: the end of every figure."""

from __future__ import annotations


def save_figure(fig, axes, title: str, path: str) -> None:
    """Legend on the first panel, ``title`` above, written to ``path`` (PNG) and closed."""
    import matplotlib.pyplot as plt
    import numpy as np

    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

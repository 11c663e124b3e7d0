"""What the experiment scripts share: the repository root, the default CPU config, the
end of every figure."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "parl_widesearch_cpu.py")


def save_figure(fig, axes, title: str, path: str) -> None:
    """Legend on the first panel, ``title`` above, written to ``path`` (PNG) and closed."""
    import matplotlib.pyplot as plt
    import numpy as np

    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

"""Figures drawn on matplotlib's Agg canvas without pyplot.

Nothing global changes: not the backend of the process (a notebook keeps its own), not pyplot's list
of open figures, which keeps a figure alive until it is closed, so that one an error left open would
stay in memory for the life of the process. A figure here is freed with its last reference, and
needs no display.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def agg_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, layout: str | None = None,
               **subplots: Any) -> tuple[Figure, Any]:
    """A figure of width x height inches on the Agg canvas and its axes, ``Figure.subplots(nrows, ncols,
    **subplots)`` (one `Axes`, or an array of them); `layout` as `Figure` takes it ("constrained")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **subplots)

"""Integer arithmetic the layouts, the writers and the runtime mirrors share."""

from __future__ import annotations


def round_up(value: int, align: int) -> int:
    """The smallest multiple of `align` (> 0) that is >= `value`, e.g. a dimension padded to a tile.

    Example:
        >>> round_up(2880, 128)
        2944
    """
    return -(-value // align) * align

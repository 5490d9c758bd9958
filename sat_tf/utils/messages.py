"""How error and log messages name many things: the first few, then how many more."""

SHOWN = 5


def preview(items, shown: int = SHOWN) -> str:
    """ "a, b, c, d, e, ... (7 more)" for the items of any iterable."""
    items = [str(x) for x in items]
    text = ", ".join(items[:shown])
    return text + (f", ... ({len(items) - shown} more)" if len(items) > shown else "")

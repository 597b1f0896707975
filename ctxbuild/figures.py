"""How a measured figure past its gate is printed: with the digits that show it on the failing side (a cosine of
0.99999942 against a floor of 0.999999 is not "1.0000", an agreement of 0.9453 against 0.95 is not "0.95")."""
from __future__ import annotations


def under(value: float, floor: float, digits: int = 4) -> str:
    """A figure that failed its floor, with the digits that show it below (0.99999942 under 0.999999, not 1.0000;
    an agreement of 0.9453 under 0.95, not 0.95)."""
    while value < floor and round(value, digits) >= floor and digits < 9:
        digits += 1
    return f"{value:.{digits}f}"


def over(value: float, ceiling: float, digits: int = 4) -> str:
    """A figure that passed its ceiling, with the digits that show it above (1.0304 over 1.03, not 1.030)."""
    while value > ceiling and round(value, digits) <= ceiling and digits < 9:
        digits += 1
    return f"{value:.{digits}f}"

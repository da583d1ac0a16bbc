"""Design spaces as data: a `.tds` file names a base design and choices; every combination of
choices is a point, a design built by applying the chosen items to the base as `extends`/`replace`
do. syntax.py parses, points.py enumerates and builds, canonical.py identifies points that compute
the same function, report.py costs them and marks the Pareto front.

The tools layer, with the CLI and training: it may import every layer below (the facade first,
`tdiag.load` and Design), and nothing in the compiler imports it."""

from .points import Point, SpacePoints, load_space
from .syntax import Choice, Option, Space, parse_space_file, parse_space_text

__all__ = ["Choice", "Option", "Point", "Space", "SpacePoints", "load_space", "parse_space_file", "parse_space_text"]

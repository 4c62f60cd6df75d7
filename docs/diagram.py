"""Draws docs/img/pipeline.svg, the front page's picture: comparisons go into the store, the report
says whether they can be trusted, a reward model is trained on them, `/score` serves it, and a
trainer asks it for rewards. Plain SVG written by hand (no plotting library), so the file is the same
on every machine; tests/docs/test_site.py checks that the committed file is what this script draws.

    python docs/diagram.py            # rewrites docs/img/pipeline.svg
    python docs/diagram.py --stdout   # prints it instead
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path

OUT = Path(__file__).with_name("img") / "pipeline.svg"
# (title, two lines under it): the path a comparison takes
STAGES = [
    ("store", "DuckDB: every rater's", "verdict, snapshots"),
    ("report", "length bias, agreement,", "cycles, loss floors"),
    ("reward model", "bradley train rm", "(or DPO … ORPO)"),
    ("/score", "bradley serve:", "rewards over HTTP"),
    ("trainer", "TRL GRPO, OpenRLHF,", "verl"),
]
BOX_W, BOX_H, GAP, TOP, LEFT = 158, 84, 30, 46, 14
WIDTH = LEFT * 2 + len(STAGES) * BOX_W + (len(STAGES) - 1) * GAP
HEIGHT = TOP + BOX_H + 16
FONT = 'font-family="Helvetica, Arial, sans-serif"'


def box(i: int, title: str, line1: str, line2: str) -> str:
    x = LEFT + i * (BOX_W + GAP)
    middle = x + BOX_W / 2
    return (f'<rect x="{x}" y="{TOP}" width="{BOX_W}" height="{BOX_H}" rx="10" fill="#eef1fb" '
            f'stroke="#3f51b5" stroke-width="2"/>\n'
            f'<text x="{middle}" y="{TOP + 28}" text-anchor="middle" font-size="17" '
            f'font-weight="bold" fill="#1a237e">{escape(title)}</text>\n'
            f'<text x="{middle}" y="{TOP + 52}" text-anchor="middle" font-size="12" '
            f'fill="#333">{escape(line1)}</text>\n'
            f'<text x="{middle}" y="{TOP + 68}" text-anchor="middle" font-size="12" '
            f'fill="#333">{escape(line2)}</text>\n')


def arrow(i: int) -> str:
    start = LEFT + (i + 1) * BOX_W + i * GAP + 3
    end, y = start + GAP - 8, TOP + BOX_H / 2
    return (f'<line x1="{start}" y1="{y}" x2="{end}" y2="{y}" stroke="#3f51b5" stroke-width="2.5" '
            f'marker-end="url(#head)"/>\n')


def svg() -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" {FONT}>\n',
             '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="6" refY="4" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#3f51b5"/></marker></defs>\n',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>\n',
             f'<text x="{LEFT}" y="24" font-size="14" fill="#333">comparisons in: files, HTTP '
             'uploads, Label Studio, an LLM judge (RLAIF)</text>\n']
    parts += [box(i, *stage) for i, stage in enumerate(STAGES)]
    parts += [arrow(i) for i in range(len(STAGES) - 1)]
    return "".join(parts) + "</svg>\n"


if __name__ == "__main__":
    if "--stdout" in sys.argv[1:]:
        sys.stdout.write(svg())
    else:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(svg())
        print(OUT, file=sys.stderr)

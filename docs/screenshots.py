"""Screenshots for the manual, taken by headless Chromium rather than by hand.

    python docs/screenshots.py report [--out docs/img]
        simulates the demo's data (300 prompts, 8 raters, planted length bias and cycles), ingests
        it into a scratch store, renders the HTML report and shoots each of its sections
        (verdict, length-bias, agreement, cycles, floors) to OUT/report-<section>.png
    python docs/screenshots.py site SITE_DIR PAGE.html… [--out DIR]
        shoots pages of a built site (`mkdocs build`) to DIR/<page>.png

Chromium comes from the system (`apt-get install chromium`). A section is shot alone: its HTML with
the report's own style in a page of its own, then the blank margin below it is cropped.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("verdict", "length-bias", "agreement", "cycles", "floors")
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# the demo's data: every statistic has something to show
SIMULATE = ["--prompts", "300", "--raters", "8", "--length-bias", "1.5", "--cycle-rate", "0.1",
            "--seed", "0"]


def browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    raise FileNotFoundError(f"no headless browser found ({', '.join(BROWSERS)}): "
                            "apt-get install chromium")


def shoot(url: str, png: Path, width: int = 1150, height: int = 2400) -> Path:
    """One page at `width` x `height` CSS pixels; the blank rows under the content are cropped."""
    subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", f"--window-size={width},{height}",
                    f"--screenshot={png}", url],
                   check=True, capture_output=True, timeout=120)
    crop_blank_bottom(png)
    return png


def crop_blank_bottom(png: Path, margin: int = 16) -> None:
    """Cut the rows below the content, and keep 256 colours (a third of the bytes, no visible loss
    on text, tables and flat plots)."""
    from PIL import Image, ImageChops

    with Image.open(png) as image:
        rgb = image.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((rgb.width - 1, rgb.height - 1)))
    box = ImageChops.difference(rgb, background).getbbox()
    if box:
        rgb = rgb.crop((0, 0, rgb.width, min(rgb.height, box[3] + margin)))
    rgb.quantize(colors=256).save(png, optimize=True)


def report_html(work: Path) -> str:
    """The HTML report of the demo's simulated data, built with the CLI in `work`."""
    db = str(work / "shots.duckdb")

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "service.cli", "--db", db, *args], check=True,
                       cwd=ROOT, capture_output=True, timeout=600)

    cli("simulate", str(work / "judgments.jsonl"), *SIMULATE)
    cli("ingest", str(work / "judgments.jsonl"))
    cli("report", "--html", str(work / "report.html"))
    return (work / "report.html").read_text()


def section_pages(html: str) -> dict[str, str]:
    """Section id -> a page holding the report's head (its style) and that section alone."""
    head = html[:html.index("<body>")]
    pages = {}
    for name in SECTIONS:
        found = re.search(rf'<section id="{name}".*?</section>', html, re.S)
        if found is None:
            raise ValueError(f"the report has no section {name!r}: update SECTIONS")
        pages[name] = f"{head}<body>{found.group(0)}</body></html>"
    return pages


def shoot_report(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shots = []
        for name, page in section_pages(report_html(work)).items():
            path = work / f"{name}.html"
            path.write_text(page)
            shots.append(shoot(path.as_uri(), out / f"report-{name}.png"))
    return shots


def shoot_site(site: Path, pages: list[str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [shoot((site / page).resolve().as_uri(), out / (Path(page).stem + ".png"), 1280, 2000)
            for page in pages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("report").add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    site = sub.add_parser("site")
    site.add_argument("site", type=Path)
    site.add_argument("pages", nargs="+")
    site.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    shots = shoot_report(args.out) if args.what == "report" else shoot_site(args.site, args.pages,
                                                                            args.out)
    for path in shots:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

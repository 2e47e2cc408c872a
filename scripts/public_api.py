#!/usr/bin/env python3
"""The public API of each published crate, as text, from the HTML that `cargo doc` writes (stable toolchain).

For every crate, one line per public item (`struct tollgate_tower::RateLimitLayer`, from the crate's `all.html`),
and under each type or trait the signatures of its public methods, associated items and the traits it
implements (from the item's own page; auto traits and blanket implementations left out). Written to
`docs/api/<crate>.txt`, so a change to the surface shows in review.

    scripts/public_api.py [--check] [DOC_DIR]

DOC_DIR is `target/doc` of `cargo doc --workspace --all-features --no-deps`. With `--check`, the committed
listings are compared with what the docs say and the differences printed; the exit status is 1 when they differ.
"""

import difflib
import html
import html.parser
import re
import sys
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api"


def published_crates():
    """The library name of every workspace crate that publishes (`publish = false` ones are left out)."""
    meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT,
                                     check=True, capture_output=True, text=True).stdout)
    return sorted(t["name"] for p in meta["packages"] if p.get("publish") != []
                  for t in p["targets"] if "lib" in t["kind"])


# Sections of an item page whose headers are part of the API (in page order).
KEPT_SECTIONS = {"implementations", "trait-implementations", "required-methods", "provided-methods",
                 "required-associated-types", "provided-associated-types", "required-associated-consts",
                 "provided-associated-consts", "implementors", "fields", "variants"}


# Void elements never get an end tag: they must not move the depth.
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(html.parser.HTMLParser):
    """Collects the text of `code-header` elements (signatures) and struct fields / enum variants, each with
    the page section it sits in."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.section = None
        self.depth = 0
        self.capture = None  # (depth, kind, parts)
        self.found = []

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        attrs = dict(attrs)
        self.depth += 1
        if tag == "h2" and "section-header" in (attrs.get("class") or ""):
            self.section = attrs.get("id")
        if tag == "div" and attrs.get("id") in ("synthetic-implementations-list", "blanket-implementations-list"):
            self.section = "skipped"
        if self.capture is None:
            cls = (attrs.get("class") or "").split()
            if tag == "pre" and "item-decl" in cls:
                self.capture = (self.depth, "decl", [])
            elif "code-header" in cls:
                self.capture = (self.depth, "header", [])
            elif tag == "span" and ("structfield" in cls or "variant" in cls) and "section-header" in cls:
                self.capture = (self.depth, "member", [])

    def handle_endtag(self, tag):
        if self.capture is not None and self.depth == self.capture[0]:
            text = " ".join("".join(self.capture[2]).split())
            self.found.append((self.section, self.capture[1], text))
            self.capture = None
        self.depth -= 1

    def handle_data(self, data):
        if self.capture is not None:
            self.capture[2].append(data)


def items(crate_dir):
    """(kind, path, page) for every item in the crate's all.html."""
    text = (crate_dir / "all.html").read_text()
    found = []
    for section, body in re.findall(r'<h3 id="([a-z-]+)">.*?</h3><ul class="all-items">(.*?)</ul>', text, re.S):
        kind = section.rstrip("s").replace("-", " ")
        kind = {"type aliase": "type", "trait aliase": "trait alias", "struct": "struct", "enum": "enum",
                "union": "union", "trait": "trait", "function": "fn", "macro": "macro", "constant": "const",
                "static": "static", "derive macro": "derive", "attribute macro": "attribute"}.get(kind, kind)
        for href, name in re.findall(r'<li><a href="([^"]+)">([^<]+)</a></li>', body):
            found.append((kind, html.unescape(name), crate_dir / href))
    return found


def listing(doc, crate):
    crate_dir = doc / crate
    lines = [f"# {crate}: the public API (scripts/public_api.py; regenerate after a change to the surface)", ""]
    for kind, name, page in sorted(items(crate_dir), key=lambda i: (i[1], i[0])):
        if kind in ("fn", "const", "static", "type") and page.exists():
            parser = Page()
            parser.feed(page.read_text())
            decl = next((text for _, what, text in parser.found if what == "decl"), "")
            if kind in ("const", "static"):
                # The type is the API; the value (a Lua script's text, say) is not.
                decl = decl.split(" = ", 1)[0]
            lines.append(f"{kind} {crate}::{name}" + (f"  // {decl}" if decl else ""))
            continue
        lines.append(f"{kind} {crate}::{name}")
        if kind in ("struct", "enum", "union", "trait") and page.exists():
            parser = Page()
            parser.feed(page.read_text())
            for section, what, text in parser.found:
                text = text.replace("§", "").strip()
                if what == "decl" or section not in KEPT_SECTIONS or not text:
                    continue
                if section == "trait-implementations" and not text.startswith(("impl", "unsafe impl")):
                    # A trait's methods are the trait's: the impl line says all that changes.
                    continue
                if what == "member":
                    lines.append(f"    {section[:-1]} {text}")
                else:
                    lines.append(f"    {text}")
    return "\n".join(lines) + "\n"


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if not a.startswith("--")]
    doc = Path(args[0]) if args else ROOT / "target" / "doc"
    OUT.mkdir(parents=True, exist_ok=True)
    differs = False
    for crate in published_crates():
        if not (doc / crate / "all.html").exists():
            sys.exit(f"public_api: {doc / crate / 'all.html'} is missing: run `cargo doc --workspace "
                     "--all-features --no-deps` first")
        text = listing(doc, crate)
        path = OUT / f"{crate.replace('_', '-')}.txt"
        if check:
            committed = path.read_text() if path.exists() else ""
            if committed != text:
                differs = True
                diff = difflib.unified_diff(committed.splitlines(), text.splitlines(), str(path), "the docs",
                                            lineterm="")
                print("\n".join(list(diff)[:60]))
        else:
            path.write_text(text)
    if differs:
        print("public_api: docs/api/ differs from the public API the docs show: run scripts/public-api.sh and "
              "commit the listing if the change is meant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

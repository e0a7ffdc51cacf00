#!/usr/bin/env bash
# Checks every relative link and every #anchor in the repository's Markdown files (all
# *.md outside target/ and .git/), without the network: a link must name an existing file
# or folder, and an anchor a heading of the file it points to (GitHub's slugs: lower case,
# punctuation removed, each space a '-', a repeated heading suffixed -1, -2, ...). Links
# inside code (fenced blocks, `spans`) and links with a scheme (https:, mailto:) are not
# checked. Prints each broken link as FILE:LINE: LINK (why) and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys
from urllib.parse import unquote

SKIP_DIRS = {".git", "target", "node_modules"}
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODESPAN = re.compile(r"(`+)(?:.+?)\1")


def markdown_files():
    for root, dirs, files in os.walk("."):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("target"))
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.normpath(os.path.join(root, f))


def text_lines(path):
    """(line number, text) of the lines outside fenced code, code spans blanked."""
    fence = None
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            m = FENCE.match(line)
            if fence:
                if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                    fence = None
                continue
            if m:
                fence = m.group(1)
                continue
            yield no, line.rstrip("\n")


def slug(text):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in text_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        # explicit HTML anchors
        with open(path, encoding="utf-8") as fh:
            found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", fh.read()))
        _anchors[path] = found
    return _anchors[path]


def links(path):
    for no, line in text_lines(path):
        plain = CODESPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE.finditer(plain):
            yield no, m.group(1)
        m = REFDEF.match(plain)
        if m:
            yield no, m.group(1)


broken = []
checked = 0
for md in markdown_files():
    for no, target in links(md):
        if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # a scheme (https:, mailto:): not checked offline
        checked += 1
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        if file_part.startswith("/"):
            dest = os.path.normpath(file_part.lstrip("/"))
        elif file_part:
            dest = os.path.normpath(os.path.join(os.path.dirname(md), file_part))
        else:
            dest = md
        if not os.path.exists(dest):
            broken.append(f"{md}:{no}: {target} (no such file: {dest})")
            continue
        if anchor and dest.endswith(".md") and os.path.isfile(dest):
            if unquote(anchor).lower() not in anchors(dest):
                broken.append(f"{md}:{no}: {target} (no heading #{anchor} in {dest})")

for b in broken:
    print(b)
print(f"check-links: {checked} relative links checked, {len(broken)} broken")
sys.exit(1 if broken else 0)
PY

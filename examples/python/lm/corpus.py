"""The corpus: the Python documentation as Debian ships it (package python3-doc, HTML under
/usr/share/doc/python3*/html), real English prose nobody in this project wrote, read offline.

Each HTML page is one document. Its text (tags, scripts and style sheets stripped, whitespace
runs collapsed) goes to the validation split when a hash of its path relative to the html/
directory says so (about VALIDATION_PERCENT of the pages), else to training: the split is by
document, never by line, and the same on every machine with the same package. Tokens are the
UTF-8 bytes (vocabulary 256). Pages are joined with a blank line in sorted path order.

The parsed text is cached (CO2_LM_CACHE, default ~/.cache/co2-lm) under a key of the file
list, sizes and mtimes: parsing 500 pages costs seconds, and every rank of every run needs it.
"""
import hashlib
import html.parser
import os
import re
import tempfile

import numpy as np

PACKAGE = "python3-doc"
VALIDATION_PERCENT = 10
_SKIP_TAGS = {"script", "style", "head"}
_WHITESPACE = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")


class CorpusMissing(RuntimeError):
    pass


def html_root():
    """The html/ directory of the installed Python documentation (the newest python3.X)."""
    base = "/usr/share/doc"
    candidates = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        path = os.path.join(base, name, "html")
        if re.fullmatch(r"python3(\.\d+)?(-doc)?", name) and \
                os.path.isfile(os.path.join(path, "library", "index.html")):
            candidates.append(os.path.realpath(path))
    if not candidates:
        raise CorpusMissing(f"the Python documentation is not installed: apt-get install "
                            f"{PACKAGE} (looked for /usr/share/doc/python3*/html/library/"
                            f"index.html)")
    return sorted(set(candidates))[-1]


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in ("p", "div", "br", "li", "pre", "h1", "h2", "h3", "h4", "tr", "dt", "dd"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _SKIP_TAGS and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(path):
    parser = _Text()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    parser.close()
    text = _WHITESPACE.sub(" ", "".join(parser.parts))
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip()


def is_validation(relative_path):
    """The document's split: a hash of its path, stable across runs and machines."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < VALIDATION_PERCENT


def _pages(root):
    pages = []
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith(".html") and name not in ("genindex.html", "search.html") and \
                    not name.startswith("genindex-"):
                pages.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(pages)


def _cache_dir():
    return os.environ.get("CO2_LM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "co2-lm")


def load(root=None):
    """(train, validation) as uint8 numpy arrays of bytes."""
    root = root or html_root()
    pages = _pages(root)
    key = hashlib.sha256(root.encode())
    for rel in pages:
        st = os.stat(os.path.join(root, rel))
        key.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    key.update(f"v1 {VALIDATION_PERCENT}".encode())
    cache = os.path.join(_cache_dir(), f"pydoc-{key.hexdigest()[:16]}.npz")
    try:
        with np.load(cache) as data:
            return data["train"], data["validation"]
    except (OSError, KeyError, ValueError):
        pass
    splits: dict[bool, list[str]] = {False: [], True: []}
    for rel in pages:
        text = page_text(os.path.join(root, rel))
        if text:
            splits[is_validation(rel)].append(text)
    train, validation = (np.frombuffer("\n\n".join(splits[v]).encode("utf-8"), dtype=np.uint8)
                         for v in (False, True))
    # Written to a temporary name and renamed: ranks that parse at the same time never read a
    # half-written cache.
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cache), suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, train=train, validation=validation)
        os.replace(tmp, cache)
    except OSError:
        pass   # a read-only home: parse again next time
    return train, validation


if __name__ == "__main__":
    import time
    t = time.perf_counter()
    train, validation = load()
    print(f"{html_root()}: train {len(train):,} bytes, validation {len(validation):,} bytes "
          f"({time.perf_counter() - t:.1f} s)")
    print(bytes(train[100000:100600]).decode("utf-8", "replace"))

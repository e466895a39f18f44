#!/usr/bin/env python3
"""List functions in src/ longer than a limit (default 80 lines), outermost `#[cfg(test)]` items excluded.

Why: issue 15 asks that functions outside the generators stay under about 80 lines; this is the
measuring stick, not a CI gate. It tokenizes Rust just enough to match braces correctly: comments
(nested block comments too), string, byte-string and raw-string literals, and char literals versus
lifetimes, so brace characters inside literals do not confuse the count. A function's length is
the lines from its `fn` keyword to its closing brace, inclusive.

Usage: python3 tools/long_fns.py [--limit N] [--all] [ROOT]
  --all   also list the excluded generator files (see GENERATORS)
Exit status is 0 whatever it finds.
"""
import os
import sys

# Generator code: text templates ported from AIPerf, kept as one function per template on purpose.
GENERATORS = ("src/synth/corpus/kvbust_coding/",)


def tokens(src):
    """Yield (kind, text, line) with kind in {"ident", "punct"}; literals and comments are dropped."""
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += src[i] == "\n"
                    i += 1
        elif c == '"' or (c == "b" and src.startswith('b"', i)):
            i = i + 1 if c == '"' else i + 2
            while i < n and src[i] != '"':
                if src[i] == "\\":
                    line += src[i + 1] == "\n"
                    i += 2
                    continue
                line += src[i] == "\n"
                i += 1
            i += 1
        elif (c == "r" or src.startswith("br", i)) and _raw_start(src, i):
            j = i + (2 if c == "b" else 1)
            hashes = 0
            while src[j] == "#":
                hashes, j = hashes + 1, j + 1
            end = src.index('"' + "#" * hashes, j + 1)
            line += src.count("\n", i, end)
            i = end + 1 + hashes
        elif c == "'" or (c == "b" and src.startswith("b'", i)):
            k = i + 1 if c == "'" else i + 2
            if src[k] == "\\":
                i = src.index("'", k + 2) + 1  # escaped char literal: '\n', '\'', '\u{..}'
            elif k + 1 < n and src[k + 1] == "'":
                i = k + 2  # plain char literal, including '{' and '}'
            else:
                i = k  # lifetime or label: skip the quote, the name lexes as an ident
        elif c.isalnum() or c == "_":
            j = i
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            yield "ident", src[i:j], line
            i = j
        else:
            yield "punct", c, line
            i += 1


def _raw_start(src, i):
    if i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_"):
        return False
    j = i + (2 if src[i] == "b" else 1)
    while j < len(src) and src[j] == "#":
        j += 1
    return j < len(src) and src[j] == '"'


def functions(src):
    """Return ([(name, first_line, last_line)], test_mods): every fn with a body outside
    #[cfg(test)] items, and the names of `#[cfg(test)] mod NAME;` declarations (their files are tests)."""
    toks = list(tokens(src))
    out, test_mods = [], []
    skip_next_item = False
    i = 0
    while i < len(toks):
        kind, text, line = toks[i]
        # `#[cfg(test)]`: skip the braced item that follows (a module or a function).
        if text == "#" and _is_cfg_test(toks, i):
            skip_next_item = True
            i = _after_attr(toks, i)
            continue
        if skip_next_item and text == "{":
            i = _match(toks, i) + 1
            skip_next_item = False
            continue
        if skip_next_item and text == ";":
            skip_next_item = False
        if skip_next_item and text == "mod" and i + 2 < len(toks) and toks[i + 2][1] == ";":
            test_mods.append(toks[i + 1][1])  # `#[cfg(test)] mod tests;`: the file is test code
        if kind == "ident" and text == "fn" and i + 1 < len(toks) and toks[i + 1][0] == "ident":
            name = toks[i + 1][1]
            j, parens = i + 2, 0
            while j < len(toks):
                t = toks[j][1]
                if t in "([":
                    parens += 1
                elif t in ")]":
                    parens -= 1
                elif parens == 0 and t in "{;":
                    break
                j += 1
            if j < len(toks) and toks[j][1] == "{":
                end = _match(toks, j)
                out.append((name, line, toks[end][2]))
        i += 1
    return out, test_mods


def _is_cfg_test(toks, i):
    texts = [t[1] for t in toks[i : i + 7]]
    return texts == ["#", "[", "cfg", "(", "test", ")", "]"]


def _after_attr(toks, i):
    return i + 7


def _match(toks, i):
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j][1]
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced braces from line %d" % toks[i][2])


def main(argv):
    limit, show_all, root = 80, False, "."
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--limit":
            limit = int(args.pop(0))
        elif a == "--all":
            show_all = True
        else:
            root = a
    per_file, test_files = {}, set()
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as fh:
                fns, test_mods = functions(fh.read())
            per_file[rel] = fns
            # A module's children live beside it (`a.rs` -> `a/`) or, for mod.rs/lib.rs/main.rs, in its folder.
            stem = os.path.splitext(rel)[0]
            base = os.path.dirname(rel) if f in ("mod.rs", "lib.rs", "main.rs") else stem
            for m in test_mods:
                test_files.add(os.path.join(base, m + ".rs"))
                test_files.add(os.path.join(base, m, "mod.rs"))
    rows = []
    for rel, fns in per_file.items():
        generator = rel.startswith(GENERATORS)
        if rel in test_files or (generator and not show_all):
            continue
        for name, first, last in fns:
            length = last - first + 1
            if length > limit:
                rows.append((length, rel, first, name, generator))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for length, rel, first, name, generator in rows:
        tag = "  (generator)" if generator else ""
        print("%4d  %s:%d  %s%s" % (length, rel, first, name, tag))
    print("%d function(s) over %d lines" % (len(rows), limit))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Check that src/'s modules import only downwards: the layer test CI runs before cargo.

Why: issue 22. Synthesis grew a 17-module import circle; layers keep the next one from forming.
It reads every `use` item (braces, `self`, `super`, child modules) and every other `crate::a::b`
path in src/, resolves each to the module file that owns it, and then checks two rules:

1. No module of a lower layer imports one of a higher layer (LAYERS below, lowest first): in
   synthesis, and among the crate's top-level modules (the proxy side, tree "crate").
2. No import circle among the modules of the crate, anywhere (CHECKED: the whole crate since
   issue 22 items 2 and 3 cut the health <-> proxy <-> runtime, access_log <-> observe,
   config <-> mock, conn <-> error and mock openai <-> anthropic <-> responses circles).

3. No circle among whole folders (a folder counted as one module with every file in it, issue
   32): a folder is one layer, so LAYERS names only top-level modules in the crate's tree, and
   a module that would tie two folders together moves to the layer it belongs to (the body
   budget to `budget`, the synthesis command line to `cli::synth`).
Test-only code (`#[cfg(test)]` items and the files they declare) is left out: a test may reach
upwards for fixtures without the library doing so. A folder's `mod.rs` may use its own parts (to
the rest of the tree the folder is one unit), and a path through a `pub use` re-export counts as
an import of the module that defines the name, so a re-export cannot hide a circle.

Usage: python3 tools/layers.py [--graph] [--folders] [ROOT]   (ROOT: the repository, default: this one)\n--graph prints every module's imports; --folders the folders as nodes, with their layers.
Exit status 1 when a rule breaks in a checked tree, else 0.
"""
import os
import re
import sys

# Lowest layer first, per tree. A module belongs to the layer of the longest prefix that names it;
# modules of one layer may import each other (circles among them are rule 2's business).
LAYERS = {
    "synth": [
        # The bottom: the error kinds every layer returns (trace and agentic input errors too).
        ["synth::error"],
        ["synth::rng"],
        ["synth::tokenizer"],
        ["synth::corpus"],
        ["synth::prompt"],
        ["synth::dataset"],
        # The edges: the benchmark harness and the re-exports of `synth` itself.
        ["synth::bench", "synth"],
    ],
    # The crate's top-level modules (a request's path through them is in the crate docs,
    # src/lib.rs, "A request, module by module"). Synthesis is one unit here.
    "crate": [
        # Plain types and leaves every layer may use (the buffered-body budget too: the mock
        # inside `kvbust serve` charges the same budget as the proxy).
        ["units", "error", "body", "metrics", "cgroup", "healthcheck", "api", "json", "sync", "cachebust", "budget", "report"],
        # The synthesis library, the connection plumbing and the usage counts (observer, access
        # log, cache model).
        ["synth", "conn", "usage"],
        # Capture's files, ids and merge: rows in, files out (the cache model feeds it).
        ["capture"],
        # The mock model server: the configuration embeds its settings (mock::config).
        ["mock"],
        ["config"],
        # The upstream transport and the access log: configured, never deciding a request.
        ["tls", "upstream", "access_log"],
        ["health"],
        # kvbust's model of the upstream's prefix cache and the run ledger behind /report.
        ["cache_model"],
        # The run-time state the pipeline and the admin port share.
        ["runtime"],
        # The request pipeline and the admin port (and `run_store`: finishing and saving its
        # runs); `kvbust probe`, a client of the upstream
        # transport that reads synthesis's corpus.
        ["proxy", "admin", "run_store", "probe", "served_models"],
        # The edges: serving, the command lines (`cli::synth` runs the offline commands), the
        # admin port's client (`kvbust report`), and the entry points.
        ["server", "cli", "admin_client"],
        ["app", ""],
    ],
}
CHECKED = [""]

USE_RE = re.compile(r"\buse\s+([^;]*);", re.S)
PATH_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
PUB_USE_RE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", re.S)
MOD_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)


def strip(src):
    """Source with comments, string and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
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
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a): only the former closes.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_items(src):
    """`src` (already stripped) without `#[cfg(test)]` items, and the names of the
    `#[cfg(test)] mod x;` files those items declare."""
    test_mods, out, pos = [], [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", src):
        if m.start() < pos:
            continue
        out.append(src[pos:m.start()])
        j = m.end()
        decl = MOD_RE.match(src, j)
        if decl:
            test_mods.append(decl.group(1))
            pos = decl.end()
            continue
        # Skip to the end of the item: its first `;` before any `{`, or its matching `}`.
        k = j
        while k < len(src) and src[k] not in "{;":
            k += 1
        if k < len(src) and src[k] == "{":
            depth = 0
            while k < len(src):
                depth += {"{": 1, "}": -1}.get(src[k], 0)
                k += 1
                if depth == 0:
                    break
        else:
            k += 1
        out.append("\n" * src.count("\n", m.start(), k))
        pos = k
    out.append(src[pos:])
    return "".join(out), test_mods


def expand(tree):
    """`a::{b, c::{d, self}}` -> [a::b, a::c::d, a::c]; `as` renames and globs dropped."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", tree))
    depth, start = 0, None
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
    if start is None:
        return [tree.rstrip("*").rstrip(":")]
    prefix, inner = tree[:start].rstrip(":"), tree[start + 1:tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for c in inner:
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        cur += c
    parts.append(cur)
    paths = []
    for p in filter(None, parts):
        for sub in expand(p):
            if sub in ("self", ""):
                paths.append(prefix)
            else:
                paths.append(prefix + "::" + sub if prefix else sub)
    return paths


def module_of(rel):
    """src/a/b.rs or src/a/b/mod.rs -> "a::b"; src/lib.rs -> ""."""
    parts = rel[len("src/"):-len(".rs")].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def load(root):
    """{module: (file, stripped non-test source)} for every library module reachable from lib.rs."""
    mods, queue = {}, [("", os.path.join(root, "src", "lib.rs"))]
    while queue:
        name, path = queue.pop()
        with open(path, encoding="utf-8") as f:
            src, tests = drop_test_items(strip(f.read()))
        mods[name] = (os.path.relpath(path, root), src)
        here = os.path.dirname(path)
        if not (path.endswith("mod.rs") or path.endswith("lib.rs")):
            here = path[:-len(".rs")]
        for m in MOD_RE.finditer(src):
            child = m.group(1)
            if child in tests:
                continue
            for cand in (os.path.join(here, child + ".rs"), os.path.join(here, child, "mod.rs")):
                if os.path.exists(cand):
                    queue.append(((name + "::" + child).lstrip(":"), cand))
                    break
    return mods


def resolve(path, here, mods, reexports=None):
    reexports = reexports or {}
    """The module a path names, from inside module `here`; None for other crates."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("self", "super"):
        base = here.split("::") if here else []
        while segs and segs[0] in ("self", "super"):
            if segs.pop(0) == "super":
                base = base[:-1]
    elif ("::".join(filter(None, [here, segs[0]]))) in mods:
        base = here.split("::") if here else []
    else:
        return None  # another crate, std, or a name in scope
    full = base + segs
    for k in range(len(full), -1, -1):
        cand = "::".join(full[:k])
        if cand in mods:
            # `a::Name` where `a` re-exports `Name` from a module of its own: the edge goes to
            # that module, so a re-export cannot hide a circle.
            if k < len(full) and full[k] in reexports.get(cand, {}):
                return reexports[cand][full[k]]
            return cand
    return None


def reexports_of(mods):
    """{module: {name: module it re-exports the name from}} from `pub use` items."""
    out = {}
    for name, (_, src) in mods.items():
        for m in PUB_USE_RE.finditer(src):
            tree = re.sub(r"\s+", " ", m.group(1))
            for p in expand(m.group(1)):
                leaf = p.split("::")[-1]
                alias = re.search(r"\b" + re.escape(leaf) + r"\s+as\s+([A-Za-z_][A-Za-z0-9_]*)", tree)
                t = resolve(p, name, mods)
                if t is not None and t != name:
                    out.setdefault(name, {})[alias.group(1) if alias else leaf] = t
    return out


def edges(mods):
    out, reexports = {}, reexports_of(mods)
    for name, (_, src) in mods.items():
        targets = set()
        for m in USE_RE.finditer(src):
            for p in expand(m.group(1)):
                t = resolve(p, name, mods, reexports)
                if t is not None:
                    targets.add(t)
        for m in PATH_RE.finditer(src):
            t = resolve(re.sub(r"\s+", "", m.group(1)), name, mods, reexports)
            if t is not None:
                targets.add(t)
        # A module "imports" its parent only through real paths; its own children are its parts.
        out[name] = {t for t in targets if t != name and not t.startswith(name + "::" if name else "\0")}
    return out


def layer_of(mod, tree):
    """The layer of `mod` in `tree`: that of the longest prefix naming it (the crate root is
    named only by ""); None when no prefix does."""
    best = None
    for i, prefixes in enumerate(LAYERS[tree]):
        for p in prefixes:
            names = mod == p if p == "" else (mod == p or mod.startswith(p + "::"))
            if names and (best is None or len(p) > len(best[1])):
                best = (i, p)
    return None if best is None else best[0]


def folders(graph):
    """The graph with every module counted as its top-level folder (or file)."""
    out = {}
    for m, targets in graph.items():
        a = m.split("::")[0]
        out.setdefault(a, set()).update(t.split("::")[0] for t in targets if t.split("::")[0] != a)
    return out


def circles(graph, within):
    """Strongly connected components of more than one module, among modules under `within`."""
    nodes = [n for n in graph if n == within or n.startswith(within + "::") or within == ""]
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        # Iterative Tarjan: the graph is small, but recursion limits are not worth testing.
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next((w for w in it if w in nodes_set), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

    nodes_set = set(nodes)
    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return comps


def print_folders(tops):
    """The crate's folders and top-level files as nodes, each with its layer, and a summary line."""
    upward = 0
    for f in sorted(tops, key=lambda f: (layer_of(f, "crate") or 0, f)):
        mine = layer_of(f, "crate")
        ups = [t for t in sorted(tops[f]) if (layer_of(t, "crate") or 0) > (mine or 0)]
        upward += len(ups)
        print(f"{f or 'crate'} (layer {mine}) -> {', '.join(sorted(tops[f])) or '-'}")
    nodes = [f for f in tops if f]
    layers_used = {layer_of(f, "crate") for f in tops}
    print(f"layers: {len(nodes)} nodes on {len(layers_used)} layers, {upward} imports upwards, "
          f"{len(circles(tops, ''))} folder knots")


def main(argv):
    show_graph = "--graph" in argv
    show_folders = "--folders" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    mods = load(root)
    graph = edges(mods)
    if show_graph:
        for m in sorted(graph):
            print(f"{m or 'crate'} -> {', '.join(sorted(graph[m])) or '-'}")
    failed = False
    for tree in LAYERS:
        for m in sorted(graph):
            mine = layer_of(m, tree)
            if mine is None:
                continue
            for t in sorted(graph[m]):
                theirs = layer_of(t, tree)
                if theirs is not None and theirs > mine:
                    print(f"layers: {mods[m][0]}: `{m or 'crate'}` (layer {mine} of `{tree}`) imports `{t}` (layer {theirs}), a higher layer")
                    failed = True
    for tree in CHECKED:
        for comp in circles(graph, tree):
            names = ", ".join(n or "crate" for n in comp)
            print(f"layers: import circle of {len(comp)} modules in `{tree or 'crate'}`: {names}")
            failed = True
    tops = folders(graph)
    for comp in circles(tops, ""):
        names = " <-> ".join(n or "crate" for n in comp)
        print(f"layers: folder knot: {names} import each other (a folder is one layer; move the module that ties them)")
        failed = True
    if show_folders:
        print_folders(tops)
    if failed:
        print("layers: FAILED (a lower layer must not import a higher one; see tools/layers.py)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Check the dependency tree against deny.toml: licences, banned crates, wildcards, sources.

Why: issue 32. `cargo deny` does this where it is installed; CI machines reach only the crate
registry, so .ci/run runs this script always, offline, on the same deny.toml, from
`cargo metadata --locked` (the resolved tree of Cargo.lock, every target platform). It reads
only the keys deny.toml uses: [licenses] allow, [bans] deny / wildcards / multiple-versions,
[sources] allow-registry / unknown-git.

Licences are SPDX expressions (`MIT OR Apache-2.0`, `(MIT OR Apache-2.0) AND Unicode-3.0`,
`Apache-2.0 WITH LLVM-exception`; the old `MIT/Apache-2.0` spelling is read as OR): a crate
passes when the expression holds with the allowed licences true.

Usage: python3 tools/deny.py [ROOT]   (ROOT: the repository, default: this one)
Exit status 1 when a rule breaks, else 0; multiple versions only warn unless deny.toml says
"deny".
"""
import json
import os
import re
import subprocess
import sys
import tomllib

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def tokens(expr):
    """SPDX expression tokens: '(', ')', 'AND', 'OR', and licences (`X WITH Y` as one)."""
    raw = re.findall(r"\(|\)|[^\s()]+", expr.replace("/", " OR "))
    out = []
    i = 0
    while i < len(raw):
        if i + 2 < len(raw) and raw[i + 1] == "WITH":
            out.append(f"{raw[i]} WITH {raw[i + 2]}")
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out


def allowed(expr, allow):
    """Whether the SPDX expression holds with the licences in `allow` true (AND binds tighter)."""
    toks, pos = tokens(expr), [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        pos[0] += 1
        return toks[pos[0] - 1]

    def atom():
        t = take()
        if t == "(":
            v = disj()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in {expr!r}")
            return v
        if t in ("AND", "OR", ")"):
            raise ValueError(f"unexpected {t!r} in {expr!r}")
        return t in allow

    def conj():
        v = atom()
        while peek() == "AND":
            take()
            v = atom() and v
        return v

    def disj():
        v = conj()
        while peek() == "OR":
            take()
            v = conj() or v
        return v

    v = disj()
    if peek() is not None:
        raise ValueError(f"trailing {peek()!r} in {expr!r}")
    return v


def check(policy, meta):
    """Every broken rule as a message, and the warnings, for `cargo metadata`'s JSON."""
    errors, warnings = [], []
    allow = set(policy.get("licenses", {}).get("allow", []))
    bans = policy.get("bans", {})
    banned = {d["crate"]: d.get("reason", "") for d in bans.get("deny", [])}
    registries = {"registry+" + r for r in policy.get("sources", {}).get("allow-registry", [])}
    versions = {}
    for p in meta["packages"]:
        name, source = p["name"], p.get("source")
        versions.setdefault(name, set()).add(p["version"])
        lic = p.get("license")
        if not lic:
            errors.append(f"licenses: {name} {p['version']} declares no licence (license-file only)")
        else:
            try:
                if not allowed(lic, allow):
                    errors.append(f"licenses: {name} {p['version']} is {lic!r}, not in deny.toml's allow list")
            except ValueError as e:
                errors.append(f"licenses: {name} {p['version']}: {e}")
        if name in banned:
            errors.append(f"bans: {name} {p['version']} is denied ({banned[name]})")
        if source is None:
            # The workspace itself: its own dependencies must name versions, not `*`.
            for d in p["dependencies"]:
                if d.get("req") == "*" and d.get("path") is None and bans.get("wildcards") == "deny":
                    errors.append(f"bans: {name} depends on {d['name']} = \"*\" (a wildcard)")
        elif source.startswith("git+"):
            if policy.get("sources", {}).get("unknown-git", "deny") == "deny":
                errors.append(f"sources: {name} {p['version']} comes from git ({source})")
        elif source not in registries:
            errors.append(f"sources: {name} {p['version']} comes from {source}, not an allowed registry")
    dups = sorted(f"{n} ({', '.join(sorted(v))})" for n, v in versions.items() if len(v) > 1)
    if dups:
        line = f"bans: {len(dups)} crates in more than one version: {'; '.join(dups)}"
        (errors if bans.get("multiple-versions") == "deny" else warnings).append(line)
    return errors, warnings


def main(argv):
    root = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with open(os.path.join(root, "deny.toml"), "rb") as f:
        policy = tomllib.load(f)
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        cwd=root, check=True, capture_output=True, text=True).stdout)
    errors, warnings = check(policy, meta)
    for w in warnings:
        print(f"deny: warning: {w}")
    for e in errors:
        print(f"deny: {e}")
    n = len(meta["packages"])
    print(f"deny: {n} packages checked against deny.toml: {'FAILED' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

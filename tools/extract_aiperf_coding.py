#!/usr/bin/env python3
"""Extracts AIPerf 0.13.0's coding-corpus templates into kvbust's asset file.

Reads `aiperf/dataset/generator/coding_content.py` (pass its path) and writes JSON with:
- `constants`: the module-level vocabulary tuples/dicts, verbatim;
- `tool_pool_block_counts` (in AIPerf's dict order), `text_pool_blocks`, `baseline_pool_tokens`;
- `methods`: the template methods the tool pool and `_gen_user_prompt` reach, as a syntax tree
  of the small Python subset they use (f-strings, literals, draws, ifs, loops), so kvbust's
  interpreter (`src/synth/aiperf_coding/`) replays the draws in exactly AIPerf's order.

Usage: python3 tools/extract_aiperf_coding.py .../coding_content.py > assets/aiperf-coding/templates.json
Only the standard library is used; nothing is imported from aiperf.
"""
import ast
import hashlib
import json
import sys

BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
       ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def fail(node, what):
    raise SystemExit(f"line {getattr(node, 'lineno', '?')}: unsupported {what}: {ast.unparse(node)[:120]}")


def const(v, node):
    if v is None:
        return {"e": "none"}
    if isinstance(v, bool):
        return {"e": "bool", "v": v}
    if isinstance(v, int):
        return {"e": "int", "v": v}
    if isinstance(v, float):
        return {"e": "float", "v": v}
    if isinstance(v, str):
        return {"e": "str", "v": v}
    fail(node, "constant")


def fstring_parts(node):
    parts = []
    for p in node.values:
        if isinstance(p, ast.Constant):
            parts.append({"e": "str", "v": p.value})
        elif isinstance(p, ast.FormattedValue):
            if p.conversion != -1:
                fail(p, "conversion")
            parts.append({"e": "fmt", "value": expr(p.value),
                          "spec": fstring_parts(p.format_spec) if p.format_spec else None})
        else:
            fail(p, "f-string part")
    return parts


def comp(gens):
    out = []
    for g in gens:
        if g.is_async:
            fail(g.target, "async comprehension")
        out.append({"target": target(g.target), "iter": expr(g.iter), "ifs": [expr(i) for i in g.ifs]})
    return out


def expr(n):
    t = type(n)
    if t is ast.Constant:
        return const(n.value, n)
    if t is ast.Name:
        return {"e": "name", "id": n.id}
    if t is ast.Attribute:
        return {"e": "attr", "value": expr(n.value), "attr": n.attr}
    if t is ast.JoinedStr:
        return {"e": "fstr", "parts": fstring_parts(n)}
    if t is ast.Call:
        kw = []
        for k in n.keywords:
            if k.arg is None:
                fail(n, "**kwargs")
            kw.append([k.arg, expr(k.value)])
        return {"e": "call", "func": expr(n.func), "args": [expr(a) for a in n.args], "kwargs": kw}
    if t is ast.BinOp:
        if type(n.op) not in BIN:
            fail(n, "operator")
        return {"e": "bin", "op": BIN[type(n.op)], "l": expr(n.left), "r": expr(n.right)}
    if t is ast.UnaryOp:
        op = {ast.USub: "-", ast.Not: "not"}.get(type(n.op)) or fail(n, "unary operator")
        return {"e": "unary", "op": op, "v": expr(n.operand)}
    if t is ast.BoolOp:
        return {"e": "boolop", "op": "and" if isinstance(n.op, ast.And) else "or",
                "values": [expr(v) for v in n.values]}
    if t is ast.Compare:
        return {"e": "cmp", "l": expr(n.left), "ops": [CMP[type(o)] for o in n.ops],
                "rs": [expr(c) for c in n.comparators]}
    if t is ast.IfExp:
        return {"e": "ifexp", "test": expr(n.test), "body": expr(n.body), "orelse": expr(n.orelse)}
    if t is ast.List:
        return {"e": "list", "elts": [expr(x) for x in n.elts]}
    if t is ast.Tuple:
        return {"e": "tuple", "elts": [expr(x) for x in n.elts]}
    if t is ast.Starred:
        return {"e": "starred", "v": expr(n.value)}
    if t is ast.Dict:
        if any(k is None for k in n.keys):
            fail(n, "dict unpacking")
        return {"e": "dict", "keys": [expr(k) for k in n.keys], "values": [expr(v) for v in n.values]}
    if t is ast.Subscript:
        if isinstance(n.slice, ast.Slice):
            fail(n, "slice")
        return {"e": "index", "value": expr(n.value), "index": expr(n.slice)}
    if t in (ast.ListComp, ast.GeneratorExp):
        return {"e": "listcomp", "elt": expr(n.elt), "gens": comp(n.generators)}
    if t is ast.Lambda:
        a = n.args
        if a.args or a.vararg or a.kwarg or a.kwonlyargs:
            fail(n, "lambda with parameters")
        return {"e": "lambda", "body": expr(n.body)}
    fail(n, type(n).__name__)


def target(n):
    if isinstance(n, ast.Name):
        return {"e": "name", "id": n.id}
    if isinstance(n, (ast.Tuple, ast.List)):
        return {"e": "tuple", "elts": [target(x) for x in n.elts]}
    fail(n, "assignment target")


def stmts(body):
    out = []
    for s in body:
        t = type(s)
        if t is ast.Expr:
            if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
                continue  # docstring
            out.append({"s": "expr", "value": expr(s.value)})
        elif t is ast.Assign:
            out.append({"s": "assign", "targets": [target(x) for x in s.targets], "value": expr(s.value)})
        elif t is ast.AnnAssign:
            if s.value is None:
                continue
            out.append({"s": "assign", "targets": [target(s.target)], "value": expr(s.value)})
        elif t is ast.AugAssign:
            if type(s.op) not in BIN:
                fail(s, "operator")
            out.append({"s": "augassign", "target": target(s.target), "op": BIN[type(s.op)], "value": expr(s.value)})
        elif t is ast.Return:
            out.append({"s": "return", "value": expr(s.value) if s.value else {"e": "none"}})
        elif t is ast.If:
            out.append({"s": "if", "test": expr(s.test), "body": stmts(s.body), "orelse": stmts(s.orelse)})
        elif t is ast.For:
            if s.orelse:
                fail(s, "for-else")
            out.append({"s": "for", "target": target(s.target), "iter": expr(s.iter), "body": stmts(s.body)})
        elif t is ast.Assert:
            continue
        else:
            fail(s, t.__name__)
    return out


def ordered(value):
    """A constant as JSON; dicts become `{"dict": [[key, value], ...]}` to keep their order."""
    if isinstance(value, dict):
        return {"dict": [[k, ordered(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [ordered(v) for v in value]
    return value


def method(fn):
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
        fail(fn, "signature")
    params = [x.arg for x in a.args[1:]]
    defaults = [None] * (len(params) - len(a.defaults)) + [expr(d) for d in a.defaults]
    return {"params": params, "defaults": defaults, "body": stmts(fn.body)}


def main():
    raw = open(sys.argv[1], "rb").read()
    tree = ast.parse(raw.decode())
    constants, counts, scalars = {}, None, {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            name = (node.targets[0] if isinstance(node, ast.Assign) else node.target).id
            value = ast.literal_eval(node.value)
            if name == "_TOOL_POOL_BLOCK_COUNTS":
                counts = [[k, v] for k, v in value.items()]
            elif isinstance(value, int):
                scalars[name] = value
            else:
                constants[name] = ordered(value)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CodingContentGenerator")
    defs = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    # Every method reachable from the tool-pool generators and `_gen_user_prompt`.
    todo, seen = [k for k, _ in counts] + ["_gen_user_prompt"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for n in ast.walk(defs[name]):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                    and n.attr in defs:
                todo.append(n.attr)
    methods = {name: method(defs[name]) for name in sorted(seen)}
    json.dump({
        "aiperf_version": "0.13.0",
        "source": "aiperf/dataset/generator/coding_content.py",
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "tool_pool_block_counts": counts,
        "text_pool_blocks": scalars["_TEXT_POOL_BLOCKS"],
        "baseline_pool_tokens": scalars["_BASELINE_POOL_TOKENS"],
        "constants": constants,
        "methods": methods,
    }, sys.stdout, ensure_ascii=False, separators=(",", ":"))
    sys.stdout.write("\n")


main()

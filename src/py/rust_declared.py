"""List the setuptools-rust extensions a tree declares, without running it.

Run by oracle-build as ``python -I -S rust_declared.py <tree> <file>...``
(the files relative to the tree: those that name ``setuptools_rust``).
Every call of ``RustExtension(...)`` or ``RustBin(...)`` (a name, or an
attribute of that name) is one declaration: its target is the keyword
``target`` or the first argument when that is a string literal (else
null), its binding the attribute name of a ``binding=Binding.<X>``
keyword (else null). Prints one JSON list of objects ``{"target", "kind":
"extension" | "bin", "binding", "file", "line"}``; a file that cannot be
read or parsed is an object ``{"file", "error"}``.
"""
import ast
import json
import os
import sys

KINDS = {"RustExtension": "extension", "RustBin": "bin"}


def called(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def declarations(tree, rel):
    with open(os.path.join(tree, rel), "rb") as f:
        module = ast.parse(f.read(), rel)
    found = []
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        kind = KINDS.get(called(node.func))
        if kind is None:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        t = keywords.get("target", node.args[0] if node.args else None)
        target = t.value if isinstance(t, ast.Constant) and isinstance(t.value, str) else None
        b = keywords.get("binding")
        binding = b.attr if isinstance(b, ast.Attribute) else None
        found.append({"target": target, "kind": kind, "binding": binding,
                      "file": rel, "line": node.lineno})
    return found


def main():
    tree, files = sys.argv[1], sys.argv[2:]
    out = []
    for rel in files:
        try:
            out.extend(declarations(tree, rel))
        except (OSError, SyntaxError, ValueError) as exc:
            out.append({"file": rel, "error": str(exc)})
    print(json.dumps(out))


main()

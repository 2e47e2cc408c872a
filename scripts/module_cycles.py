#!/usr/bin/env python3
"""Fails if two modules of a crate import each other, directly or around a circle.

A module's imports are its `crate::…` and `super::…` paths outside comments and its `#[cfg(test)]` part; each
counts as an edge to the longest module path it names (a module's own parents and children aside). Prints every
circle found, one per line, and exits 1 if there is any.
"""

import os
import re
import sys


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(text):
    text = text.split("#[cfg(test)]")[0]
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("//"))


def imports(module, text, modules):
    named = set()
    for m in re.finditer(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
        named.add(tuple(m.group(1).split("::")))
    for m in re.finditer(r"use crate::\{([^;]*)\};", text, re.S):
        for item in re.split(r"[,\s]+", m.group(1)):
            if re.match(r"[a-z_]", item):
                named.add((item.split("::")[0],))
    for m in re.finditer(r"super::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
        named.add(module[:-1] + tuple(m.group(1).split("::")))
    edges = set()
    for path in named:
        for k in range(len(path), 0, -1):
            target = path[:k]
            if target in modules:
                related = module[: len(target)] == target or target[: len(module)] == module
                if not related:
                    edges.add(target)
                break
    return edges


def circles(graph):
    found, seen, stack = [], set(), []

    def visit(u):
        seen.add(u)
        stack.append(u)
        for v in sorted(graph[u]):
            if v in stack:
                found.append(stack[stack.index(v):] + [v])
            elif v not in seen:
                visit(v)
        stack.pop()

    for u in sorted(graph):
        if u not in seen:
            visit(u)
    return found


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        modules = {}
        for directory, _, files in os.walk(src):
            for name in files:
                if name.endswith(".rs"):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as f:
                        modules[module_of(src, path)] = code_of(f.read())
        graph = {m: imports(m, text, modules) for m, text in modules.items()}
        for circle in circles(graph):
            bad += 1
            print(f"{crate}: " + " -> ".join("::".join(m) or "(root)" for m in circle))
    if bad:
        print(f"module_cycles: {bad} import circle(s): modules must not import each other", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

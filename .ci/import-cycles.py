#!/usr/bin/env python3
"""Import cycles between the files of each crate under ROOT (default: .).

A file imports from another when it names an item of that file's module by a `crate::`,
`super::` or `self::` path (in a `use` or inline); a path through a module's `pub use`
re-export leads to the file that defines the item, and re-exporting is not importing.
Code after a file's first `#[cfg(test)]` is left out, and `mod` declarations are not
imports. Prints every cycle
(a strongly connected set of files) and exits 1 if there is one."""
import os
import re
import sys


def crates(root):
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("target", ".git", "fuzz")]
        if "Cargo.toml" in files and os.path.isdir(os.path.join(dirpath, "src")):
            yield dirpath, os.path.join(dirpath, "src")


def module_files(src):
    """Module path (a tuple) → file, for the crate's library or binary."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)[:-3].split(os.sep)
            if rel[0] == "bin":
                continue
            if len(rel) == 1 and rel[0] in ("lib", "main"):
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            mods[path] = os.path.join(dirpath, name)
    return mods


def expand(use):
    """The paths of one `use` body, brace groups expanded one level."""
    group = re.match(r"([\w:]+)::\{([^}]*)\}$", use.strip(), re.S)
    if not group:
        return [use.strip()]
    return [group.group(1) + "::" + p.strip() for p in group.group(2).split(",") if p.strip()]


def reexports(text):
    """Name → path of every `pub use` (a module's facade: re-exporting is not importing)."""
    names = {}
    for use in re.finditer(r"\bpub(?:\([\w ]+\))?\s+use\s+([^;]+);", text):
        for path in expand(use.group(1)):
            names[path.split("::")[-1].split(" as ")[-1].strip()] = path
    return names


def paths_named(text):
    """Every crate/super/self path `text` uses, `pub use` re-exports left out."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"\bpub(?:\([\w ]+\))?\s+use\s+[^;]+;", "", text)
    found = re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
    for use in re.finditer(r"\buse\s+([\w:]+::\{[^}]*\})", text):
        found += expand(use.group(1))
    return found


def absolute(module, path):
    """`path`, named in `module`, from the crate root."""
    parts = path.split("::")
    if parts[0] == "crate":
        return parts[1:]
    target = list(module)
    while parts and parts[0] in ("super", "self"):
        if parts[0] == "super":
            target = target[:-1]
        parts = parts[1:]
    return target + parts


def owner(mods, facades, module, path, depth=0):
    """The module whose file defines what `path` (named in `module`) names, following the
    re-exports of the module it goes through."""
    target = absolute(module, path)
    prefix = tuple(target)
    while prefix and prefix not in mods:
        prefix = prefix[:-1]
    rest = target[len(prefix):]
    if rest and depth < 8 and rest[0] in facades[prefix]:
        return owner(mods, facades, prefix, facades[prefix][rest[0]], depth + 1)
    return prefix


def edges_of(mods):
    texts = {}
    for module, file in mods.items():
        with open(file) as f:
            texts[module] = f.read().split("#[cfg(test)]")[0]
    facades = {module: reexports(text) for module, text in texts.items()}
    edges = {m: set() for m in mods}
    for module, text in texts.items():
        for path in paths_named(text):
            target = owner(mods, facades, module, path)
            if target != module:
                edges[module].add(target)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components with more than one member."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    total = 0
    for crate, src in sorted(crates(root)):
        mods = module_files(src)
        for component in cycles(edges_of(mods)):
            total += 1
            files = sorted(os.path.relpath(mods[m], root) for m in component)
            print(f"cycle in {os.path.relpath(crate, root)}: " + " <-> ".join(files))
    print(f"{total} import cycles" if total else "no import cycles")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())

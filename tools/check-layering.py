#!/usr/bin/env python3
"""check-layering.py [ROOT]: fail on a cycle between the files of one source folder.

Each directory under ROOT/src (default ROOT: the checkout holding this script) is
one unit, and so is each of its subdirectories: src/tiers and src/tiers/uring are
two units, and a use from one into the other is not counted (it crosses folders).
ROOT/engine (the reference engine), when present, is checked the same way.

For every .c (and .cu) file of a unit it finds
  - the kvo__* (internal) and kvo_* (public) functions it defines: non-static,
    at file scope, with a body;
  - the names it mentions anywhere outside comments and strings (calls, and
    function pointers stored in tables) that another file of the unit defines;
  - its #include "x.h" of a header of the unit that belongs to one .c file: the
    .c file of the same stem (copy.h -> copy.c), or else the one .c file that
    defines every function the header declares.
"X uses Y" is an edge from X to Y. Each strongly connected component of more
than one file is a cycle: it is printed as a path of file names with the first
name that makes each step, and the exit status is 1. Without a cycle the script
prints one summary line and exits 0. Standard library only.
"""
import itertools
import os
import re
import sys

IDENT = re.compile(r"\bkvo_[A-Za-z0-9_]+")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
SOURCE_EXT = (".c", ".cu")


def strip_comments(text):
    """Blank out comments, string and character literals, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_preprocessor(code):
    """Blank preprocessor lines (with continuations): no braces or defs there."""
    lines = code.split("\n")
    out, cont = [], False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.endswith("\\")
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def definitions(code):
    """kvo_/kvo__ functions defined at file scope and not static."""
    code = blank_preprocessor(code)
    defs = set()
    depth = 0
    i, n = 0, len(code)
    stmt_start = 0  # where the current file-scope declaration began
    while i < n:
        c = code[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                stmt_start = i + 1
        elif c == ";" and depth == 0:
            stmt_start = i + 1
        elif depth == 0 and c == "k":
            m = IDENT.match(code, i)
            if m and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
                j = m.end()
                while j < n and code[j].isspace():
                    j += 1
                if j < n and code[j] == "(":
                    # Skip the parameter list, then see a body or a prototype.
                    level, k = 0, j
                    while k < n:
                        if code[k] == "(":
                            level += 1
                        elif code[k] == ")":
                            level -= 1
                            if level == 0:
                                break
                        k += 1
                    rest = code[k + 1:k + 400]
                    body = re.match(r"\s*(__attribute__\s*\(\(.*?\)\)\s*)*\{", rest, re.S)
                    head = code[stmt_start:i]
                    if body and not re.search(r"\bstatic\b", head) and "(" not in head:
                        defs.add(m.group(0))
                i = m.end() if m else i + 1
                continue
        i += 1
    return defs


def declared(code):
    """kvo_/kvo__ names declared as functions in a header (name followed by '(')."""
    return set(re.findall(r"\b(kvo_[A-Za-z0-9_]+)\s*\(", blank_preprocessor(code)))


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def scan_unit(folder):
    """Return (files, edges): edges[x] = {y: reason}, names relative to folder."""
    names = sorted(os.listdir(folder))
    sources = [f for f in names if f.endswith(SOURCE_EXT) and os.path.isfile(os.path.join(folder, f))]
    headers = [f for f in names if f.endswith(".h") and os.path.isfile(os.path.join(folder, f))]
    raw = {f: read(os.path.join(folder, f)) for f in sources}
    code = {f: strip_comments(t) for f, t in raw.items()}
    defs = {f: definitions(code[f]) for f in sources}
    owner = {}
    for f in sources:
        for d in defs[f]:
            owner.setdefault(d, f)
    # A header belongs to one .c file: same stem, else the one definer of all it declares.
    header_owner = {}
    stems = {os.path.splitext(f)[0]: f for f in sources}
    for h in headers:
        stem = os.path.splitext(h)[0]
        if stem in stems:
            header_owner[h] = stems[stem]
            continue
        owners = {owner[d] for d in declared(strip_comments(read(os.path.join(folder, h)))) if d in owner}
        if len(owners) == 1:
            header_owner[h] = owners.pop()
    edges = {f: {} for f in sources}
    for f in sources:
        for m in IDENT.finditer(code[f]):
            y = owner.get(m.group(0))
            if y and y != f and y not in edges[f]:
                edges[f][y] = m.group(0)
        for inc in INCLUDE.findall(raw[f]):
            path = os.path.normpath(os.path.join(folder, inc))
            if os.path.dirname(path) != os.path.normpath(folder):
                continue  # another folder's header
            y = header_owner.get(os.path.basename(path))
            if y and y != f and y not in edges[f]:
                edges[f][y] = '#include "%s"' % inc
    return sources, edges


def components(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def cycle_path(comp, edges):
    """One cycle through the component's first file, by breadth-first search."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for y in sorted(edges[v]):
            if y not in members:
                continue
            if y == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                path.reverse()
                return path + [start]
            if y not in prev:
                prev[y] = v
                queue.append(y)
    return [start, start]


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print("usage: check-layering.py [ROOT]   (ROOT holds src/; default: this checkout)")
        return 2 if len(argv) > 2 else 0
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        print("check-layering: %s has no src/ folder; pass the checkout root" % root, file=sys.stderr)
        return 2
    units = files = uses = 0
    cycles = []
    walk = [os.path.join(root, "engine")] if os.path.isdir(os.path.join(root, "engine")) else []
    for folder, dirs, _ in itertools.chain(*(os.walk(top) for top in [src] + walk)):
        dirs.sort()
        if folder == src:
            continue
        nodes, edges = scan_unit(folder)
        if not nodes:
            continue
        units += 1
        files += len(nodes)
        uses += sum(len(e) for e in edges.values())
        rel = os.path.relpath(folder, root)
        for comp in components(nodes, edges):
            if len(comp) > 1:
                cycles.append((rel, comp, cycle_path(comp, edges), edges))
    for rel, comp, path, edges in cycles:
        steps = [path[0]]
        for a, b in zip(path, path[1:]):
            steps.append("-> %s (%s)" % (b, edges[a][b]))
        print("check-layering: cycle in %s/: %s" % (rel, " ".join(steps)))
        if len(comp) > len(path) - 1:
            print("    all files of that cycle: %s" % ", ".join(comp))
    if cycles:
        print("check-layering: %d cycle(s) in %d folder(s); a file may use only the files below it "
              "(state the order in the folder's internal header)" % (len(cycles), units))
        return 1
    print("check-layering: no cycle in %d folders (%d files, %d uses between files)" % (units, files, uses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
